// CpuBackend manifold hyper-connection ops (hc_replicate, hc_mixes, hc_collapse, hc_expand) against the
// formulas of SPEC §4 evaluated naively in double precision here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/core/numeric.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark {
namespace {

using test::make_tensor;
using test::to_floats;

constexpr double kBf16Ulp = 1.0 / 256.0;
constexpr int64_t kHc = 4;
constexpr int64_t kMix = (2 + kHc) * kHc;  // 24

std::vector<float> rand_vec(std::mt19937& g, size_t n, float lo, float hi, bool bf16) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = bf16 ? round_bf16(d(g)) : d(g);
  return v;
}

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

struct NaiveMix {
  std::vector<double> pre, post, comb;  // [hc], [hc], [hc][hc]
};

// SPEC §4 mixes() for one row x [hc * H], in double.
NaiveMix naive_mixes(const std::vector<float>& x, const std::vector<float>& fn,
                     const std::vector<float>& base, const std::vector<float>& scale, double norm_eps,
                     double hc_eps, int64_t iters) {
  const size_t n = x.size();
  double ss = 0.0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double r = 1.0 / std::sqrt(ss / static_cast<double>(n) + norm_eps);
  std::vector<double> m(kMix);
  for (size_t i = 0; i < kMix; ++i) {
    double acc = 0.0;
    for (size_t c = 0; c < n; ++c) acc += static_cast<double>(fn[i * n + c]) * x[c];
    m[i] = acc * r;
  }
  NaiveMix o;
  for (size_t j = 0; j < kHc; ++j) {
    o.pre.push_back(sigmoid(m[j] * scale[0] + base[j]) + hc_eps);
    o.post.push_back(2.0 * sigmoid(m[kHc + j] * scale[1] + base[kHc + j]));
  }
  std::vector<double> C(kHc * kHc);
  for (size_t j = 0; j < kHc; ++j) {
    double mx = -1e300, sum = 0.0;
    for (size_t l = 0; l < kHc; ++l) {
      C[j * kHc + l] = m[2 * kHc + j * kHc + l] * scale[2] + base[2 * kHc + j * kHc + l];
      mx = std::max(mx, C[j * kHc + l]);
    }
    for (size_t l = 0; l < kHc; ++l) sum += std::exp(C[j * kHc + l] - mx);
    for (size_t l = 0; l < kHc; ++l) C[j * kHc + l] = std::exp(C[j * kHc + l] - mx) / sum + hc_eps;
  }
  auto cols = [&] {
    for (size_t l = 0; l < kHc; ++l) {
      double s = 0.0;
      for (size_t j = 0; j < kHc; ++j) s += C[j * kHc + l];
      for (size_t j = 0; j < kHc; ++j) C[j * kHc + l] /= s + hc_eps;
    }
  };
  auto rows = [&] {
    for (size_t j = 0; j < kHc; ++j) {
      double s = 0.0;
      for (size_t l = 0; l < kHc; ++l) s += C[j * kHc + l];
      for (size_t l = 0; l < kHc; ++l) C[j * kHc + l] /= s + hc_eps;
    }
  };
  cols();
  for (int64_t it = 1; it < iters; ++it) {
    rows();
    cols();
  }
  o.comb = C;
  return o;
}

struct MixCase {
  int64_t T = 2, H = 3;
  std::vector<float> x, fn, base, scale;
};

MixCase random_mix_case(uint32_t seed) {
  std::mt19937 g(seed);
  MixCase c;
  const size_t n = static_cast<size_t>(kHc * c.H);
  c.x = rand_vec(g, static_cast<size_t>(c.T) * n, -2.0f, 2.0f, true);
  c.fn = rand_vec(g, kMix * n, -0.5f, 0.5f, false);
  c.base = rand_vec(g, kMix, -1.0f, 1.0f, false);
  c.scale = {0.7f, 1.3f, 2.0f};
  return c;
}

struct MixOut {
  std::vector<float> pre, post, comb;
};

MixOut run_mixes(CpuBackend& be, const MixCase& c, const MixParams& p) {
  const size_t n = static_cast<size_t>(kHc * c.H);
  Tensor X = make_tensor(be, DType::bf16, {c.T, kHc, c.H}, c.x);
  HcMixWeights w{make_tensor(be, DType::f32, {kMix, static_cast<int64_t>(n)}, c.fn),
                 make_tensor(be, DType::f32, {kMix}, c.base), make_tensor(be, DType::f32, {3}, c.scale)};
  Tensor pre = be.alloc(DType::f32, {c.T, kHc}), post = be.alloc(DType::f32, {c.T, kHc});
  Tensor comb = be.alloc(DType::f32, {c.T, kHc, kHc});
  be.hc_mixes(X, w, p, pre, post, comb);
  return {to_floats(be, pre), to_floats(be, post), to_floats(be, comb)};
}

std::vector<float> row_of(const MixCase& c, int64_t t) {
  const int64_t n = kHc * c.H;
  return {c.x.begin() + t * n, c.x.begin() + (t + 1) * n};
}

TEST(CpuHcReplicate, CopiesEveryStream) {
  CpuBackend be;
  const std::vector<float> xs = {1.5f, -2.0f, 0.25f, 3.0f, -0.5f, 7.0f};
  Tensor x = make_tensor(be, DType::bf16, {2, 3}, xs);
  Tensor X = be.alloc(DType::bf16, {2, kHc, 3});
  be.hc_replicate(x, X);
  const std::vector<float> o = to_floats(be, X);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t j = 0; j < kHc; ++j)
      for (int64_t i = 0; i < 3; ++i)
        EXPECT_EQ(o[static_cast<size_t>((t * kHc + j) * 3 + i)], xs[static_cast<size_t>(t * 3 + i)]);
}

TEST(CpuHcMixes, HandPrePost) {
  CpuBackend be;
  // X all ones (n = 12): mean(x^2) = 1, norm_eps 0 -> r = 1. fn row 0 = e_0 -> m_0 = 1; fn row 4 = 0.5
  // everywhere
  // -> m_4 = 6. pre_0 = sigmoid(1 * 2 - 1) + hc_eps, post_0 = 2 sigmoid(6 * 0.25 - 1) = 2 sigmoid(0.5).
  // Other rows are 0: pre_j = sigmoid(base_j) + hc_eps, post_j = 2 sigmoid(base_{4+j}).
  MixCase c;
  c.T = 1;
  const size_t n = static_cast<size_t>(kHc * c.H);
  c.x.assign(n, 1.0f);
  c.fn.assign(kMix * n, 0.0f);
  c.fn[0] = 1.0f;
  for (size_t i = 0; i < n; ++i) c.fn[4 * n + i] = 0.5f;
  c.base = std::vector<float>(kMix, 0.0f);
  c.base[0] = -1.0f, c.base[1] = 2.0f, c.base[4] = -1.0f, c.base[6] = -3.0f;
  c.scale = {2.0f, 0.25f, 1.0f};
  const float hc_eps = 1e-3f;
  const MixOut o = run_mixes(be, c, MixParams{0.0f, hc_eps, 20});
  EXPECT_NEAR(o.pre[0], sigmoid(1.0) + hc_eps, 1e-6);
  EXPECT_NEAR(o.pre[1], sigmoid(2.0) + hc_eps, 1e-6);
  EXPECT_NEAR(o.pre[2], 0.5 + hc_eps, 1e-6);
  EXPECT_NEAR(o.pre[3], 0.5 + hc_eps, 1e-6);
  EXPECT_NEAR(o.post[0], 2.0 * sigmoid(0.5), 1e-6);
  EXPECT_NEAR(o.post[1], 1.0, 1e-6);
  EXPECT_NEAR(o.post[2], 2.0 * sigmoid(-3.0), 1e-6);
  EXPECT_NEAR(o.post[3], 1.0, 1e-6);
  // All comb logits equal: every entry (1/4 + eps) / (1 + 4 eps + eps) after the first column pass, and the
  // matrix stays uniform (each later row/column pass divides by 4 c + eps).
  double cu = (0.25 + hc_eps) / (1.0 + 5.0 * hc_eps);
  for (int it = 1; it < 20; ++it) {
    cu = cu / (4.0 * cu + hc_eps);
    cu = cu / (4.0 * cu + hc_eps);
  }
  for (float v : o.comb) EXPECT_NEAR(v, cu, 1e-6);
}

TEST(CpuHcMixes, PrePostMatchNaive) {
  CpuBackend be;
  const MixCase c = random_mix_case(51);
  for (const MixParams p : {MixParams{1e-6f, 1e-6f, 20}, MixParams{0.5f, 0.05f, 20}}) {
    const MixOut o = run_mixes(be, c, p);
    for (int64_t t = 0; t < c.T; ++t) {
      const NaiveMix ref =
          naive_mixes(row_of(c, t), c.fn, c.base, c.scale, p.norm_eps, p.hc_eps, p.sinkhorn_iters);
      for (size_t j = 0; j < kHc; ++j) {
        EXPECT_NEAR(o.pre[static_cast<size_t>(t * kHc) + j], ref.pre[j], 2e-6)
            << "eps " << p.hc_eps << " t " << t;
        EXPECT_NEAR(o.post[static_cast<size_t>(t * kHc) + j], ref.post[j], 4e-6)
            << "eps " << p.hc_eps << " t " << t;
      }
    }
  }
}

TEST(CpuHcMixes, OneIterationIsRowSoftmaxThenColumnNormalised) {
  CpuBackend be;
  const MixCase c = random_mix_case(52);
  for (const MixParams p : {MixParams{1e-6f, 1e-6f, 1}, MixParams{1e-6f, 0.05f, 1}}) {
    const MixOut o = run_mixes(be, c, p);
    for (int64_t t = 0; t < c.T; ++t) {
      const NaiveMix ref = naive_mixes(row_of(c, t), c.fn, c.base, c.scale, p.norm_eps, p.hc_eps, 1);
      for (size_t i = 0; i < kHc * kHc; ++i)
        EXPECT_NEAR(o.comb[static_cast<size_t>(t * kHc * kHc) + i], ref.comb[i], 2e-6)
            << "eps " << p.hc_eps << " " << i;
    }
  }
}

TEST(CpuHcMixes, TwentyIterationsAreDoublyStochastic) {
  CpuBackend be;
  const MixCase c = random_mix_case(53);
  const MixOut o = run_mixes(be, c, MixParams{1e-6f, 1e-6f, 20});
  const MixOut one = run_mixes(be, c, MixParams{1e-6f, 1e-6f, 1});
  double one_dev = 0.0;
  for (int64_t t = 0; t < c.T; ++t) {
    const NaiveMix ref = naive_mixes(row_of(c, t), c.fn, c.base, c.scale, 1e-6, 1e-6, 20);
    const float* C = o.comb.data() + t * kHc * kHc;
    const float* C1 = one.comb.data() + t * kHc * kHc;
    for (int64_t a = 0; a < kHc; ++a) {
      double rs = 0.0, cs = 0.0, rs1 = 0.0;
      for (int64_t b = 0; b < kHc; ++b) {
        rs += C[a * kHc + b];
        cs += C[b * kHc + a];
        rs1 += C1[a * kHc + b];
        EXPECT_NEAR(C[a * kHc + b], ref.comb[static_cast<size_t>(a * kHc + b)], 1e-5);
        EXPECT_GT(C[a * kHc + b], 0.0f);
      }
      EXPECT_NEAR(rs, 1.0, 1e-3) << "row " << a;
      EXPECT_NEAR(cs, 1.0, 1e-3) << "column " << a;
      one_dev = std::max(one_dev, std::fabs(rs1 - 1.0));
    }
  }
  // The case is not trivially doubly stochastic already after the first column pass.
  EXPECT_GT(one_dev, 2e-2);
}

TEST(CpuHcCollapse, WeightedSumOfCopies) {
  CpuBackend be;
  std::mt19937 g(61);
  const int64_t T = 2, H = 5;
  const std::vector<float> xs = rand_vec(g, T * kHc * H, -3.0f, 3.0f, true);
  const std::vector<float> pre = {1.0f, 0.0f, 0.0f, 0.0f, 0.3f, -0.7f, 1.9f, 0.05f};
  Tensor X = make_tensor(be, DType::bf16, {T, kHc, H}, xs);
  Tensor P = make_tensor(be, DType::f32, {T, kHc}, pre);
  Tensor out = be.alloc(DType::bf16, {T, H});
  be.hc_collapse(X, P, out);
  const std::vector<float> o = to_floats(be, out);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < H; ++i) {
      double ref = 0.0, mag = 0.0;
      for (int64_t j = 0; j < kHc; ++j) {
        const double v = static_cast<double>(pre[static_cast<size_t>(t * kHc + j)]) *
                         xs[static_cast<size_t>((t * kHc + j) * H + i)];
        ref += v;
        mag += std::fabs(v);
      }
      EXPECT_NEAR(o[static_cast<size_t>(t * H + i)], ref, kBf16Ulp * std::fabs(ref) + 1e-6 * mag)
          << t << "," << i;
    }
  // pre = e_0 picks copy 0 exactly.
  for (int64_t i = 0; i < H; ++i) EXPECT_EQ(o[static_cast<size_t>(i)], xs[static_cast<size_t>(i)]);
}

TEST(CpuHcExpand, PostTimesYPlusCombColumns) {
  CpuBackend be;
  std::mt19937 g(62);
  const int64_t T = 2, H = 5;
  const std::vector<float> xs = rand_vec(g, T * kHc * H, -3.0f, 3.0f, true);
  const std::vector<float> ys = rand_vec(g, T * H, -3.0f, 3.0f, true);
  const std::vector<float> post = rand_vec(g, T * kHc, 0.0f, 2.0f, false);
  // Deliberately far from symmetric, so that rows and columns of C give different results.
  std::vector<float> comb = rand_vec(g, T * kHc * kHc, 0.0f, 0.2f, false);
  for (int64_t t = 0; t < T; ++t) comb[static_cast<size_t>(t * kHc * kHc + 0 * kHc + 3)] = 1.5f;  // C[0][3]
  Tensor X = make_tensor(be, DType::bf16, {T, kHc, H}, xs);
  Tensor y = make_tensor(be, DType::bf16, {T, H}, ys);
  Tensor P = make_tensor(be, DType::f32, {T, kHc}, post);
  Tensor C = make_tensor(be, DType::f32, {T, kHc, kHc}, comb);
  be.hc_expand(y, X, P, C);
  const std::vector<float> o = to_floats(be, X);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t l = 0; l < kHc; ++l)
      for (int64_t i = 0; i < H; ++i) {
        double ref =
            static_cast<double>(post[static_cast<size_t>(t * kHc + l)]) * ys[static_cast<size_t>(t * H + i)];
        double mag = std::fabs(ref);
        for (int64_t j = 0; j < kHc; ++j) {
          const double v = static_cast<double>(comb[static_cast<size_t>(t * kHc * kHc + j * kHc + l)]) *
                           xs[static_cast<size_t>((t * kHc + j) * H + i)];
          ref += v;
          mag += std::fabs(v);
        }
        EXPECT_NEAR(o[static_cast<size_t>((t * kHc + l) * H + i)], ref,
                    kBf16Ulp * std::fabs(ref) + 1e-6 * mag)
            << t << "," << l << "," << i;
      }
}

}  // namespace
}  // namespace dspark
