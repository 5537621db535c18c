// Synthetic weights generated on the device (dspark_bench): the values of lib/checkpoint/synthetic.cpp's
// counter-based generator, computed where the shard lives, so a 31 GB V4.1 drafter needs no file and no
// host-to-device copy. Plain C++ declaration, included by host code and by fill_random.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch_common.hpp"

namespace dspark::cuda {

// A shard [rows, cols] of a row-major tensor with `full_cols` columns, starting at (row0, col0) of the whole
// tensor (1-D tensors: cols = full_cols = 1). Element (r, c) gets mean + std * z, where z is the
// unit-variance Irwin-Hall value of splitmix64(key + (g + 1) * golden gamma) and g = (row0 + r) * full_cols +
// col0 + c is the element's index in the WHOLE tensor: a shard holds exactly the values the whole tensor has
// there, and bf16 / f32 results have the bits synthetic_values() writes on the CPU for the same key.
struct SyntheticFill {
  uint64_t key;  // synthetic.cpp's tensor key of (seed, weight name)
  int64_t rows, cols, full_cols, row0, col0;
  float mean, std;
};
cudaError_t launch_fill_synthetic(void* dst, Elt dst_t, const SyntheticFill& f, cudaStream_t s);

// A shard [tiles_in, tiles_out, per_tile] of an EXL3 trellis whose whole tensor has tiles_out_full tiles per
// row, from tile (tk0, tn0): int16 g of the whole tensor (g = its row-major index) is bits 16 (g % 4) .. of
// splitmix64(key + (g / 4 + 1) * golden gamma), synthetic_trellis_rows()'s values.
struct TrellisFill {
  uint64_t key;  // the tensor key of (seed, "<base>.trellis")
  int64_t tiles_in, tiles_out, per_tile, tiles_out_full, tk0, tn0;
};
cudaError_t launch_fill_trellis(int16_t* dst, const TrellisFill& f, cudaStream_t s);

}  // namespace dspark::cuda
