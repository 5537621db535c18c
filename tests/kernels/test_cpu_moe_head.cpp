// CpuBackend MoE (moe_route; the experts: shared, routed, combine) and head ops (markov_top2, markov_commit,
// confidence) against hand cases and naive double formulations of SPEC §4.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/core/gumbel.hpp"
#include "lib/core/numeric.hpp"
#include "tests/support/moe_ffn.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark {
namespace {

using test::make_i32;
using test::make_tensor;
using test::to_floats;
using test::to_i32;

constexpr float kInf = std::numeric_limits<float>::infinity();

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

// ---- moe_route

struct RouteRef {
  std::vector<int32_t> ids;
  std::vector<double> weights;
};

// Naive routing of one row: score = sqrt(softplus(x.gate / temp)); top-k of score + bias, ties to the lower
// id.
RouteRef naive_route(const std::vector<float>& x, const std::vector<float>& gate,
                     const std::vector<float>& bias, const RouteParams& p) {
  const size_t H = x.size(), E = bias.size();
  std::vector<double> score(E), biased(E);
  for (size_t e = 0; e < E; ++e) {
    double l = 0.0;
    for (size_t i = 0; i < H; ++i) l += static_cast<double>(x[i]) * gate[e * H + i];
    l /= p.gate_temp;
    score[e] = std::sqrt(std::log1p(std::exp(l)));
    biased[e] = score[e] + bias[e];
  }
  RouteRef r;
  std::vector<bool> taken(E, false);
  for (int64_t c = 0; c < p.top_k; ++c) {
    size_t best = E;
    for (size_t e = 0; e < E; ++e)
      if (!taken[e] && (best == E || biased[e] > biased[best])) best = e;  // strict: lower id wins ties
    taken[best] = true;
    r.ids.push_back(static_cast<int32_t>(best));
  }
  double sum = 0.0;
  for (int32_t e : r.ids) sum += score[static_cast<size_t>(e)];
  for (int32_t e : r.ids)
    r.weights.push_back((p.normalize ? score[static_cast<size_t>(e)] / sum : score[static_cast<size_t>(e)]) *
                        p.route_scale);
  return r;
}

struct RouteCase {
  int64_t T = 2, H = 4, E = 6;
  // Row 0 = e_0 and row 1 = e_1 pick gate columns 0 and 1 as the logits.
  std::vector<float> x = {1, 0, 0, 0, /*row 1*/ 0, 1, 0, 0};
  // Column 0 (row 0's logits): 0.5, 2, -1, 2, 1, 0 -> experts 1 and 3 tie. Column 1 (row 1's): 3, -2, 0.25,
  // 1, 1, -4
  // -> experts 3 and 4 tie.
  std::vector<float> gate = {
      0.5f,        3.0f, 0.0f, 0.0f, /*e1*/ 2.0f, -2.0f, 0.0f, 0.0f, /*e2*/ -1.0f, 0.25f, 0.0f, 0.0f,
      /*e3*/ 2.0f, 1.0f, 0.0f, 0.0f, /*e4*/ 1.0f, 1.0f,  0.0f, 0.0f, /*e5*/ 0.0f,  -4.0f, 0.0f, 0.0f};
};

void run_route(CpuBackend& be, const RouteCase& c, const std::vector<float>& bias, const RouteParams& p,
               std::vector<int32_t>& ids, std::vector<float>& weights) {
  Tensor x = make_tensor(be, DType::bf16, {c.T, c.H}, c.x);
  Tensor gate = make_tensor(be, DType::bf16, {c.E, c.H}, c.gate);
  Tensor b = make_tensor(be, DType::f32, {c.E}, bias);
  Tensor it = be.alloc(DType::i32, {c.T, p.top_k});
  Tensor wt = be.alloc(DType::f32, {c.T, p.top_k});
  be.moe_route(x, gate, b, p, it, wt);
  ids = to_i32(be, it);
  weights = to_floats(be, wt);
}

TEST(CpuMoeRoute, HandScoresTiesAndNormalisedWeights) {
  CpuBackend be;
  const RouteCase c;
  const RouteParams p{3, 1.5f, 1.0f, true};
  std::vector<int32_t> ids;
  std::vector<float> w;
  run_route(be, c, std::vector<float>(6, 0.0f), p, ids, w);
  // Row 0: experts 1 and 3 (logit 2) tie -> 1 first; then expert 4 (logit 1). Row 1: 0 (logit 3), then 3 and
  // 4 tie.
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 4, 0, 3, 4}));
  const double s2 = std::sqrt(std::log1p(std::exp(2.0))), s1 = std::sqrt(std::log1p(std::exp(1.0)));
  const double s3 = std::sqrt(std::log1p(std::exp(3.0)));
  EXPECT_NEAR(w[0], s2 / (s2 + s2 + s1) * 1.5, 1e-6);
  EXPECT_NEAR(w[1], s2 / (s2 + s2 + s1) * 1.5, 1e-6);
  EXPECT_NEAR(w[2], s1 / (s2 + s2 + s1) * 1.5, 1e-6);
  EXPECT_NEAR(w[3], s3 / (s3 + s1 + s1) * 1.5, 1e-6);
  EXPECT_NEAR(w[4], s1 / (s3 + s1 + s1) * 1.5, 1e-6);
  EXPECT_NEAR(w[5], s1 / (s3 + s1 + s1) * 1.5, 1e-6);
  EXPECT_NEAR(w[0] + w[1] + w[2], 1.5, 1e-6);
}

TEST(CpuMoeRoute, BiasSelectsButDoesNotWeigh) {
  CpuBackend be;
  const RouteCase c;
  const RouteParams p{3, 1.5f, 1.0f, true};
  // Expert 5 (score sqrt(ln 2) on row 0, sqrt(softplus(-4)) on row 1) is lifted to the top by its bias;
  // expert 3 is pushed below expert 4 on row 1 (they tied without bias).
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, -0.01f, 0.0f, 10.0f};
  std::vector<int32_t> ids;
  std::vector<float> w;
  run_route(be, c, bias, p, ids, w);
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 1, 3, 5, 0, 4}));
  const double s5a = std::sqrt(std::log(2.0)), s2 = std::sqrt(std::log1p(std::exp(2.0)));
  const double s5b = std::sqrt(std::log1p(std::exp(-4.0))), s3 = std::sqrt(std::log1p(std::exp(3.0)));
  const double s1 = std::sqrt(std::log1p(std::exp(1.0)));
  EXPECT_NEAR(w[0], s5a / (s5a + s2 + s2) * 1.5, 1e-6);  // the raw score, not score + 10
  EXPECT_NEAR(w[1], s2 / (s5a + s2 + s2) * 1.5, 1e-6);
  EXPECT_NEAR(w[3], s5b / (s5b + s3 + s1) * 1.5, 1e-6);
  EXPECT_NEAR(w[5], s1 / (s5b + s3 + s1) * 1.5, 1e-6);
  for (int64_t t = 0; t < c.T; ++t) {
    const RouteRef ref = naive_route({c.x.begin() + t * c.H, c.x.begin() + (t + 1) * c.H}, c.gate, bias, p);
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(ids[static_cast<size_t>(t * 3) + i], ref.ids[i]);
      EXPECT_NEAR(w[static_cast<size_t>(t * 3) + i], ref.weights[i], 1e-6);
    }
  }
}

TEST(CpuMoeRoute, UnnormalisedAndTemperature) {
  CpuBackend be;
  const RouteCase c;
  std::vector<int32_t> ids;
  std::vector<float> w;
  const std::vector<float> bias(6, 0.0f);
  // normalize = false: raw score * route_scale.
  run_route(be, c, bias, RouteParams{2, 2.5f, 1.0f, false}, ids, w);
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 3, 0, 3}));
  EXPECT_NEAR(w[0], std::sqrt(std::log1p(std::exp(2.0))) * 2.5, 1e-5);
  EXPECT_NEAR(w[2], std::sqrt(std::log1p(std::exp(3.0))) * 2.5, 1e-5);
  // gate_temp divides the logit before softplus.
  const RouteParams pt{4, 1.0f, 2.0f, false};
  run_route(be, c, bias, pt, ids, w);
  EXPECT_NEAR(w[0], std::sqrt(std::log1p(std::exp(1.0))), 1e-6);  // expert 1: logit 2 / temp 2
  for (int64_t t = 0; t < c.T; ++t) {
    const RouteRef ref = naive_route({c.x.begin() + t * c.H, c.x.begin() + (t + 1) * c.H}, c.gate, bias, pt);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(ids[static_cast<size_t>(t * 4) + i], ref.ids[i]) << t << "," << i;
      EXPECT_NEAR(w[static_cast<size_t>(t * 4) + i], ref.weights[i], 1e-6) << t << "," << i;
    }
  }
}

// ---- moe_experts

struct HostExpert {
  int64_t I;
  std::vector<float> w1, w3, w2;  // [I, H], [I, H], [H, I]
};

HostExpert random_expert(std::mt19937& g, int64_t I, int64_t H) {
  // Multiples of 0.25 in [-2, 2]: dot products with the x below are exact in fp32, bf16 and double.
  std::uniform_int_distribution<int> d(-8, 8);
  auto fill = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = static_cast<float>(d(g)) * 0.25f;
    return v;
  };
  return {I, fill(static_cast<size_t>(I * H)), fill(static_cast<size_t>(I * H)),
          fill(static_cast<size_t>(H * I))};
}

ExpertWeights upload_expert(CpuBackend& be, const HostExpert& e, int64_t H) {
  return {dense_linear("w1", make_tensor(be, DType::bf16, {e.I, H}, e.w1)),
          dense_linear("w3", make_tensor(be, DType::bf16, {e.I, H}, e.w3)),
          dense_linear("w2", make_tensor(be, DType::bf16, {H, e.I}, e.w2))};
}

struct ClampStats {
  int g_hi = 0, g_lo = 0, u_hi = 0, u_lo = 0;
};

// Naive expert on one row: bf16(w2 . bf16(w * silu(min(g, L)) * clamp(u, +-L))) with g, u = bf16(w1 x),
// bf16(w3 x). `clamp` = false drops both clamps (for the sensitivity check).
std::vector<double> naive_expert(const std::vector<float>& x, const HostExpert& e, double w, double L,
                                 bool clamp, ClampStats* st, std::vector<double>* mag) {
  const size_t H = x.size(), I = static_cast<size_t>(e.I);
  std::vector<float> h(I);
  for (size_t c = 0; c < I; ++c) {
    double g = 0.0, u = 0.0;
    for (size_t i = 0; i < H; ++i) {
      g += static_cast<double>(x[i]) * e.w1[c * H + i];
      u += static_cast<double>(x[i]) * e.w3[c * H + i];
    }
    g = round_bf16(static_cast<float>(g));
    u = round_bf16(static_cast<float>(u));
    if (st) {
      st->g_hi += g > L, st->g_lo += g<-L, st->u_hi += u> L, st->u_lo += u < -L;
    }
    const double gc = clamp ? std::min(g, L) : g, uc = clamp ? std::clamp(u, -L, L) : u;
    h[c] = round_bf16(static_cast<float>(gc / (1.0 + std::exp(-gc)) * uc * w));
  }
  std::vector<double> out(H);
  for (size_t o = 0; o < H; ++o) {
    double acc = 0.0, m = 0.0;
    for (size_t c = 0; c < I; ++c) {
      acc += static_cast<double>(h[c]) * e.w2[o * I + c];
      m += std::fabs(static_cast<double>(h[c]) * e.w2[o * I + c]);
    }
    out[o] = round_bf16(static_cast<float>(acc));
    if (mag) (*mag)[o] += m;
  }
  return out;
}

TEST(CpuMoeExperts, RoutedPlusSharedWithSwigluClamp) {
  CpuBackend be;
  std::mt19937 g(81);
  const int64_t H = 4, T = 2, top_k = 2;
  const float L = 2.0f;
  std::vector<HostExpert> experts = {random_expert(g, 3, H), random_expert(g, 2, H), random_expert(g, 4, H)};
  const HostExpert shared = random_expert(g, 2, H);
  const std::vector<float> xs = {1.0f, 0.5f, -1.0f, 2.0f, /*row 1*/ 0.25f, -2.0f, 1.0f, 0.5f};
  // Choices not in id order (the kernel may sum in any order), weights of routed experts only.
  const std::vector<int32_t> ids = {2, 0, 1, 2};
  const std::vector<float> ws = {0.75f, 2.0f, 1.25f, 0.5f};

  StageWeights stage;
  for (const HostExpert& e : experts) stage.experts.push_back(upload_expert(be, e, H));
  stage.shared = upload_expert(be, shared, H);
  Tensor x = make_tensor(be, DType::bf16, {T, H}, xs);
  Tensor it = make_i32(be, {T, top_k}, ids);
  Tensor wt = make_tensor(be, DType::f32, {T, top_k}, ws);
  Tensor out = be.alloc(DType::f32, {T, H});
  test::moe_experts(be, x, it, wt, stage, L, out);
  const std::vector<float> o = to_floats(be, out);

  ClampStats st;
  double worst_unclamped = 0.0, worst_unscaled = 0.0;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> xr(xs.begin() + t * H, xs.begin() + (t + 1) * H);
    std::vector<double> ref(H, 0.0), noclamp(H, 0.0), noscale(H, 0.0), mag(H, 0.0);
    for (int64_t c = 0; c < top_k; ++c) {
      const HostExpert& e = experts[static_cast<size_t>(ids[static_cast<size_t>(t * top_k + c)])];
      const double w = ws[static_cast<size_t>(t * top_k + c)];
      const std::vector<double> a = naive_expert(xr, e, w, L, true, &st, &mag);
      const std::vector<double> b = naive_expert(xr, e, w, L, false, nullptr, nullptr);
      const std::vector<double> s = naive_expert(xr, e, 1.0, L, true, nullptr, nullptr);
      for (int64_t i = 0; i < H; ++i) ref[i] += a[i], noclamp[i] += b[i], noscale[i] += s[i];
    }
    const std::vector<double> sh = naive_expert(xr, shared, 1.0, L, true, &st, &mag);
    const std::vector<double> shb = naive_expert(xr, shared, 1.0, L, false, nullptr, nullptr);
    for (int64_t i = 0; i < H; ++i) {
      ref[i] += sh[i], noclamp[i] += shb[i], noscale[i] += sh[i];
      // Each bf16 rounding of h and of the expert output is within 2^-9 relative; silu in fp32 vs double may
      // flip one rounding.
      const double tol = mag[static_cast<size_t>(i)] / 128.0 + 1e-6;
      EXPECT_NEAR(o[static_cast<size_t>(t * H + i)], ref[static_cast<size_t>(i)], tol) << t << "," << i;
      worst_unclamped = std::max(worst_unclamped, std::fabs(noclamp[i] - ref[i]) / tol);
      worst_unscaled = std::max(worst_unscaled, std::fabs(noscale[i] - ref[i]) / tol);
    }
  }
  // The case really drives g above the limit and u past both limits, and both the clamps and the routing
  // weights change the result by far more than the tolerance.
  EXPECT_GT(st.g_hi, 0);
  EXPECT_GT(st.u_hi, 0);
  EXPECT_GT(st.u_lo, 0);
  EXPECT_GT(worst_unclamped, 10.0);
  EXPECT_GT(worst_unscaled, 10.0);
}

TEST(CpuMoeExperts, RoundsAtTheSpecPointsExactly) {
  CpuBackend be;
  // Small-mantissa data: the fp32 dot products and sums are exact, so the only roundings are the ones the
  // spec prescribes (g and u to bf16, h to bf16, each expert's w2 output to bf16), and the result is
  // bit-exact. Routing weights like 0.7 and w2 entries like 3 or 1.25 make both roundings visible.
  std::mt19937 g(82);
  const int64_t H = 4;
  const float L = 10.0f;
  std::vector<HostExpert> experts = {random_expert(g, 4, H), random_expert(g, 3, H)};
  HostExpert shared = random_expert(g, 2, H);
  const std::vector<float> w2vals = {0.75f, -1.5f, 3.0f, -1.25f, 1.0f, 0.5f, -3.0f, 2.5f};
  std::uniform_int_distribution<size_t> pick(0, w2vals.size() - 1);
  for (HostExpert* e : {&experts[0], &experts[1], &shared})
    for (float& v : e->w2) v = w2vals[pick(g)];
  // 1 + 2^-7 and 0.25 + 2^-7: g and u need more than bf16's 8 bits, so their rounding is visible too.
  const std::vector<float> xs = {1.0078125f, 0.5f, -1.0f, 0.2578125f};
  const std::vector<int32_t> ids = {1, 0};
  const std::vector<float> ws = {0.7f, 0.3f};

  StageWeights stage;
  for (const HostExpert& e : experts) stage.experts.push_back(upload_expert(be, e, H));
  stage.shared = upload_expert(be, shared, H);
  Tensor x = make_tensor(be, DType::bf16, {1, H}, xs);
  Tensor it = make_i32(be, {1, 2}, ids);
  Tensor wt = make_tensor(be, DType::f32, {1, 2}, ws);
  Tensor out = be.alloc(DType::f32, {1, H});
  test::moe_experts(be, x, it, wt, stage, L, out);
  const std::vector<float> o = to_floats(be, out);

  std::vector<double> ref(H, 0.0);
  for (size_t c = 0; c < 2; ++c) {
    const std::vector<double> a = naive_expert(xs, experts[static_cast<size_t>(ids[c])],
                                               static_cast<double>(ws[c]), L, true, nullptr, nullptr);
    for (int64_t i = 0; i < H; ++i) ref[static_cast<size_t>(i)] += a[static_cast<size_t>(i)];
  }
  const std::vector<double> sh = naive_expert(xs, shared, 1.0, L, true, nullptr, nullptr);
  for (int64_t i = 0; i < H; ++i) {
    ref[static_cast<size_t>(i)] += sh[static_cast<size_t>(i)];
    EXPECT_EQ(o[static_cast<size_t>(i)], ref[static_cast<size_t>(i)]) << i;
  }
}

TEST(CpuMoeExperts, GateIsClampedOnlyFromAbove) {
  CpuBackend be;
  // H = 4, one routed expert (I = 2) and a shared expert that outputs zero (w2 = 0). x = [1, 1, 1, 1].
  // Channel 0: g = -5 (stays -5: min only), u = 1.  Channel 1: g = 6 -> 2, u = -3 -> -2.
  // h = [silu(-5) * 1, silu(2) * -2] * w; w2 = identity on the first two outputs.
  const int64_t H = 4;
  const float L = 2.0f, w = 0.5f;
  HostExpert e{2,
               {-2.0f, -1.0f, -1.0f, -1.0f, /*c1*/ 2.0f, 2.0f, 1.0f, 1.0f},
               {0.25f, 0.25f, 0.25f, 0.25f, /*c1*/ -1.0f, -1.0f, -0.5f, -0.5f},
               {1.0f, 0.0f, /*o1*/ 0.0f, 1.0f, /*o2*/ 0.0f, 0.0f, /*o3*/ 0.0f, 0.0f}};
  HostExpert zero{2, std::vector<float>(8, 1.0f), std::vector<float>(8, 1.0f), std::vector<float>(8, 0.0f)};
  StageWeights stage;
  stage.experts.push_back(upload_expert(be, e, H));
  stage.shared = upload_expert(be, zero, H);
  Tensor x = make_tensor(be, DType::bf16, {1, H}, {1, 1, 1, 1});
  Tensor it = make_i32(be, {1, 1}, {0});
  Tensor wt = make_tensor(be, DType::f32, {1, 1}, {w});
  Tensor out = be.alloc(DType::f32, {1, H});
  test::moe_experts(be, x, it, wt, stage, L, out);
  const std::vector<float> o = to_floats(be, out);
  const double silu_m5 = -5.0 / (1.0 + std::exp(5.0)), silu_2 = 2.0 / (1.0 + std::exp(-2.0));
  EXPECT_EQ(o[0], round_bf16(static_cast<float>(silu_m5 * 1.0 * w)));
  EXPECT_EQ(o[1], round_bf16(static_cast<float>(silu_2 * -2.0 * w)));
  EXPECT_EQ(o[2], 0.0f);
  EXPECT_EQ(o[3], 0.0f);
}

TEST(CpuMoeExperts, CombineAddsInAscendingIdThenSharedSkippingBadIds) {
  CpuBackend be;
  // H = 1. Row 0 chooses experts 5, 1, 3 with outputs -1e8, 1e8, 1: in ascending id (1e8 + 1) - 1e8 = 0 in
  // fp32 (1 is below half an ulp of 1e8), + shared 0.5 = 0.5; in choice order it would be 1.5. Row 1
  // chooses 2, -1 and 7 (E = 6): only expert 2's 0.25 counts, + shared -2.
  const std::vector<int32_t> ids = {5, 1, 3, /**/ 2, -1, 7};
  const std::vector<float> y = {-1e8f, 1e8f, 1.0f, /**/ 0.25f, 1000.0f, 1000.0f};
  Tensor out = be.alloc(DType::f32, {2, 1});
  be.moe_combine(make_i32(be, {2, 3}, ids), make_tensor(be, DType::f32, {2, 3, 1}, y),
                 make_tensor(be, DType::f32, {2, 1}, {0.5f, -2.0f}), 6, out);
  const std::vector<float> o = to_floats(be, out);
  EXPECT_EQ(o[0], 0.5f);
  EXPECT_EQ(o[1], -1.75f);
}

// ---- Markov loop

std::vector<MarkovRecord> to_records(Backend& be, const Tensor& t) {
  std::vector<MarkovRecord> v(static_cast<size_t>(t.dim(0)));
  be.download(v.data(), t);
  return v;
}

// Sampling fields of B requests: every one greedy, or at the temperatures and seeds given.
Tensor sampling_fields(Backend& be, int64_t B, const std::vector<float>& tau = {},
                       const std::vector<uint64_t>& seed = {}) {
  std::vector<int32_t> f(static_cast<size_t>(B * kSampleFields), 0);
  for (size_t b = 0; b < tau.size(); ++b) {
    f[b * kSampleFields + kSampleTemperature] = std::bit_cast<int32_t>(tau[b]);
    f[b * kSampleFields + kSampleSeedLow] = static_cast<int32_t>(static_cast<uint32_t>(seed[b]));
    f[b * kSampleFields + kSampleSeedHigh] = static_cast<int32_t>(static_cast<uint32_t>(seed[b] >> 32));
  }
  return make_i32(be, {B, kSampleFields}, f);
}

MarkovOutputs alloc_outputs(Backend& be, int64_t B, int64_t k) {
  MarkovOutputs o{be.alloc(DType::i32, {B, k}), be.alloc(DType::f32, {B, k}), be.alloc(DType::f32, {B, k}),
                  be.alloc(DType::f32, {B, k, 2})};
  be.fill_i32(o.ids, -7);
  for (const Tensor* t : {&o.margin, &o.q, &o.norm})
    be.upload(*t, std::vector<float>(static_cast<size_t>(t->numel()), -9.0f).data());
  return o;
}

TEST(CpuMarkov, Top2HandCase) {
  CpuBackend be;
  const int64_t B = 2, k = 2, Vr = 5, R = 2, V = 7, offset = 100;
  // Logit rows are b * k + j.
  const std::vector<float> logits = {4.0f, 0.0f, 0.0f, 0.0f, 4.5f,   // b 0, j 0
                                     0.0f, 2.5f, 1.0f, 1.0f, 0.0f,   // b 0, j 1
                                     0.0f, 0.0f, 3.0f, 2.0f, 1.0f,   // b 1, j 0
                                     9.0f, 9.0f, 9.0f, 9.0f, 9.0f};  // b 1, j 1 (past its outputs)
  const std::vector<float> head = {1.0f, 0.0f, 0.5f, 1.0f, 0.0f, 0.0f, 2.0f, -1.0f, -1.0f, 1.0f};  // [Vr, R]
  std::vector<float> emb(V * R, 0.0f);
  emb[3 * R] = 1.0f, emb[3 * R + 1] = 0.0f;  // prev of b 0 -> bias = head[:, 0] = [1, 0.5, 0, 2, -1]
  emb[6 * R] = 0.5f, emb[6 * R + 1] = 2.0f;  // prev of b 1 -> bias = [0.5, 2.25, 0, -1, 1.5]
  emb[0] = 100.0f;                           // a wrong prev lookup would be obvious
  Tensor lt = make_tensor(be, DType::f32, {B * k, Vr}, logits);
  Tensor ht = make_tensor(be, DType::bf16, {Vr, R}, head);
  Tensor et = make_tensor(be, DType::bf16, {V, R}, emb);
  Tensor prev = make_i32(be, {B}, {3, 6});
  Tensor req = make_i32(be, {B, kReqFields}, {0, 0, 10, 2, /*b 1*/ 1, 0, 20, 1});
  Tensor cand = be.alloc(DType::i32, {B, kMarkovRecordWords});
  const Tensor greedy = sampling_fields(be, B);

  be.markov_top2(lt, ht, Tensor{}, et, prev, req, greedy, 0, k, offset, MarkovCache{}, cand);
  std::vector<MarkovRecord> c = to_records(be, cand);
  // b 0: [5, 0.5, 0, 2, 3.5] -> 5 at column 0, second 3.5. b 1: [0.5, 2.25, 3, 1, 2.5] -> 3 at column 2,
  // second 2.5.
  EXPECT_EQ(c[0].best, 5.0f);
  EXPECT_EQ(c[0].second, 3.5f);
  EXPECT_EQ(c[0].index, 100);
  EXPECT_EQ(c[1].best, 3.0f);
  EXPECT_EQ(c[1].second, 2.5f);
  EXPECT_EQ(c[1].index, 102);
  EXPECT_EQ(c[0].sample_index, -1);  // greedy: no draw
  EXPECT_EQ(c[1].sample_index, -1);

  be.markov_top2(lt, ht, Tensor{}, et, prev, req, greedy, 1, k, offset, MarkovCache{}, cand);
  c = to_records(be, cand);
  // b 0: [1, 3, 1, 3, -1] -> columns 1 and 3 tie at 3: the lower id wins, second = 3 (margin 0).
  EXPECT_EQ(c[0].best, 3.0f);
  EXPECT_EQ(c[0].second, 3.0f);
  EXPECT_EQ(c[0].index, 101);
  // b 1 has one output: j = 1 is past it.
  EXPECT_EQ(c[1].best, -kInf);
  EXPECT_EQ(c[1].second, -kInf);
  EXPECT_EQ(c[1].index, 0);
}

TEST(CpuMarkov, Top2MatchesNaiveArgmax) {
  CpuBackend be;
  std::mt19937 g(91);
  const int64_t B = 3, k = 4, Vr = 50, R = 8, V = 60, offset = 1234;
  std::uniform_real_distribution<float> d(-3.0f, 3.0f);
  std::vector<float> logits(B * k * Vr), head(Vr * R), emb(V * R);
  for (float& v : logits) v = d(g);
  for (float& v : head) v = round_bf16(d(g));
  for (float& v : emb) v = round_bf16(d(g));
  const std::vector<int32_t> prevs = {7, 59, 0};
  Tensor lt = make_tensor(be, DType::f32, {B * k, Vr}, logits);
  Tensor ht = make_tensor(be, DType::bf16, {Vr, R}, head);
  Tensor et = make_tensor(be, DType::bf16, {V, R}, emb);
  Tensor prev = make_i32(be, {B}, prevs);
  Tensor req = make_i32(be, {B, kReqFields}, {0, 0, 1, 4, 1, 0, 1, 4, 2, 0, 1, 4});
  Tensor cand = be.alloc(DType::i32, {B, kMarkovRecordWords});
  for (int64_t j = 0; j < k; ++j) {
    be.markov_top2(lt, ht, Tensor{}, et, prev, req, sampling_fields(be, B), j, k, offset, MarkovCache{},
                   cand);
    const std::vector<MarkovRecord> c = to_records(be, cand);
    for (int64_t b = 0; b < B; ++b) {
      std::vector<double> val(Vr);
      for (int64_t v = 0; v < Vr; ++v) {
        double bias = 0.0;
        for (int64_t r = 0; r < R; ++r)
          bias += static_cast<double>(head[static_cast<size_t>(v * R + r)]) *
                  emb[static_cast<size_t>(prevs[static_cast<size_t>(b)] * R + r)];
        val[static_cast<size_t>(v)] = logits[static_cast<size_t>((b * k + j) * Vr + v)] + bias;
      }
      std::vector<double> sorted = val;
      std::sort(sorted.begin(), sorted.end(), std::greater<>());
      const int64_t arg = std::max_element(val.begin(), val.end()) - val.begin();
      ASSERT_GT(sorted[0] - sorted[1], 1e-4) << "test data must not nearly tie";
      EXPECT_EQ(c[static_cast<size_t>(b)].index, offset + arg) << "b " << b << " j " << j;
      EXPECT_NEAR(c[static_cast<size_t>(b)].best, sorted[0], 1e-5);
      EXPECT_NEAR(c[static_cast<size_t>(b)].second, sorted[1], 1e-5);
    }
  }
}

TEST(CpuMarkov, CommitWritesOnlyRequestsWithThatOutput) {
  CpuBackend be;
  const int64_t B = 2, k = 3;
  // b 0 greedy (no draw); b 1 drew id 9 with z 0.5 against z_max 1 and z_sum 2: q = exp(-0.5) / 2.
  std::vector<MarkovRecord> cand = {{5.0f, 3.5f, 104, -1, 0.0f, 0.0f, 0.0f, 0.0f},
                                    {2.0f, -1.0f, 7, 9, 1.25f, 0.5f, 1.0f, 2.0f}};
  Tensor ct = be.alloc(DType::i32, {B, kMarkovRecordWords});
  be.upload(ct, cand.data());
  Tensor req = make_i32(be, {B, kReqFields}, {0, 0, 10, 2, /*b 1*/ 1, 0, 20, 1});
  Tensor prev = make_i32(be, {B}, {11, 22});
  const MarkovOutputs out = alloc_outputs(be, B, k);
  const float q1 = std::exp(-0.5f) / 2.0f;

  be.markov_commit(ct, req, 1, prev, out);
  EXPECT_EQ(to_i32(be, out.ids), (std::vector<int32_t>{-7, 104, -7, -7, -7, -7}));
  EXPECT_EQ(to_floats(be, out.margin), (std::vector<float>{-9.0f, 1.5f, -9.0f, -9.0f, -9.0f, -9.0f}));
  EXPECT_EQ(to_floats(be, out.q), (std::vector<float>{-9.0f, 1.0f, -9.0f, -9.0f, -9.0f, -9.0f}));
  EXPECT_EQ(to_i32(be, prev), (std::vector<int32_t>{104, 22}));

  be.markov_commit(ct, req, 0, prev, out);
  // b 1's token is its draw (9), not its argmax (7); its margin is still top1 - top2.
  EXPECT_EQ(to_i32(be, out.ids), (std::vector<int32_t>{104, 104, -7, 9, -7, -7}));
  EXPECT_EQ(to_floats(be, out.margin), (std::vector<float>{1.5f, 1.5f, -9.0f, 3.0f, -9.0f, -9.0f}));
  EXPECT_EQ(to_floats(be, out.q), (std::vector<float>{1.0f, 1.0f, -9.0f, q1, -9.0f, -9.0f}));
  const std::vector<float> norm = to_floats(be, out.norm);
  EXPECT_EQ(norm[0], 0.0f);  // greedy
  EXPECT_EQ(norm[1], 0.0f);
  EXPECT_EQ(norm[6], 1.0f);  // b 1, j 0: z_max, z_sum
  EXPECT_EQ(norm[7], 2.0f);
  EXPECT_EQ(to_i32(be, prev), (std::vector<int32_t>{104, 9}));
}

// Biased logits of a small random case and their values in double, for the sampled-draw tests.
struct SampledCase {
  static constexpr int64_t B = 3, k = 2, Vr = 40, R = 4, V = 50, offset = 7;
  std::vector<float> logits, head, emb;
  std::vector<int32_t> prevs{3, 41, 3};
  explicit SampledCase(uint32_t seed) {
    std::mt19937 g(seed);
    std::uniform_real_distribution<float> d(-2.0f, 2.0f);
    logits.resize(B * k * Vr), head.resize(Vr * R), emb.resize(V * R);
    for (float& v : logits) v = d(g);
    for (float& v : head) v = round_bf16(d(g));
    for (float& v : emb) v = round_bf16(d(g));
  }
  double value(int64_t b, int64_t j, int64_t v) const {
    double bias = 0.0;
    for (int64_t r = 0; r < R; ++r)
      bias += static_cast<double>(head[static_cast<size_t>(v * R + r)]) *
              emb[static_cast<size_t>(prevs[static_cast<size_t>(b)] * R + r)];
    return logits[static_cast<size_t>((b * k + j) * Vr + v)] + bias;
  }
};

// A batch of a greedy request and two sampled ones (tau 0.8 and 1.5): the draws against Gumbel-max over
// (value / tau + g) computed in double from the noise's own definition, q(tok) against softmax in double,
// the greedy request's record as in a batch of its own, and the top-2 of the sampled ones unchanged.
TEST(CpuMarkov, SampledRecordsAreGumbelMaxOverTheBiasedLogitsOverTemperature) {
  CpuBackend be;
  const SampledCase c(5);
  const int64_t B = c.B, k = c.k;
  Tensor lt = make_tensor(be, DType::f32, {B * k, c.Vr}, c.logits);
  Tensor ht = make_tensor(be, DType::bf16, {c.Vr, c.R}, c.head);
  Tensor et = make_tensor(be, DType::bf16, {c.V, c.R}, c.emb);
  Tensor prev = make_i32(be, {B}, c.prevs);
  Tensor req = make_i32(be, {B, kReqFields}, {0, 0, 30, 2, 1, 0, 31, 2, 2, 0, 32, 2});
  const std::vector<float> tau = {0.0f, 0.8f, 1.5f};
  Tensor cand = be.alloc(DType::i32, {B, kMarkovRecordWords}),
         alone = be.alloc(DType::i32, {B, kMarkovRecordWords});
  int draws_not_argmax = 0;
  for (uint64_t seed = 1; seed <= 40; ++seed)
    for (int64_t j = 0; j < k; ++j) {
      be.markov_top2(lt, ht, Tensor{}, et, prev, req, sampling_fields(be, B, tau, {0, seed, seed << 33}), j,
                     k, c.offset, MarkovCache{}, cand);
      be.markov_top2(lt, ht, Tensor{}, et, prev, req, sampling_fields(be, B), j, k, c.offset, MarkovCache{},
                     alone);
      const std::vector<MarkovRecord> r = to_records(be, cand), g = to_records(be, alone);
      EXPECT_EQ(std::memcmp(&r[0], &g[0], sizeof(MarkovRecord)), 0) << "the greedy request's record";
      for (int64_t b = 1; b < B; ++b) {
        const uint64_t s = b == 1 ? seed : seed << 33;
        const double t = tau[static_cast<size_t>(b)];
        double best = -INFINITY, z_max = -INFINITY, sum = 0.0;
        int64_t arg = -1, argmax = 0;
        for (int64_t v = 0; v < c.Vr; ++v) {
          const double z = c.value(b, j, v) / t;
          const auto id = static_cast<uint32_t>(c.offset + v);
          const double score = z + gumbel_noise(s, static_cast<uint32_t>(30 + b + j), id);
          if (score > best) best = score, arg = v;
          if (z > z_max) z_max = z, argmax = v;
        }
        for (int64_t v = 0; v < c.Vr; ++v) sum += std::exp(c.value(b, j, v) / t - z_max);
        const MarkovRecord& m = r[static_cast<size_t>(b)];
        EXPECT_EQ(m.sample_index, c.offset + arg) << "seed " << seed << " b " << b << " j " << j;
        EXPECT_EQ(m.index, g[static_cast<size_t>(b)].index);  // the top-2 does not depend on the draw
        EXPECT_EQ(m.best, g[static_cast<size_t>(b)].best);
        EXPECT_NEAR(drafted_probability(m), std::exp(c.value(b, j, arg) / t - z_max) / sum, 1e-5);
        draws_not_argmax += arg != argmax ? 1 : 0;
      }
    }
  EXPECT_GT(draws_not_argmax, 10);  // the draws are not the argmax in disguise
}

// The whole distribution of sampled positions: rows of this rank's columns placed at the offset, zeros
// elsewhere, against softmax in double; each row sums to 1 and holds the commit's q at the drafted token.
TEST(CpuMarkov, DraftDistributionIsTheSoftmaxOverTheRanksColumns) {
  CpuBackend be;
  const SampledCase c(8);
  const int64_t B = c.B, k = c.k, V = c.V;
  Tensor lt = make_tensor(be, DType::f32, {B * k, c.Vr}, c.logits);
  Tensor ht = make_tensor(be, DType::bf16, {c.Vr, c.R}, c.head);
  Tensor et = make_tensor(be, DType::bf16, {V, c.R}, c.emb);
  Tensor prev = make_i32(be, {B}, c.prevs);
  Tensor req = make_i32(be, {B, kReqFields}, {0, 0, 30, 1, 1, 0, 31, 1, 2, 0, 32, 1});
  const std::vector<float> tau = {0.0f, 0.8f, 1.5f};
  const Tensor sampling = sampling_fields(be, B, tau, {0, 11, 12});
  Tensor cand = be.alloc(DType::i32, {B, kMarkovRecordWords});
  const MarkovOutputs out = alloc_outputs(be, B, k);
  be.markov_top2(lt, ht, Tensor{}, et, prev, req, sampling, 0, k, c.offset, MarkovCache{}, cand);
  be.markov_commit(cand, req, 0, prev, out);
  // Rows for requests 1 and 2 at position 0 (block rows 2 and 4), their bias rows from markov_bias_rows.
  Tensor rows = make_i32(be, {2}, {2, 4});
  Tensor bias = be.alloc(DType::f32, {2, c.Vr});
  be.markov_bias_rows(ht, Tensor{}, et, make_i32(be, {2}, {c.prevs[1], c.prevs[2]}), bias);
  Tensor q = be.alloc(DType::f32, {2, V});
  be.upload(q, std::vector<float>(2 * V, -1.0f).data());
  be.draft_distribution(lt, bias, rows, sampling, out.norm, k, c.offset, q);
  const std::vector<float> got = to_floats(be, q), qtok = to_floats(be, out.q);
  const std::vector<int32_t> ids = to_i32(be, out.ids);
  for (int64_t i = 0; i < 2; ++i) {
    const int64_t b = i + 1;
    const double t = tau[static_cast<size_t>(b)];
    double z_max = -INFINITY, sum = 0.0, total = 0.0;
    for (int64_t v = 0; v < c.Vr; ++v) z_max = std::max(z_max, c.value(b, 0, v) / t);
    for (int64_t v = 0; v < c.Vr; ++v) sum += std::exp(c.value(b, 0, v) / t - z_max);
    for (int64_t v = 0; v < V; ++v) {
      const float x = got[static_cast<size_t>(i * V + v)];
      total += x;
      if (v < c.offset || v >= c.offset + c.Vr) {
        EXPECT_EQ(x, 0.0f) << "column " << v << " is another rank's";
        continue;
      }
      EXPECT_NEAR(x, std::exp(c.value(b, 0, v - c.offset) / t - z_max) / sum, 1e-6)
          << "row " << i << " v " << v;
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
    EXPECT_EQ(got[static_cast<size_t>(i * V + ids[static_cast<size_t>(b * k)])],
              qtok[static_cast<size_t>(b * k)])
        << "the whole distribution holds the commit's q at the drafted token";
  }
}

// ---- confidence

TEST(CpuConfidence, SigmoidOfProjOverHiddenAndPreviousTokenEmbedding) {
  CpuBackend be;
  const int64_t B = 2, k = 3, H = 2, R = 2, V = 5;
  const std::vector<float> h = {1.0f,  -0.5f, 0.25f, 2.0f, -1.0f, 0.5f,   // b 0, j 0..2
                                0.75f, 0.75f, -2.0f, 1.0f, 3.0f,  3.0f};  // b 1, j 0..2
  const std::vector<float> emb = {0.0f, 1.0f, 1.0f, 0.0f, -1.0f,
                                  0.5f, 0.5f, 0.5f, 2.0f, -2.0f};  // [V, R], distinct
  const std::vector<float> proj = {0.5f, -0.25f, 1.0f, 0.75f};
  const std::vector<int32_t> anchor = {4, 1};
  const std::vector<int32_t> ids = {2, 0, 3, /*b 1*/ 1, 4, 0};
  const std::vector<int32_t> outputs = {3, 2};
  Tensor ht = make_tensor(be, DType::bf16, {B * k, H}, h);
  Tensor et = make_tensor(be, DType::bf16, {V, R}, emb);
  Tensor pt = make_tensor(be, DType::bf16, {1, H + R}, proj);
  Tensor at = make_i32(be, {B}, anchor);
  Tensor it = make_i32(be, {B, k}, ids);
  Tensor req = make_i32(be, {B, kReqFields}, {0, 0, 10, outputs[0], /*b 1*/ 1, 0, 20, outputs[1]});
  Tensor conf = make_tensor(be, DType::f32, {B, k}, std::vector<float>(B * k, 7.0f));
  Tensor logit = make_tensor(be, DType::f32, {B, k}, std::vector<float>(B * k, 7.0f));
  be.confidence(ht, et, pt, at, it, req, k, conf, logit);
  const std::vector<float> c = to_floats(be, conf), l = to_floats(be, logit);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t j = 0; j < k; ++j) {
      const size_t idx = static_cast<size_t>(b * k + j);
      if (j >= outputs[static_cast<size_t>(b)]) {
        EXPECT_EQ(c[idx], 0.0f) << b << "," << j;
        EXPECT_EQ(l[idx], 0.0f) << b << "," << j;
        continue;
      }
      const int32_t prev = j == 0 ? anchor[static_cast<size_t>(b)] : ids[idx - 1];
      double z = 0.0;
      for (int64_t i = 0; i < H; ++i)
        z += static_cast<double>(proj[static_cast<size_t>(i)]) * h[idx * H + static_cast<size_t>(i)];
      for (int64_t r = 0; r < R; ++r)
        z += static_cast<double>(proj[static_cast<size_t>(H + r)]) * emb[static_cast<size_t>(prev * R + r)];
      EXPECT_NEAR(l[idx], z, 1e-6) << b << "," << j;
      EXPECT_NEAR(c[idx], sigmoid(z), 1e-6) << b << "," << j;
    }
  // Hand check of one entry: b 0, j 1 uses prev = ids[0, 0] = 2 -> e = [-1, 0.5]:
  // 0.5 * 0.25 - 0.25 * 2 + 1 * -1 + 0.75 * 0.5 = -1.0.
  EXPECT_NEAR(l[1], -1.0, 1e-6);
  EXPECT_NEAR(c[1], sigmoid(-1.0), 1e-6);
}

}  // namespace
}  // namespace dspark
