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
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/weights.hpp"

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

// n normal values of N(mean, stddev^2), each rounded to bf16.
inline std::vector<float> normal_bf16(std::mt19937& g, size_t n, float stddev, float mean = 0.0f) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = round_bf16(d(g));
  return v;
}

// A backend tensor holding v's bytes as they are.
template <class T>
Tensor put_raw(Backend& be, DType dt, const Shape& shape, const std::vector<T>& v) {
  Tensor t = be.alloc(dt, shape);
  be.upload(t, v.data());
  return t;
}

// The stages of an insert into empty rings: stage i reads wkv[i] and norms[i] and writes rings [slots, W, d]
// (zero, every position -1) and its kv / kv_n rows [rows, d].
inline std::vector<InsertKvStage> empty_insert_stages(Backend& be,
                                                      const std::vector<const LinearWeight*>& wkv,
                                                      const std::vector<Tensor>& norms, int64_t slots,
                                                      int64_t W, int64_t d, int64_t rows) {
  std::vector<InsertKvStage> out;
  for (size_t i = 0; i < wkv.size(); ++i) {
    InsertKvStage s{wkv[i],
                    norms[i],
                    be.alloc(DType::bf16, {slots, W, d}),
                    be.alloc(DType::i32, {slots, W}),
                    be.alloc(DType::bf16, {rows, d}),
                    be.alloc(DType::bf16, {rows, d})};
    be.zero(s.ring_kv);
    be.fill_i32(s.ring_pos, -1);
    out.push_back(s);
  }
  return out;
}

// One linear weight in the backend's prepared layout (Backend::prepare_weights; the CPU keeps or decodes
// the checkpoint's).
inline LinearWeight prepared(Backend& be, LinearWeight w) {
  DrafterWeights d;
  d.main_proj = std::move(w);
  be.prepare_weights(d);
  return std::move(d.main_proj);
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

// Inputs of an MoE experts test: x [T, H] bf16 normal with every other row scaled by 6 (so that some g and u
// pass the SwiGLU limit of 10 and get clamped), and per row two distinct random experts of E with route
// weights in [0.2, 1.2).
struct MoeInputs {
  std::vector<float> x;
  std::vector<int32_t> ids;
  std::vector<float> weights;
};
inline MoeInputs moe_inputs(std::mt19937& g, int64_t T, int64_t H, int64_t E) {
  MoeInputs in;
  std::normal_distribution<float> d(0.0f, 1.0f);
  in.x.resize(static_cast<size_t>(T * H));
  for (float& v : in.x) v = round_bf16(d(g));
  for (int64_t t = 1; t < T; t += 2)
    for (int64_t i = 0; i < H; ++i)
      in.x[static_cast<size_t>(t * H + i)] = round_bf16(6.0f * in.x[static_cast<size_t>(t * H + i)]);
  std::uniform_real_distribution<float> wd(0.2f, 1.2f);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t a = static_cast<int32_t>(g() % E), b = static_cast<int32_t>((a + 1 + g() % (E - 1)) % E);
    in.ids.insert(in.ids.end(), {a, b});
    in.weights.insert(in.weights.end(), {wd(g), wd(g)});
  }
  return in;
}

// The shared expert, the routed experts and their combine of `in` (T rows of H, top 2) through a stage's
// experts: the three outputs.
inline Outs run_moe_experts(Backend& be, const StageWeights& st, const MoeInputs& in, int64_t T, int64_t H,
                            float swiglu_limit) {
  const int64_t top = 2, E = static_cast<int64_t>(st.experts.size());
  const Tensor xt = put(be, DType::bf16, {T, H}, in.x), it = put_i32(be, {T, top}, in.ids);
  Tensor shared = be.alloc(DType::f32, {T, H}), routed = be.alloc(DType::f32, {T, top, H});
  Tensor out = be.alloc(DType::f32, {T, H});
  be.moe_shared_expert(xt, {}, st, swiglu_limit, shared);
  be.moe_routed_experts(xt, {}, it, put(be, DType::f32, {T, top}, in.weights), st, swiglu_limit, routed);
  be.moe_combine(it, routed, shared, E, out);
  return Outs{fetch(be, "moe_shared_expert", shared), fetch(be, "moe_routed_experts", routed),
              fetch(be, "moe_combine", out)};
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
