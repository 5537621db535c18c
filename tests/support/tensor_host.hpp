// Test helpers: backend tensors from and to host vectors of floats or ints.
#pragma once

#include <cstdint>
#include <vector>

#include "core/numeric.hpp"
#include "core/tensor.hpp"
#include "model/backend.hpp"

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

}  // namespace dspark::test
