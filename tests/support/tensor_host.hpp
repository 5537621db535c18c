// Test helpers: backend tensors from and to host vectors of floats or ints.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "lib/core/numeric.hpp"
#include "lib/core/tensor.hpp"
#include "lib/model/backend.hpp"

namespace dspark::test {

inline Tensor make_tensor(Backend& be, DType dt, const Shape& shape, const std::vector<float>& v) {
  Tensor t = be.alloc(dt, shape);
  std::vector<uint8_t> host(t.nbytes());
  for (size_t i = 0; i < v.size() && static_cast<int64_t>(i) < t.numel(); ++i) {
    switch (dt) {
      case DType::bf16:
        reinterpret_cast<uint16_t*>(host.data())[i] = float_to_bf16(v[i]);
        break;
      case DType::f16:
        reinterpret_cast<uint16_t*>(host.data())[i] = float_to_f16(v[i]);
        break;
      case DType::f32:
        reinterpret_cast<float*>(host.data())[i] = v[i];
        break;
      case DType::i32:
        reinterpret_cast<int32_t*>(host.data())[i] = static_cast<int32_t>(v[i]);
        break;
      default:
        break;
    }
  }
  be.upload(t, host.data());
  return t;
}

inline std::vector<float> to_floats(Backend& be, const Tensor& t) {
  std::vector<uint8_t> host(t.nbytes());
  be.download(host.data(), t);
  std::vector<float> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    switch (t.dtype) {
      case DType::bf16:
        v[i] = bf16_to_float(reinterpret_cast<const uint16_t*>(host.data())[i]);
        break;
      case DType::f16:
        v[i] = f16_to_float(reinterpret_cast<const uint16_t*>(host.data())[i]);
        break;
      case DType::f32:
        v[i] = reinterpret_cast<const float*>(host.data())[i];
        break;
      case DType::i32:
        v[i] = static_cast<float>(reinterpret_cast<const int32_t*>(host.data())[i]);
        break;
      default:
        break;
    }
  }
  return v;
}

// n values uniform in [lo, hi), already rounded to bf16 so that host copies equal what the tensor holds.
inline std::vector<float> rand_bf16(std::mt19937& g, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(d(g));
  return v;
}

inline Tensor make_i32(Backend& be, const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = be.alloc(DType::i32, shape);
  be.upload(t, v.data());
  return t;
}

inline std::vector<int32_t> to_i32(Backend& be, const Tensor& t) {
  std::vector<int32_t> v(static_cast<size_t>(t.numel()));
  be.download(v.data(), t);
  return v;
}

}  // namespace dspark::test
