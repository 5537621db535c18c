// One backend op run from the same host inputs on the CPU reference and (twice) on the GPU: the GPU runs must
// agree bit for bit (determinism), and the GPU must agree with the CPU within a tolerance stated in units of
// bf16 ulps of the output tensor's scale (its largest |value|). One ulp here is 2^-8 relative: the largest
// error of one rounding to bf16, as the other tests of the project count it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/numeric.hpp"

namespace dspark::test {

constexpr double kUlp = 1.0 / 256.0;
// One rounding to bf16 after fp32 sums in another order: the result may land one bf16 spacing (2^-7 of the
// value) away.
constexpr double kOneRounding = 2 * kUlp;
// Chains of roundings (attention's bf16 probabilities, MoE's g/u/h/expert-output roundings).
constexpr double kChained = 4 * kUlp;
// fp32 results (linear partials, Markov values, confidence logits, route weights): summation order only.
constexpr double kF32 = 1e-4;

// A downloaded output: its raw bytes (for bit comparisons) and its values as floats.
struct Out {
  std::string name;
  DType dtype = DType::f32;
  std::vector<uint8_t> bytes;

  std::vector<float> values() const {
    std::vector<float> v(bytes.size() / dtype_size(dtype));
    for (size_t i = 0; i < v.size(); ++i) {
      if (dtype == DType::bf16) {
        uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        v[i] = bf16_to_float(b);
      } else if (dtype == DType::i32) {
        int32_t x;
        std::memcpy(&x, bytes.data() + 4 * i, 4);
        v[i] = static_cast<float>(x);
      } else {
        std::memcpy(&v[i], bytes.data() + 4 * i, 4);
      }
    }
    return v;
  }
  template <typename T>
  std::vector<T> as() const {
    std::vector<T> v(bytes.size() / sizeof(T));
    std::memcpy(v.data(), bytes.data(), v.size() * sizeof(T));
    return v;
  }
};
using Outs = std::vector<Out>;

inline Out fetch(Backend& be, std::string name, const Tensor& t) {
  Out o{std::move(name), t.dtype, std::vector<uint8_t>(t.nbytes())};
  be.download(o.bytes.data(), t);
  return o;
}

// Backend tensors from host floats (values already representable in the dtype) or ints.
inline Tensor put(Backend& be, DType dt, const Shape& shape, const std::vector<float>& v) {
  Tensor t = be.alloc(dt, shape);
  std::vector<uint8_t> host(t.nbytes());
  for (size_t i = 0; i < v.size(); ++i) {
    if (dt == DType::bf16) {
      const bf16_t b = float_to_bf16(v[i]);
      std::memcpy(host.data() + 2 * i, &b, 2);
    } else {
      std::memcpy(host.data() + 4 * i, &v[i], 4);
    }
  }
  be.upload(t, host.data());
  return t;
}
inline Tensor put_i32(Backend& be, const Shape& shape, const std::vector<int32_t>& v) {
  Tensor t = be.alloc(DType::i32, shape);
  be.upload(t, v.data());
  return t;
}

// max |got - want| <= rel * max |want|, reporting where the worst element is.
inline void expect_near_scale(const Out& want, const Out& got, double rel) {
  const std::vector<float> a = want.values(), b = got.values();
  ASSERT_EQ(a.size(), b.size()) << want.name;
  double scale = 0, worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::fabs(double(a[i])));
    const double d = std::fabs(double(a[i]) - b[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN counts as worst
  }
  EXPECT_LE(worst, rel * scale + 1e-30)
      << want.name << ": worst at [" << at << "] cpu " << a[at] << " gpu " << b[at] << ", scale " << scale
      << ", " << worst / scale / kUlp << " ulps of scale";
}

inline void expect_same_bits(const Out& want, const Out& got) {
  ASSERT_EQ(want.bytes.size(), got.bytes.size()) << want.name;
  size_t differ = 0;
  const size_t elem = dtype_size(want.dtype);
  for (size_t i = 0; i < want.bytes.size(); i += elem)
    differ += std::memcmp(want.bytes.data() + i, got.bytes.data() + i, elem) != 0;
  EXPECT_EQ(differ, 0u) << want.name << ": " << differ << " of " << want.bytes.size() / elem
                        << " elements differ";
}

using OpRun = std::function<Outs(Backend&)>;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
    gpu_ = std::make_unique<CudaBackend>(0);
  }

  // The op on the CPU once and on the GPU twice; the GPU runs must give identical bits.
  std::pair<Outs, Outs> run(const OpRun& op) {
    Outs want = op(cpu_), got = op(*gpu_), again = op(*gpu_);
    EXPECT_EQ(want.size(), got.size());
    for (size_t i = 0; i < got.size(); ++i) {
      SCOPED_TRACE("determinism (two GPU runs)");
      expect_same_bits(got[i], again[i]);
    }
    return {std::move(want), std::move(got)};
  }

  const ModelConfig cfg_ = tiny_model_config();
  const int64_t B_ = 3, T_ = B_ * cfg_.block_size;
  CpuBackend cpu_;
  std::unique_ptr<CudaBackend> gpu_;
};

}  // namespace dspark::test
