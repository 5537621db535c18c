// CudaBackend against CpuBackend: MoE routing (E 8, top 2) and experts (I 512, and a tp shard's 384), the
// Markov records (V 1024, R 32; also a vocabulary slice at an offset), greedy and sampled, the commit, the
// draft distribution and the confidence head. Integer results (expert ids, Markov ids) must be equal wherever
// the CPU's top-2 gap is clear; drawn ids everywhere (a near-tie of perturbed scores is improbable).
#include <bit>
#include <cstring>
#include <limits>
#include <random>

#include "tests/gpu/cuda_op_harness.hpp"

namespace dspark {
namespace {

using test::fetch;
using test::Outs;
using test::put;
using test::put_i32;
using CudaOps = test::CudaOps;

// A gap between competing scores above this is "clear": far above the GPU's fp32 reordering error (~1e-6).
constexpr double kClearGap = 1e-3;
constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> normal(std::mt19937& g, size_t n, float stddev, bool bf16 = true) {
  std::normal_distribution<float> d(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = bf16 ? round_bf16(d(g)) : d(g);
  return v;
}

LinearWeight dense(Backend& be, const char* name, int64_t out, int64_t in, const std::vector<float>& w) {
  return dense_linear(name, put(be, DType::bf16, {out, in}, w));
}

TEST_F(CudaOps, MoeRouteIdsAndWeights) {
  std::mt19937 g(21);
  // The tiny config's 8 experts top 2, and V4.1's 128 top 3 (4 experts per lane in the selection warp).
  for (const auto& [E, top] :
       {std::pair<int64_t, int64_t>{cfg_.n_routed_experts, cfg_.n_activated_experts}, {128, 3}}) {
    SCOPED_TRACE(testing::Message() << E << " experts, top " << top);
    const int64_t H = cfg_.dim, T = 64;
    const std::vector<float> x = normal(g, static_cast<size_t>(T * H), 1.0f);
    const std::vector<float> gate = normal(g, static_cast<size_t>(E * H), 1.0f / 16.0f);
    const std::vector<float> bias = normal(g, static_cast<size_t>(E), 0.01f, false);
    const RouteParams p{top, static_cast<float>(cfg_.route_scale), static_cast<float>(cfg_.gate_temp),
                        cfg_.norm_topk_prob};
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor ids = be.alloc(DType::i32, {T, top}), w = be.alloc(DType::f32, {T, top});
      be.moe_route(put(be, DType::bf16, {T, H}, x), put(be, DType::bf16, {E, H}, gate),
                   put(be, DType::f32, {E}, bias), p, ids, w);
      return Outs{fetch(be, "route_ids", ids), fetch(be, "route_w", w)};
    });
    const auto ci = cpu[0].as<int32_t>(), gi = gpu[0].as<int32_t>();
    const auto cw = cpu[1].as<float>(), gw = gpu[1].as<float>();
    int64_t clear = 0;
    for (int64_t t = 0; t < T; ++t) {
      // The row's biased scores in double: clear when the top + 1 best are pairwise apart by kClearGap.
      std::vector<double> s(static_cast<size_t>(E));
      for (int64_t e = 0; e < E; ++e) {
        double l = 0;
        for (int64_t i = 0; i < H; ++i)
          l += double(x[static_cast<size_t>(t * H + i)]) * gate[static_cast<size_t>(e * H + i)];
        s[static_cast<size_t>(e)] =
            std::sqrt(std::log1p(std::exp(l / p.gate_temp))) + bias[static_cast<size_t>(e)];
      }
      std::sort(s.begin(), s.end(), std::greater<>());
      bool ok = true;
      for (int64_t c = 0; c < top; ++c)
        ok = ok && s[static_cast<size_t>(c)] - s[static_cast<size_t>(c + 1)] > kClearGap;
      if (!ok) continue;
      ++clear;
      for (int64_t c = 0; c < top; ++c) {
        const size_t i = static_cast<size_t>(t * top + c);
        EXPECT_EQ(ci[i], gi[i]) << "row " << t << " choice " << c;
        EXPECT_NEAR(cw[i], gw[i], test::kF32 * std::fabs(cw[i])) << "row " << t << " choice " << c;
      }
    }
    EXPECT_GE(clear, T * 9 / 10) << "too few clear rows: the comparison would prove little";
  }
}

TEST_F(CudaOps, MoeExpertsRoutedPlusSharedWithClamps) {
  std::mt19937 g(22);
  const int64_t H = cfg_.dim, E = cfg_.n_routed_experts;
  ASSERT_EQ(cfg_.n_activated_experts, 2) << "moe_inputs draws two experts per row";
  const test::MoeInputs in = test::moe_inputs(g, T_, H, E);
  // I = 512 and a tp shard's 384 take the tensor-core path (multiples of 32); 200 the scalar one.
  for (const int64_t I : {cfg_.moe_inter_dim, int64_t{384}, int64_t{200}}) {
    SCOPED_TRACE(testing::Message() << "I = " << I);
    std::vector<std::vector<float>> mats;  // per expert (E routed, then shared): w1, w3, w2
    for (int64_t e = 0; e <= E; ++e) {
      mats.push_back(normal(g, static_cast<size_t>(I * H), 1.0f / 16.0f));
      mats.push_back(normal(g, static_cast<size_t>(I * H), 1.0f / 16.0f));
      mats.push_back(normal(g, static_cast<size_t>(H * I), 1.0f / std::sqrt(float(I))));
    }
    auto [cpu, gpu] = run([&](Backend& be) {
      StageWeights st;
      for (int64_t e = 0; e <= E; ++e) {
        const size_t m = static_cast<size_t>(3 * e);
        ExpertWeights ew{dense(be, "w1", I, H, mats[m]), dense(be, "w3", I, H, mats[m + 1]),
                         dense(be, "w2", H, I, mats[m + 2])};
        if (e < E)
          st.experts.push_back(std::move(ew));
        else
          st.shared = std::move(ew);
      }
      return test::run_moe_experts(be, st, in, T_, H, static_cast<float>(cfg_.swiglu_limit));
    });
    for (size_t i = 0; i < cpu.size(); ++i) test::expect_near_scale(cpu[i], gpu[i], test::kChained);
  }
}

TEST_F(CudaOps, MoeRoutedExpertsWithTheLargestExpertCountAndItsLastExpert) {
  // E = kMaxExperts (256): expert 255 is the last unit of the grouping (its pairs end the table), chosen by
  // three of four rows; a small H and I (multiples of 32: the tensor-core path).
  std::mt19937 g(24);
  const int64_t E = 256, H = 64, I = 32, T = 4, top = 2;
  const std::vector<int32_t> ids = {255, 0, /**/ 3, 255, /**/ 255, 128, /**/ 7, 0};
  const std::vector<float> w = {0.5f, 1.25f, 0.75f, 1.0f, 2.0f, 0.25f, 1.5f, 0.5f};
  const std::vector<float> x = normal(g, static_cast<size_t>(T * H), 1.0f);
  std::vector<std::vector<float>> mats;  // per routed expert: w1, w3, w2
  for (int64_t e = 0; e < E; ++e) {
    mats.push_back(normal(g, static_cast<size_t>(I * H), 1.0f / 8.0f));
    mats.push_back(normal(g, static_cast<size_t>(I * H), 1.0f / 8.0f));
    mats.push_back(normal(g, static_cast<size_t>(H * I), 1.0f / std::sqrt(float(I))));
  }
  auto [cpu, gpu] = run([&](Backend& be) {
    StageWeights st;
    for (int64_t e = 0; e < E; ++e) {
      const size_t m = static_cast<size_t>(3 * e);
      st.experts.push_back(ExpertWeights{dense(be, "w1", I, H, mats[m]), dense(be, "w3", I, H, mats[m + 1]),
                                         dense(be, "w2", H, I, mats[m + 2])});
    }
    const Tensor it = put_i32(be, {T, top}, ids);
    Tensor routed = be.alloc(DType::f32, {T, top, H}), out = be.alloc(DType::f32, {T, H});
    be.moe_routed_experts(put(be, DType::bf16, {T, H}, x), {}, it, put(be, DType::f32, {T, top}, w), st,
                          static_cast<float>(cfg_.swiglu_limit), routed);
    be.moe_combine(it, routed, put(be, DType::f32, {T, H}, std::vector<float>(T * H, 0.0f)), E, out);
    return Outs{fetch(be, "moe_routed_experts", routed), fetch(be, "moe_combine", out)};
  });
  for (size_t i = 0; i < cpu.size(); ++i) test::expect_near_scale(cpu[i], gpu[i], test::kChained);
}

TEST_F(CudaOps, MoeCombineAddsInAscendingIdThenSharedSkippingBadIds) {
  // The CPU test's hand case (test_cpu_moe_head.cpp): 0.5 only in ascending id order, bad ids skipped; and
  // the same rows over H = 3 outputs to cover more than one output per row.
  const std::vector<int32_t> ids = {5, 1, 3, /**/ 2, -1, 7};
  for (const int64_t H : {int64_t{1}, int64_t{3}}) {
    std::vector<float> y, shared;
    for (const float v : {-1e8f, 1e8f, 1.0f, 0.25f, 1000.0f, 1000.0f}) y.insert(y.end(), H, v);
    for (const float v : {0.5f, -2.0f}) shared.insert(shared.end(), H, v);
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor out = be.alloc(DType::f32, {2, H});
      be.moe_combine(put_i32(be, {2, 3}, ids), put(be, DType::f32, {2, 3, H}, y),
                     put(be, DType::f32, {2, H}, shared), 6, out);
      return Outs{fetch(be, "moe_combine", out)};
    });
    std::vector<float> o(static_cast<size_t>(2 * H));
    std::memcpy(o.data(), gpu[0].bytes.data(), o.size() * sizeof(float));
    for (int64_t i = 0; i < H; ++i) {
      EXPECT_EQ(o[static_cast<size_t>(i)], 0.5f) << i;
      EXPECT_EQ(o[static_cast<size_t>(H + i)], -1.75f) << i;
    }
    test::expect_same_bits(cpu[0], gpu[0]);
  }
}

// Sampling fields (i32 [B, kSampleFields]) for temperatures tau[b] (0: greedy) and seeds seed0 + b.
std::vector<int32_t> sampling_of(const std::vector<float>& tau, uint64_t seed0) {
  std::vector<int32_t> f(tau.size() * kSampleFields, 0);
  for (size_t b = 0; b < tau.size(); ++b) {
    const uint64_t seed = seed0 + b;
    f[b * kSampleFields + kSampleTemperature] = std::bit_cast<int32_t>(tau[b]);
    f[b * kSampleFields + kSampleSeedLow] = static_cast<int32_t>(static_cast<uint32_t>(seed));
    f[b * kSampleFields + kSampleSeedHigh] = static_cast<int32_t>(static_cast<uint32_t>(seed >> 32));
  }
  return f;
}

// A GPU record against the CPU's over the same values: the top-2 and the draw's scores within fp32 rounding
// of their sums, the ids where the values do not nearly tie, the normaliser's sum within relative rounding.
void expect_record_near(const MarkovRecord& want, const MarkovRecord& got, int64_t offset, int64_t Vr) {
  const double tol = test::kF32 * std::max(1.0f, std::fabs(want.best));
  EXPECT_NEAR(got.best, want.best, tol);
  EXPECT_NEAR(got.second, want.second, tol);
  if (want.best - want.second > kClearGap) {
    EXPECT_EQ(got.index, want.index);
  }
  EXPECT_GE(got.index, offset);
  EXPECT_LT(got.index, offset + Vr);
  EXPECT_EQ(got.sample_index >= 0, want.sample_index >= 0);
  if (want.sample_index < 0) return;
  const double ztol = test::kF32 * std::max(1.0f, std::fabs(want.z_max));
  EXPECT_EQ(got.sample_index, want.sample_index);  // a near-tie of the perturbed scores has odds ~1e-5
  EXPECT_NEAR(got.score, want.score, ztol);
  EXPECT_NEAR(got.z, want.z, ztol);
  EXPECT_NEAR(got.z_max, want.z_max, ztol);
  EXPECT_NEAR(got.z_sum, want.z_sum, 1e-4 * want.z_sum);
  EXPECT_NEAR(drafted_probability(got), drafted_probability(want), 1e-4 * drafted_probability(want) + 1e-7);
}

TEST_F(CudaOps, MarkovTop2WholeVocabularyAndASliceAtAnOffset) {
  std::mt19937 g(23);
  const int64_t V = cfg_.vocab_size, R = cfg_.markov_rank, k = cfg_.block_size;
  const std::vector<float> embed = normal(g, static_cast<size_t>(V * R), 1.0f);
  const std::vector<int32_t> prev = {5, 1000, 333};
  const std::vector<int32_t> req = {0, 0, 10, 5, /**/ 1, 0, 20, 2, /**/ 2, 0, 30, 4};
  const std::vector<int32_t> sampling = sampling_of({0.0f, 0.7f, 1.3f}, 90);  // request 0 greedy
  for (const auto& [Vr, offset] : {std::pair<int64_t, int64_t>{V, 0}, {768, 256}}) {
    SCOPED_TRACE(testing::Message() << "columns " << offset << " + " << Vr);
    const std::vector<float> logits = normal(g, static_cast<size_t>(T_ * Vr), 1.0f, false);
    const std::vector<float> head = normal(g, static_cast<size_t>(Vr * R), 1.0f / std::sqrt(float(R)));
    for (int64_t j = 0; j < k; ++j) {
      SCOPED_TRACE(testing::Message() << "j " << j);
      auto [cpu, gpu] = run([&](Backend& be) {
        Tensor cand = be.alloc(DType::i32, {B_, kMarkovRecordWords});
        be.markov_top2(put(be, DType::f32, {T_, Vr}, logits), put(be, DType::bf16, {Vr, R}, head), Tensor{},
                       put(be, DType::bf16, {V, R}, embed), put_i32(be, {B_}, prev),
                       put_i32(be, {B_, kReqFields}, req), put_i32(be, {B_, kSampleFields}, sampling), j, k,
                       offset, MarkovCache{}, cand);
        return Outs{fetch(be, "cand", cand)};
      });
      const auto c = cpu[0].as<MarkovRecord>(), q = gpu[0].as<MarkovRecord>();
      for (int64_t b = 0; b < B_; ++b) {
        const MarkovRecord &want = c[static_cast<size_t>(b)], &got = q[static_cast<size_t>(b)];
        if (j >= req[static_cast<size_t>(b * kReqFields + kReqOutputs)]) {
          EXPECT_EQ(got.best, -kInf) << b;
          EXPECT_EQ(got.second, -kInf) << b;
          EXPECT_EQ(got.index, 0) << b;
          EXPECT_EQ(got.sample_index, -1) << b;
          continue;
        }
        SCOPED_TRACE(b);
        expect_record_near(want, got, offset, Vr);
      }
    }
  }
}

// Markov inputs at V4.1's rank (R = 256): 12 requests (two groups of 8, the second partial), Vr columns, and
// every fourth request with k' = 2, so inactive at position j = 2.
struct MarkovInputs {
  static constexpr int64_t V = 1024, R = 256, k = 5, B = 12, j = 2;
  int64_t Vr;
  std::vector<float> embed, head, logits;
  std::vector<int32_t> prev, req;
  std::vector<float> tau;
  std::vector<int32_t> sampling;
};

MarkovInputs markov_inputs(int64_t Vr, uint32_t seed) {
  using M = MarkovInputs;
  std::mt19937 g(seed);
  MarkovInputs in{Vr,
                  normal(g, static_cast<size_t>(M::V * M::R), 1.0f),
                  normal(g, static_cast<size_t>(Vr * M::R), 1.0f / std::sqrt(float(M::R))),
                  normal(g, static_cast<size_t>(M::B * M::k * Vr), 1.0f, false),
                  {},
                  {},
                  {},
                  {}};
  for (int64_t b = 0; b < M::B; ++b) {
    in.prev.push_back(static_cast<int32_t>(g() % M::V));
    in.req.insert(in.req.end(), {static_cast<int32_t>(b), 0, 10, b % 4 == 3 ? 2 : 5});
    in.tau.push_back(b % 3 == 0 ? 0.0f : 0.5f * static_cast<float>(b % 3));  // greedy and draws in each pass
  }
  in.sampling = sampling_of(in.tau, seed);
  return in;
}

TEST_F(CudaOps, MarkovTop2AtV41RankWithTwoRequestPasses) {
  // 1000 columns: a partial last tile.
  const MarkovInputs in = markov_inputs(1000, 24);
  const int64_t V = in.V, R = in.R, k = in.k, B = in.B, Vr = in.Vr, j = in.j;
  const std::vector<float>&embed = in.embed, &head = in.head, &logits = in.logits;
  const std::vector<int32_t>&prev = in.prev, &req = in.req;
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor cand = be.alloc(DType::i32, {B, kMarkovRecordWords});
    be.markov_top2(put(be, DType::f32, {B * k, Vr}, logits), put(be, DType::bf16, {Vr, R}, head), Tensor{},
                   put(be, DType::bf16, {V, R}, embed), put_i32(be, {B}, prev),
                   put_i32(be, {B, kReqFields}, req), put_i32(be, {B, kSampleFields}, in.sampling), j, k, 0,
                   MarkovCache{}, cand);
    return Outs{fetch(be, "cand", cand)};
  });
  const auto c = cpu[0].as<MarkovRecord>(), q = gpu[0].as<MarkovRecord>();
  for (int64_t b = 0; b < B; ++b) {
    SCOPED_TRACE(b);
    const MarkovRecord &want = c[static_cast<size_t>(b)], &got = q[static_cast<size_t>(b)];
    if (b % 4 == 3) {
      EXPECT_EQ(got.best, -kInf);
      EXPECT_EQ(got.index, 0);
      EXPECT_EQ(got.sample_index, -1);
      continue;
    }
    expect_record_near(want, got, 0, Vr);
  }
}

TEST_F(CudaOps, MarkovHeadFromMmaTilesGivesTheRowMajorBits) {
  // prepare_weights copies markov_head into mma tiles (the CPU reference makes none); markov_top2 reading the
  // copy gives the row-major kernel's bits. 1008 columns: the last block's last warp holds a tile past the
  // vocabulary. The row-major matrix passed as the "tiles" must change the answer: the copy is what the
  // kernel reads.
  const MarkovInputs in = markov_inputs(1008, 25);
  const int64_t V = in.V, R = in.R, k = in.k, B = in.B, Vr = in.Vr, j = in.j;
  const std::vector<float>&embed = in.embed, &head = in.head, &logits = in.logits;
  const std::vector<int32_t>&prev = in.prev, &req = in.req;
  enum class Layout { rows, tiles, rows_as_tiles };
  const auto top2 = [&](Layout layout) {
    DrafterWeights w;
    w.markov_head = put(*gpu_, DType::bf16, {Vr, R}, head);
    gpu_->prepare_weights(w);
    EXPECT_FALSE(w.markov_head_tiles.empty());
    const Tensor tiles = layout == Layout::rows    ? Tensor{}
                         : layout == Layout::tiles ? w.markov_head_tiles
                                                   : w.markov_head;
    Tensor cand = gpu_->alloc(DType::i32, {B, kMarkovRecordWords});
    gpu_->markov_top2(put(*gpu_, DType::f32, {B * k, Vr}, logits), w.markov_head, tiles,
                      put(*gpu_, DType::bf16, {V, R}, embed), put_i32(*gpu_, {B}, prev),
                      put_i32(*gpu_, {B, kReqFields}, req), put_i32(*gpu_, {B, kSampleFields}, in.sampling),
                      j, k, 0, MarkovCache{}, cand);
    return fetch(*gpu_, "cand", cand);
  };
  const test::Out rows = top2(Layout::rows);
  test::expect_same_bits(rows, top2(Layout::tiles));
  EXPECT_NE(rows.bytes, top2(Layout::rows_as_tiles).bytes);

  DrafterWeights on_cpu;
  on_cpu.markov_head = put(cpu_, DType::bf16, {Vr, R}, head);
  cpu_.prepare_weights(on_cpu);
  EXPECT_TRUE(on_cpu.markov_head_tiles.empty());
}
TEST_F(CudaOps, MarkovCacheRowsGiveTheComputedPathsBits) {
  // The bias rows of 40 tokens (two launches of 32) from markov_bias_rows; markov_top2 with them (a mix of
  // cached and computed requests, then every request cached: no markov_head read) gives the bits of the
  // computed path, from rows, from the tiled copy and from an f32 head (the scalar kernel). The rows match
  // the CPU's within fp32 rounding.
  const MarkovInputs in = markov_inputs(1008, 26);
  const int64_t V = in.V, R = in.R, k = in.k, B = in.B, Vr = in.Vr, j = in.j;
  std::vector<int32_t> tokens;
  for (int32_t t = 0; t < 40; ++t) tokens.push_back((t * 37 + 5) % static_cast<int32_t>(V));
  std::vector<int32_t> slot(static_cast<size_t>(V), -1);
  for (size_t i = 0; i < tokens.size(); ++i) slot[static_cast<size_t>(tokens[i])] = static_cast<int32_t>(i);
  std::vector<int32_t> some = in.prev, every = in.prev;
  for (size_t b = 0; b < some.size(); ++b) {
    if (b % 3 == 0) some[b] = tokens[b];
    every[b] = tokens[(b * 7) % tokens.size()];
  }
  enum class Layout { rows, tiles, f32 };
  std::vector<float> cpu_rows;
  {
    Tensor out = cpu_.alloc(DType::f32, {static_cast<int64_t>(tokens.size()), Vr});
    cpu_.markov_bias_rows(put(cpu_, DType::bf16, {Vr, R}, in.head), Tensor{},
                          put(cpu_, DType::bf16, {V, R}, in.embed),
                          put_i32(cpu_, {static_cast<int64_t>(tokens.size())}, tokens), out);
    cpu_rows.assign(out.as<float>(), out.as<float>() + out.numel());
  }
  for (const Layout layout : {Layout::rows, Layout::tiles, Layout::f32}) {
    SCOPED_TRACE(static_cast<int>(layout));
    DrafterWeights w;
    w.markov_head = put(*gpu_, layout == Layout::f32 ? DType::f32 : DType::bf16, {Vr, R}, in.head);
    if (layout == Layout::tiles) gpu_->prepare_weights(w);
    const Tensor tiles = layout == Layout::tiles ? w.markov_head_tiles : Tensor{};
    const Tensor embed = put(*gpu_, DType::bf16, {V, R}, in.embed);
    MarkovCache cache{gpu_->alloc(DType::f32, {static_cast<int64_t>(tokens.size()), Vr}),
                      put_i32(*gpu_, {V}, slot)};
    gpu_->markov_bias_rows(w.markov_head, tiles, embed,
                           put_i32(*gpu_, {static_cast<int64_t>(tokens.size())}, tokens), cache.rows);
    const test::Out rows = fetch(*gpu_, "bias rows", cache.rows);
    const auto got = rows.as<float>();
    for (size_t i = 0; i < cpu_rows.size(); ++i)
      ASSERT_NEAR(got[i], cpu_rows[i], test::kF32 * std::max(1.0f, std::fabs(cpu_rows[i]))) << i;
    for (const std::vector<int32_t>* prev : {&some, &every}) {
      const auto top2 = [&](const MarkovCache& c) {
        Tensor cand = gpu_->alloc(DType::i32, {B, kMarkovRecordWords});
        gpu_->markov_top2(put(*gpu_, DType::f32, {B * k, Vr}, in.logits), w.markov_head, tiles, embed,
                          put_i32(*gpu_, {B}, *prev), put_i32(*gpu_, {B, kReqFields}, in.req),
                          put_i32(*gpu_, {B, kSampleFields}, in.sampling), j, k, 0, c, cand);
        return fetch(*gpu_, "cand", cand);
      };
      test::expect_same_bits(top2(MarkovCache{}), top2(cache));
    }
  }
}

TEST_F(CudaOps, MarkovCommitWritesOnlyActiveRequests) {
  const int64_t k = cfg_.block_size;
  // A greedy record, a drawn one (token 9, not its argmax 7) and one past its k'.
  const std::vector<MarkovRecord> cand = {{2.5f, 1.0f, 104, -1, 0.0f, 0.0f, 0.0f, 0.0f},
                                          {0.75f, 0.5f, 7, 9, 1.5f, 0.25f, 0.75f, 3.0f},
                                          {-kInf, -kInf, 0, -1, -kInf, 0.0f, 0.0f, 0.0f}};
  const std::vector<int32_t> req = {0, 0, 10, 2, /**/ 1, 0, 20, 1, /**/ 2, 0, 30, 0};
  for (const int64_t j : {int64_t{0}, int64_t{1}}) {
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor c = be.alloc(DType::i32, {B_, kMarkovRecordWords});
      be.upload(c, cand.data());
      Tensor prev = put_i32(be, {B_}, {11, 22, 33});
      const auto filled = [&](Shape s) {
        const int64_t n = s[0] * s[1] * (s.size() > 2 ? s[2] : 1);
        return put(be, DType::f32, s, std::vector<float>(static_cast<size_t>(n), -9.0f));
      };
      const MarkovOutputs out{be.alloc(DType::i32, {B_, k}), filled({B_, k}), filled({B_, k}),
                              filled({B_, k, 2})};
      be.fill_i32(out.ids, -7);
      be.markov_commit(c, put_i32(be, {B_, kReqFields}, req), j, prev, out);
      return Outs{fetch(be, "ids", out.ids), fetch(be, "margin", out.margin), fetch(be, "q", out.q),
                  fetch(be, "norm", out.norm), fetch(be, "prev", prev)};
    });
    // q is expf(z - z_max) / z_sum on both (the device's expf may round the last bit differently).
    for (size_t i = 0; i < cpu.size(); ++i)
      if (cpu[i].name == "q")
        test::expect_near_scale(cpu[i], gpu[i], test::kF32);
      else
        test::expect_same_bits(cpu[i], gpu[i]);
    EXPECT_EQ(gpu[0].as<int32_t>()[static_cast<size_t>(k)], j == 0 ? 9 : -7);  // request 1 drafts its draw
  }
}

// The whole distribution of sampled positions against the CPU's, from the same logits, bias rows and
// normalisers, at a vocabulary offset (the other columns 0).
TEST_F(CudaOps, DraftDistributionMatchesTheCpu) {
  std::mt19937 g(27);
  const int64_t V = 3000, Vr = 1000, offset = 1024, k = 5, B = 2;
  const std::vector<float> logits = normal(g, static_cast<size_t>(B * k * Vr), 1.0f, false);
  const std::vector<float> bias = normal(g, static_cast<size_t>(3 * Vr), 1.0f, false);
  const std::vector<int32_t> rows = {5, 6, 9}, sampling = sampling_of({0.0f, 0.8f}, 3);
  std::vector<float> norm(static_cast<size_t>(B * k * 2), 0.0f);
  for (size_t i = 0; i < rows.size(); ++i) {
    const int32_t t = rows[i];
    float z_max = -kInf, sum = 0.0f;
    for (int64_t c = 0; c < Vr; ++c)
      z_max = std::max(z_max, (logits[static_cast<size_t>(t * Vr + c)] + bias[i * Vr + c]) / 0.8f);
    for (int64_t c = 0; c < Vr; ++c)
      sum += std::exp((logits[static_cast<size_t>(t * Vr + c)] + bias[i * Vr + c]) / 0.8f - z_max);
    norm[static_cast<size_t>(t * 2)] = z_max;
    norm[static_cast<size_t>(t * 2 + 1)] = sum;
  }
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor out = put(be, DType::f32, {3, V}, std::vector<float>(static_cast<size_t>(3 * V), -1.0f));
    be.draft_distribution(put(be, DType::f32, {B * k, Vr}, logits), put(be, DType::f32, {3, Vr}, bias),
                          put_i32(be, {3}, rows), put_i32(be, {B, kSampleFields}, sampling),
                          put(be, DType::f32, {B, k, 2}, norm), k, offset, out);
    return Outs{fetch(be, "q", out)};
  });
  test::expect_near_scale(cpu[0], gpu[0], test::kF32);
  const std::vector<float> q = gpu[0].values();
  for (int64_t i = 0; i < 3; ++i) {
    double total = 0.0;
    for (int64_t v = 0; v < V; ++v) {
      const float x = q[static_cast<size_t>(i * V + v)];
      total += x;
      if (v < offset || v >= offset + Vr) {
        EXPECT_EQ(x, 0.0f) << i << " " << v;
      }
    }
    EXPECT_NEAR(total, 1.0, 1e-4) << i;
  }
}

TEST_F(CudaOps, ConfidenceHead) {
  std::mt19937 g(24);
  const int64_t H = cfg_.dim, V = cfg_.vocab_size, R = cfg_.markov_rank, k = cfg_.block_size;
  const std::vector<float> h = normal(g, static_cast<size_t>(T_ * H), 1.0f);
  const std::vector<float> embed = normal(g, static_cast<size_t>(V * R), 1.0f);
  const std::vector<float> proj = normal(g, static_cast<size_t>(H + R), 1.0f / std::sqrt(float(H + R)));
  std::vector<int32_t> ids(static_cast<size_t>(B_ * k));
  for (int32_t& id : ids) id = static_cast<int32_t>(g() % V);
  const std::vector<int32_t> anchor = {3, 900, 512}, req = {0, 0, 10, 5, /**/ 1, 0, 20, 3, /**/ 2, 0, 30, 1};
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor conf = put(be, DType::f32, {B_, k}, std::vector<float>(static_cast<size_t>(B_ * k), 7.0f));
    Tensor logit = put(be, DType::f32, {B_, k}, std::vector<float>(static_cast<size_t>(B_ * k), 7.0f));
    be.confidence(put(be, DType::bf16, {T_, H}, h), put(be, DType::bf16, {V, R}, embed),
                  put(be, DType::bf16, {1, H + R}, proj), put_i32(be, {B_}, anchor),
                  put_i32(be, {B_, k}, ids), put_i32(be, {B_, kReqFields}, req), k, conf, logit);
    return Outs{fetch(be, "conf", conf), fetch(be, "conf_logit", logit)};
  });
  for (size_t i = 0; i < cpu.size(); ++i) {
    test::expect_near_scale(cpu[i], gpu[i], test::kF32);
    const std::vector<float> want = cpu[i].values(), got = gpu[i].values();
    for (size_t n = 0; n < want.size(); ++n)
      if (want[n] == 0.0f) {
        EXPECT_EQ(got[n], 0.0f) << cpu[i].name << " [" << n << "] past k'";
      }
  }
}

}  // namespace
}  // namespace dspark
