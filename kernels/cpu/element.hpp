// Element access for the CPU reference kernels: any float storage type read as fp32, results written with one
// rounding to the destination type.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"
#include "lib/core/tensor.hpp"

namespace dspark::cpu {

inline float load(const Tensor& t, int64_t i) {
  switch (t.dtype) {
    case DType::bf16:
      return bf16_to_float(t.as<const uint16_t>()[i]);
    case DType::f16:
      return f16_to_float(t.as<const uint16_t>()[i]);
    case DType::f32:
      return t.as<const float>()[i];
    default:
      fail("cpu backend: cannot read {} as a float", dtype_name(t.dtype));
  }
}

inline void store(const Tensor& t, int64_t i, float v) {
  switch (t.dtype) {
    case DType::bf16:
      t.as<uint16_t>()[i] = float_to_bf16(v);
      return;
    case DType::f16:
      t.as<uint16_t>()[i] = float_to_f16(v);
      return;
    case DType::f32:
      t.as<float>()[i] = v;
      return;
    default:
      fail("cpu backend: cannot write {} as a float", dtype_name(t.dtype));
  }
}

// Elements [i0, i0 + n) as fp32.
inline std::vector<float> load_span(const Tensor& t, int64_t i0, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = load(t, i0 + i);
  return v;
}

inline float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

inline void expect_dtype(const Tensor& t, DType want, const char* what) {
  if (t.dtype != want)
    fail("cpu backend: {} must be {}, got {}", what, dtype_name(want), dtype_name(t.dtype));
}

}  // namespace dspark::cpu
