// NumPy .npy files (format 1.0/2.0, little-endian, C order): the draft app's context-row input, the golden
// trace, and JSON-free dumps of activations.
#pragma once

#include <cstdint>
#include <filesystem>
#include <vector>

#include "lib/core/dtype.hpp"
#include "lib/core/tensor.hpp"

namespace dspark {

struct NpyArray {
  DType dtype = DType::f32;  // '<f4' f32, '<f2' f16, '<u2' read as bf16 bits, '<i8' i64, '<i4' i32, '|u1' u8
  Shape shape;
  std::vector<uint8_t> bytes;  // numel * dtype_size(dtype), little-endian

  int64_t numel() const { return shape_numel(shape); }
  // Every element converted to float (bf16/f16/f32/integers). Throws for other dtypes.
  std::vector<float> to_float() const;
  // Every element converted to int64 (integer dtypes only).
  std::vector<int64_t> to_int64() const;
};

// Throws dspark::Error naming the file on a missing file, a bad magic/header, fortran order, big-endian data,
// an unsupported descr or a data section shorter than the shape says.
NpyArray read_npy(const std::filesystem::path& path);
void write_npy(const std::filesystem::path& path, const NpyArray& array);

}  // namespace dspark
