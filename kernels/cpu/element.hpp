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

// Elements [i0, i0 + n) as fp32 into out.
inline void load_into(const Tensor& t, int64_t i0, int64_t n, float* out) {
  switch (t.dtype) {
    case DType::bf16: {
      const uint16_t* p = t.as<const uint16_t>() + i0;
      for (int64_t i = 0; i < n; ++i) out[i] = bf16_to_float(p[i]);
      return;
    }
    case DType::f16: {
      const uint16_t* p = t.as<const uint16_t>() + i0;
      for (int64_t i = 0; i < n; ++i) out[i] = f16_to_float(p[i]);
      return;
    }
    case DType::f32: {
      const float* p = t.as<const float>() + i0;
      for (int64_t i = 0; i < n; ++i) out[i] = p[i];
      return;
    }
    default:
      fail("cpu backend: cannot read {} as a float", dtype_name(t.dtype));
  }
}

// n fp32 values into elements [i0, i0 + n), each rounded once to t's type.
inline void store_from(const Tensor& t, int64_t i0, int64_t n, const float* in) {
  switch (t.dtype) {
    case DType::bf16: {
      uint16_t* p = t.as<uint16_t>() + i0;
      for (int64_t i = 0; i < n; ++i) p[i] = float_to_bf16(in[i]);
      return;
    }
    case DType::f32: {
      float* p = t.as<float>() + i0;
      for (int64_t i = 0; i < n; ++i) p[i] = in[i];
      return;
    }
    default:
      for (int64_t i = 0; i < n; ++i) store(t, i0 + i, in[i]);
  }
}

// Elements [i0, i0 + n) as fp32.
inline std::vector<float> load_span(const Tensor& t, int64_t i0, int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  load_into(t, i0, n, v.data());
  return v;
}

// The fp32 dot product of every CPU kernel (dot.cpp), in one fixed order that depends only on n.
float dot(const float* a, const float* b, int64_t n);
// out[r] = dot(a[r], b, n) for r < m, with dot's bits, b read once per group of rows (dot.cpp).
void dot_rows(const float* const* a, int64_t m, const float* b, int64_t n, float* out);
// The same with b as bf16 values (each exactly its fp32 value): no fp32 copy of b is made.
void dot_rows(const float* const* a, int64_t m, const uint16_t* b, int64_t n, float* out);

inline void expect_dtype(const Tensor& t, DType want, const char* what) {
  if (t.dtype != want)
    fail("cpu backend: {} must be {}, got {}", what, dtype_name(want), dtype_name(t.dtype));
}

}  // namespace dspark::cpu
