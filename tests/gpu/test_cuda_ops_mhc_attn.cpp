// CudaBackend against CpuBackend: the mHC ops (hc = 4 copies of H = 256), the KV rings (4 slots of W = 16
// rows of d = 128) and the stage attention (3 requests of k = 5 queries, 8 heads). Tolerances:
// cuda_op_harness.hpp; hc_mixes below.
#include <random>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/launch_common.hpp"
#include "tests/gpu/cuda_op_harness.hpp"

namespace dspark {
namespace {

using test::fetch;
using test::Outs;
using test::put;
using test::put_i32;
using CudaOps = test::CudaOps;

// hc_mixes is fp32 end to end, but its 24 dot products of 4H = 1024 terms go through a softmax and 20
// Sinkhorn rounds: a reordered sum moves a coefficient by ~1e-6 relative; 5e-4 of the scale still catches a
// missing round (which moves the coefficients by ~1e-2).
constexpr double kMix = 5e-4;

std::vector<float> normal(std::mt19937& g, size_t n, float stddev, float mean = 0.0f, bool bf16 = true) {
  std::normal_distribution<float> d(mean, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = bf16 ? round_bf16(d(g)) : d(g);
  return v;
}

std::vector<float> uniform(std::mt19937& g, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

// The element-wise mHC kernels run a block per (token, 256 channels): the tiny width (one block per token)
// and V4.1's 5120 (20).
constexpr int64_t kWideH = 5120;

TEST_F(CudaOps, HcReplicateCopiesExactly) {
  std::mt19937 g(11);
  const int64_t hc = cfg_.hc_mult;
  for (const int64_t H : {cfg_.dim, kWideH}) {
    SCOPED_TRACE(H);
    const std::vector<float> x = normal(g, static_cast<size_t>(T_ * H), 1.0f);
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor X = be.alloc(DType::bf16, {T_, hc, H});
      be.hc_replicate(put(be, DType::bf16, {T_, H}, x), X);
      return Outs{fetch(be, "hc_replicate", X)};
    });
    test::expect_same_bits(cpu[0], gpu[0]);
  }
}

TEST_F(CudaOps, HcMixesWithSinkhorn) {
  std::mt19937 g(12);
  const int64_t H = cfg_.dim, hc = cfg_.hc_mult, nmix = cfg_.hc_mix_dim(), n = hc * H;
  const std::vector<float> X = normal(g, static_cast<size_t>(T_ * n), 1.0f);
  const std::vector<float> fn =
      normal(g, static_cast<size_t>(nmix * n), 1.0f / std::sqrt(float(n)), 0, false);
  const std::vector<float> base = normal(g, static_cast<size_t>(nmix), 0.1f, 0, false);
  const std::vector<float> scale = normal(g, 3, 0.1f, 1.0f, false);
  const MixParams p{static_cast<float>(cfg_.norm_eps), static_cast<float>(cfg_.hc_eps),
                    cfg_.hc_sinkhorn_iters};
  auto [cpu, gpu] = run([&](Backend& be) {
    const HcMixWeights w{put(be, DType::f32, {nmix, n}, fn), put(be, DType::f32, {nmix}, base),
                         put(be, DType::f32, {3}, scale)};
    Tensor pre = be.alloc(DType::f32, {T_, hc}), post = be.alloc(DType::f32, {T_, hc});
    Tensor comb = be.alloc(DType::f32, {T_, hc, hc});
    be.hc_mixes(put(be, DType::bf16, {T_, hc, H}, X), w, p, pre, post, comb);
    return Outs{fetch(be, "pre", pre), fetch(be, "post", post), fetch(be, "comb", comb)};
  });
  for (size_t i = 0; i < cpu.size(); ++i) test::expect_near_scale(cpu[i], gpu[i], kMix);
}

TEST_F(CudaOps, HcCollapseAndExpand) {
  std::mt19937 g(13);
  const int64_t hc = cfg_.hc_mult;
  for (const int64_t H : {cfg_.dim, kWideH}) {
    SCOPED_TRACE(H);
    const std::vector<float> X = normal(g, static_cast<size_t>(T_ * hc * H), 1.0f);
    const std::vector<float> y = normal(g, static_cast<size_t>(T_ * H), 1.0f);
    const std::vector<float> pre = uniform(g, static_cast<size_t>(T_ * hc), 0.0f, 1.0f);
    const std::vector<float> post = uniform(g, static_cast<size_t>(T_ * hc), 0.0f, 2.0f);
    const std::vector<float> comb = uniform(g, static_cast<size_t>(T_ * hc * hc), 0.0f, 0.5f);
    auto [cpu, gpu] = run([&](Backend& be) {
      Tensor Xt = put(be, DType::bf16, {T_, hc, H}, X), out = be.alloc(DType::bf16, {T_, H});
      be.hc_collapse(Xt, put(be, DType::f32, {T_, hc}, pre), out);
      be.hc_expand(put(be, DType::bf16, {T_, H}, y), Xt, put(be, DType::f32, {T_, hc}, post),
                   put(be, DType::f32, {T_, hc, hc}, comb));
      return Outs{fetch(be, "hc_collapse", out), fetch(be, "hc_expand", Xt)};
    });
    for (size_t i = 0; i < cpu.size(); ++i) test::expect_near_scale(cpu[i], gpu[i], test::kOneRounding);
  }
}

TEST_F(CudaOps, FusedConvertExpandEqualsTheTwoOpsBitForBit) {
  // convert_hc_expand rounds the f32 sum as convert does, stores it and expands with it: the same bits (y and
  // X) as convert then hc_expand on the GPU, and bit-identical to the CPU (element-wise, no sums in another
  // order).
  std::mt19937 g(18);
  const int64_t hc = cfg_.hc_mult;
  for (const int64_t H : {cfg_.dim, kWideH}) {
    SCOPED_TRACE(H);
    const std::vector<float> X = normal(g, static_cast<size_t>(T_ * hc * H), 1.0f);
    const std::vector<float> sum = normal(g, static_cast<size_t>(T_ * H), 1.0f, 0, false);
    const std::vector<float> post = uniform(g, static_cast<size_t>(T_ * hc), 0.0f, 2.0f);
    const std::vector<float> comb = uniform(g, static_cast<size_t>(T_ * hc * hc), 0.0f, 0.5f);
    const auto run_op = [&](Backend& be, bool fused) {
      Tensor Xt = put(be, DType::bf16, {T_, hc, H}, X), y = be.alloc(DType::bf16, {T_, H});
      const Tensor ts = put(be, DType::f32, {T_, H}, sum), tp = put(be, DType::f32, {T_, hc}, post);
      const Tensor tc = put(be, DType::f32, {T_, hc, hc}, comb);
      if (fused) {
        be.convert_hc_expand(ts, y, Xt, tp, tc);
      } else {
        be.convert(ts, y);
        be.hc_expand(y, Xt, tp, tc);
      }
      return Outs{fetch(be, "y", y), fetch(be, "X", Xt)};
    };
    const Outs a = run_op(*gpu_, false), b = run_op(*gpu_, true), want = run_op(cpu_, true);
    for (size_t i = 0; i < a.size(); ++i) {
      test::expect_same_bits(a[i], b[i]);
      test::expect_near_scale(want[i], b[i], test::kOneRounding);
    }
  }
}

TEST_F(CudaOps, FusedCollapseNormEqualsTheTwoOpsBitForBit) {
  // hc_collapse_norm repeats hc_collapse's and rms_norm's arithmetic and reduction shapes: the same bits as
  // the two GPU ops in turn (tiny width and V4.1's), and the separate ops' tolerance against the CPU.
  std::mt19937 g(14);
  const int64_t hc = cfg_.hc_mult;
  for (const int64_t H : {cfg_.dim, kWideH}) {
    SCOPED_TRACE(H);
    const std::vector<float> X = normal(g, static_cast<size_t>(T_ * hc * H), 1.0f);
    const std::vector<float> pre = uniform(g, static_cast<size_t>(T_ * hc), 0.0f, 1.0f);
    const std::vector<float> w = normal(g, static_cast<size_t>(H), 0.02f, 1.0f);
    const float eps = static_cast<float>(cfg_.norm_eps);
    const auto fused = [&](Backend& be) {
      Tensor c = be.alloc(DType::bf16, {T_, H}), n = be.alloc(DType::bf16, {T_, H});
      be.hc_collapse_norm(put(be, DType::bf16, {T_, hc, H}, X), put(be, DType::f32, {T_, hc}, pre),
                          put(be, DType::bf16, {H}, w), eps, c, n);
      return Outs{fetch(be, "collapsed", c), fetch(be, "normed", n)};
    };
    const auto separate = [&](Backend& be) {
      Tensor c = be.alloc(DType::bf16, {T_, H}), n = be.alloc(DType::bf16, {T_, H});
      be.hc_collapse(put(be, DType::bf16, {T_, hc, H}, X), put(be, DType::f32, {T_, hc}, pre), c);
      be.rms_norm(c, put(be, DType::bf16, {H}, w), eps, n);
      return Outs{fetch(be, "collapsed", c), fetch(be, "normed", n)};
    };
    const Outs a = separate(*gpu_), b = fused(*gpu_), want = fused(cpu_);
    for (size_t i = 0; i < a.size(); ++i) {
      test::expect_same_bits(a[i], b[i]);
      test::expect_near_scale(want[i], b[i], test::kOneRounding);
    }
  }
}

TEST_F(CudaOps, RingWriteLaterRowWinsAndClearIsPerSlot) {
  std::mt19937 g(14);
  const int64_t slots = 4, W = cfg_.window_size, d = cfg_.head_dim, N = 40;
  // Row n goes to slot n % 4 at position n: positions p and p + 16 of a slot share an entry, the later wins.
  // Every 7th row is padding (slot -1): written nowhere, and it does not hide an earlier row of its entry.
  std::vector<int32_t> slot(N), pos(N);
  for (int32_t n = 0; n < N; ++n)
    slot[static_cast<size_t>(n)] = n % 7 == 6 ? -1 : n % 4, pos[static_cast<size_t>(n)] = n;
  const std::vector<float> kv = normal(g, static_cast<size_t>(N * d), 1.0f);
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor ring_kv = be.alloc(DType::bf16, {slots, W, d}), ring_pos = be.alloc(DType::i32, {slots, W});
    be.zero(ring_kv);
    be.fill_i32(ring_pos, -1);
    be.ring_write(ring_kv, ring_pos, put(be, DType::bf16, {N, d}, kv), put_i32(be, {N}, slot),
                  put_i32(be, {N}, pos));
    Outs o{fetch(be, "ring_kv", ring_kv), fetch(be, "ring_pos", ring_pos)};
    be.ring_clear(ring_pos, 2);
    o.push_back(fetch(be, "ring_pos after clear", ring_pos));
    return o;
  });
  for (size_t i = 0; i < cpu.size(); ++i) test::expect_same_bits(cpu[i], gpu[i]);
}

TEST_F(CudaOps, AttentionOverRingWindowAndBlock) {
  std::mt19937 g(15);
  const int64_t heads = cfg_.n_heads, d = cfg_.head_dim, k = cfg_.block_size, W = cfg_.window_size, slots = 4;
  // Slot 0: a full window (P 36, positions 20..35). Slot 1: 7 rows, the rest empty (P 7). Slot 2: positions
  // 24..39 except entry 8, which holds 40 (>= P), with the window's low end raised to 30 (P 40). Slot 3:
  // unused.
  std::vector<int32_t> ring_pos(static_cast<size_t>(slots * W), -1);
  for (int32_t p = 20; p < 36; ++p) ring_pos[static_cast<size_t>(0 * W + p % W)] = p;
  for (int32_t p = 0; p < 7; ++p) ring_pos[static_cast<size_t>(1 * W + p)] = p;
  for (int32_t p = 24; p < 40; ++p) ring_pos[static_cast<size_t>(2 * W + p % W)] = p;
  ring_pos[static_cast<size_t>(2 * W + 8)] = 40;
  const std::vector<int32_t> req = {0, 20, 36, 5, /**/ 1, 0, 7, 3, /**/ 2, 30, 40, 5};
  const std::vector<float> q = normal(g, static_cast<size_t>(T_ * heads * d), 1.0f);
  const std::vector<float> bkv = normal(g, static_cast<size_t>(T_ * d), 1.0f);
  const std::vector<float> rkv = normal(g, static_cast<size_t>(slots * W * d), 1.0f);
  const std::vector<float> sink = normal(g, static_cast<size_t>(heads), 1.0f, 0, false);
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor out = be.alloc(DType::bf16, {T_, heads, d});
    be.attention(put(be, DType::bf16, {T_, heads, d}, q), put(be, DType::bf16, {T_, d}, bkv),
                 put(be, DType::bf16, {slots, W, d}, rkv), put_i32(be, {slots, W}, ring_pos),
                 put_i32(be, {B_, kReqFields}, req), put(be, DType::f32, {heads}, sink), k, out);
    return Outs{fetch(be, "attention", out)};
  });
  test::expect_near_scale(cpu[0], gpu[0], test::kChained);
}

TEST_F(CudaOps, AttentionAtV41HeadSizeAndWindow) {
  // d = 512 and W = 128 (V4.1's): 2 key blocks of 64 from the ring plus the block rows, 512-wide keys staged
  // in shared memory. Slot 0: a full window (positions 100..227, P 228); slot 1: 70 rows (P 70).
  std::mt19937 g(16);
  const int64_t heads = 4, d = 512, W = 128, k = cfg_.block_size, slots = 2, B = 2, T = B * k;
  std::vector<int32_t> ring_pos(static_cast<size_t>(slots * W), -1);
  for (int32_t p = 100; p < 228; ++p) ring_pos[static_cast<size_t>(p % W)] = p;
  for (int32_t p = 0; p < 70; ++p) ring_pos[static_cast<size_t>(W + p)] = p;
  const std::vector<int32_t> req = {0, 100, 228, 5, /**/ 1, 0, 70, 5};
  const std::vector<float> q = normal(g, static_cast<size_t>(T * heads * d), 0.25f);
  const std::vector<float> bkv = normal(g, static_cast<size_t>(T * d), 1.0f);
  const std::vector<float> rkv = normal(g, static_cast<size_t>(slots * W * d), 1.0f);
  const std::vector<float> sink = normal(g, static_cast<size_t>(heads), 1.0f, 0, false);
  auto [cpu, gpu] = run([&](Backend& be) {
    Tensor out = be.alloc(DType::bf16, {T, heads, d});
    be.attention(put(be, DType::bf16, {T, heads, d}, q), put(be, DType::bf16, {T, d}, bkv),
                 put(be, DType::bf16, {slots, W, d}, rkv), put_i32(be, {slots, W}, ring_pos),
                 put_i32(be, {B, kReqFields}, req), put(be, DType::f32, {heads}, sink), k, out);
    return Outs{fetch(be, "attention", out)};
  });
  test::expect_near_scale(cpu[0], gpu[0], test::kChained);
}

// Attention inputs for `B` requests of k queries: slot b holds `live` ring rows (the last request
// `live_last` when >= 0; positions 0.., the window from 0, anchor position = live), random q / keys / sinks;
// ring rows stored as `ring_t`. rope_dim > 0: attention_inverse_rope at the block positions (anchor + j).
struct AttentionCase {
  int64_t heads, d, W, k, B, live;
  DType ring_t = DType::bf16;
  int64_t live_last = -1, rope_dim = 0;
};

// The case's tensors on a backend, and the op on them into `out`.
struct AttentionInputs {
  AttentionCase c;
  Tensor q, bkv, rkv, ring_pos, req, sink, pos, out;

  void run(Backend& be) const {
    if (c.rope_dim > 0)
      be.attention_inverse_rope(q, bkv, rkv, ring_pos, req, sink, c.k, pos, c.rope_dim, 10000.0, out);
    else
      be.attention(q, bkv, rkv, ring_pos, req, sink, c.k, out);
  }
};

AttentionInputs attention_inputs(Backend& be, const AttentionCase& c, uint32_t seed) {
  std::mt19937 g(seed);
  const int64_t T = c.B * c.k;
  std::vector<int32_t> ring_pos(static_cast<size_t>(c.B * c.W), -1), req, pos;
  for (int64_t b = 0; b < c.B; ++b) {
    const int32_t live = static_cast<int32_t>(b == c.B - 1 && c.live_last >= 0 ? c.live_last : c.live);
    for (int32_t p = 0; p < live; ++p) ring_pos[static_cast<size_t>(b * c.W + p % c.W)] = p;
    req.insert(req.end(), {static_cast<int32_t>(b), 0, live, static_cast<int32_t>(c.k)});
    for (int32_t j = 0; j < c.k; ++j) pos.push_back(live + j);
  }
  const std::vector<float> q = normal(g, static_cast<size_t>(T * c.heads * c.d), 0.25f);
  const std::vector<float> bkv = normal(g, static_cast<size_t>(T * c.d), 1.0f);
  const std::vector<float> rkv = normal(g, static_cast<size_t>(c.B * c.W * c.d), 1.0f);
  const std::vector<float> sink = normal(g, static_cast<size_t>(c.heads), 1.0f, 0, false);
  return AttentionInputs{c,
                         put(be, DType::bf16, {T, c.heads, c.d}, q),
                         put(be, DType::bf16, {T, c.d}, bkv),
                         put(be, c.ring_t, {c.B, c.W, c.d}, rkv),
                         put_i32(be, {c.B, c.W}, ring_pos),
                         put_i32(be, {c.B, kReqFields}, req),
                         put(be, DType::f32, {c.heads}, sink),
                         put_i32(be, {T}, pos),
                         be.alloc(DType::bf16, {T, c.heads, c.d})};
}

Outs attention_outputs(Backend& be, const AttentionCase& c, uint32_t seed) {
  const AttentionInputs in = attention_inputs(be, c, seed);
  in.run(be);
  return Outs{fetch(be, "attention", in.out)};
}

TEST_F(CudaOps, AttentionOnTheTensorCoresAtItsLimits) {
  // The tensor-core kernel's edges: k = 8 queries (the mma's N), d = 16 (one k step) and d = 512 (4 channel
  // tiles per warp), a partial last 16-key step (70 and 133 keys), one key only per request (k = 1, no ring).
  for (const AttentionCase& c : {AttentionCase{4, 512, 128, 8, 2, 125}, AttentionCase{8, 16, 64, 5, 3, 65},
                                 AttentionCase{2, 128, 16, 1, 2, 0}, AttentionCase{4, 512, 128, 5, 1, 128}}) {
    SCOPED_TRACE(testing::Message() << "d " << c.d << " k " << c.k << " live " << c.live);
    test::expect_near_scale(attention_outputs(cpu_, c, 21)[0], attention_outputs(*gpu_, c, 21)[0],
                            test::kChained);
  }
}

TEST_F(CudaOps, AttentionOffTheTensorCorePath) {
  // The CUDA-core kernel: d not a multiple of 16 (bf16, 16-byte rows), fp32 ring rows (element loads), k > 8,
  // and enough (head, request) pairs for whole query groups per block (64 requests x 8 heads).
  for (const AttentionCase& c :
       {AttentionCase{4, 40, 32, 5, 2, 40}, AttentionCase{4, 128, 32, 5, 2, 20, DType::f32},
        AttentionCase{2, 64, 32, 10, 2, 33}, AttentionCase{8, 40, 16, 5, 64, 16}}) {
    SCOPED_TRACE(testing::Message() << "d " << c.d << " k " << c.k << " B " << c.B);
    test::expect_near_scale(attention_outputs(cpu_, c, 22)[0], attention_outputs(*gpu_, c, 22)[0],
                            test::kChained);
  }
}

TEST_F(CudaOps, FusedAttentionInverseRopeEqualsTheTwoOpsBitForBit) {
  // attention_inverse_rope rotates the stored outputs back in the attention kernel with rope_kernel's
  // arithmetic: the same bits as attention then rope(inverse) on the GPU, at the tiny head (128, r 32) and
  // V4.1's (512, r 64; W 128).
  std::mt19937 g(17);
  struct Geometry {
    int64_t heads, d, r, W;
  };
  for (const Geometry& geo : {Geometry{cfg_.n_heads, cfg_.head_dim, cfg_.rope_head_dim, cfg_.window_size},
                              Geometry{4, 512, 64, 128}}) {
    SCOPED_TRACE(geo.d);
    const int64_t k = cfg_.block_size, slots = 2, B = 2, T = B * k, W = geo.W, d = geo.d, heads = geo.heads;
    std::vector<int32_t> ring_pos(static_cast<size_t>(slots * W), -1);
    for (int32_t p = 0; p < static_cast<int32_t>(W) + 9; ++p) ring_pos[static_cast<size_t>(p % W)] = p;
    for (int32_t p = 0; p < 7; ++p) ring_pos[static_cast<size_t>(W + p)] = p;
    const std::vector<int32_t> req = {0, 9, static_cast<int32_t>(W) + 9, 5, /**/ 1, 0, 7, 3};
    std::vector<int32_t> pos(static_cast<size_t>(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < k; ++j)
        pos[static_cast<size_t>(b * k + j)] =
            req[static_cast<size_t>(b * kReqFields + 2)] + static_cast<int32_t>(j);
    const std::vector<float> q = normal(g, static_cast<size_t>(T * heads * d), 0.25f);
    const std::vector<float> bkv = normal(g, static_cast<size_t>(T * d), 1.0f);
    const std::vector<float> rkv = normal(g, static_cast<size_t>(slots * W * d), 1.0f);
    const std::vector<float> sink = normal(g, static_cast<size_t>(heads), 1.0f, 0, false);
    const auto run_op = [&](Backend& be, bool fused) {
      Tensor out = be.alloc(DType::bf16, {T, heads, d});
      const Tensor tq = put(be, DType::bf16, {T, heads, d}, q), tb = put(be, DType::bf16, {T, d}, bkv);
      const Tensor tr = put(be, DType::bf16, {slots, W, d}, rkv), tp = put_i32(be, {slots, W}, ring_pos);
      const Tensor treq = put_i32(be, {B, kReqFields}, req), ts = put(be, DType::f32, {heads}, sink);
      const Tensor tpos = put_i32(be, {T}, pos);
      if (fused) {
        be.attention_inverse_rope(tq, tb, tr, tp, treq, ts, k, tpos, geo.r, cfg_.rope_theta, out);
      } else {
        be.attention(tq, tb, tr, tp, treq, ts, k, out);
        be.rope(out, tpos, geo.r, cfg_.rope_theta, true);
      }
      return fetch(be, fused ? "fused" : "separate", out);
    };
    test::expect_same_bits(run_op(*gpu_, false), run_op(*gpu_, true));
    test::expect_near_scale(run_op(cpu_, true), run_op(*gpu_, true), test::kChained);
  }
}

// ---- the split (flash-decoding) tensor-core kernel

// Forces the tensor-core kernel's key splits for a scope (automatic again after it).
struct ForcedSplits {
  explicit ForcedSplits(int splits) { cuda::set_attention_splits_for_testing(splits); }
  ~ForcedSplits() { cuda::set_attention_splits_for_testing(0); }
  ForcedSplits(const ForcedSplits&) = delete;
  ForcedSplits& operator=(const ForcedSplits&) = delete;
};

// Shapes for the split kernel: one key block only (5 keys: every split after the first empty), 3 key blocks
// (133 keys: 2 + 1 at S = 2, 1 + 1 + 1 at S = 3), requests of 2 and 3 key blocks in one launch (S = 3 leaves
// the 65-key requests an empty split), d = 16 and k = 1, and the inverse-RoPE epilogue at d 512 and 128.
const AttentionCase kSplitCases[] = {
    AttentionCase{4, 512, 128, 5, 2, 0},
    AttentionCase{4, 512, 128, 8, 2, 125},
    AttentionCase{8, 128, 128, 5, 3, 60, DType::bf16, 128},
    AttentionCase{2, 16, 64, 1, 2, 64},
    AttentionCase{4, 512, 128, 5, 2, 70, DType::bf16, 128, 64},
    AttentionCase{8, 128, 64, 5, 2, 0, DType::bf16, 64, 32},
};

TEST(CudaAttentionSplits, FollowTheGridAndTheWindow) {
  // The host's choice (no GPU needed): a grid of fewer than 128 (head, request) blocks splits up to the key
  // blocks a request can have (W + k keys), unless those keys fit in one block at once (W + k <= 192: the
  // whole-keys kernel, unsplit); larger grids, other paths and the test knob as documented.
  cuda::AttentionArgs a{};
  a.q_t = a.ring_kv_t = a.block_kv_t = cuda::Elt::bf16;  // null pointers count as aligned
  const auto splits = [&](int64_t heads, int64_t B, int64_t W, int64_t k, int64_t d) {
    a.heads = heads;
    a.B = B;
    a.W = W;
    a.k = k;
    a.d = d;
    return cuda::attention_splits(a);
  };
  EXPECT_EQ(splits(32, 1, 128, 5, 512), 1);  // V4.1 at tp 2, B 1: 133 keys, the whole-keys kernel
  EXPECT_EQ(splits(64, 1, 128, 5, 512), 1);
  EXPECT_EQ(splits(32, 2, 192, 5, 512), 2);   // 197 keys (4 blocks), 64 pairs: 2 splits fill 128 blocks
  EXPECT_EQ(splits(32, 1, 256, 5, 512), 4);   // 261 keys: 5 key blocks, 4 splits fill 128 blocks
  EXPECT_EQ(splits(64, 16, 128, 5, 512), 1);  // 1024 pairs fill the GPU alone
  EXPECT_EQ(splits(8, 1, 1024, 5, 512), 16);  // capped at kMaxAttentionSplits
  EXPECT_EQ(splits(4, 2, 16, 5, 128), 1);     // 21 keys: one key block, nothing to split
  EXPECT_EQ(splits(4, 2, 128, 10, 512), 1);   // k > 8: the CUDA-core kernel
  {
    const ForcedSplits forced(3);
    EXPECT_EQ(splits(4, 2, 16, 5, 128), 3);     // forced even past the key blocks (empty splits)
    EXPECT_EQ(splits(64, 16, 128, 5, 512), 3);  // and on large grids
    EXPECT_EQ(splits(64, 17, 128, 5, 512), 1);  // but not past the reserved counters
    EXPECT_EQ(splits(4, 2, 128, 10, 512), 1);
  }
  EXPECT_EQ(splits(4, 2, 16, 5, 128), 1);
}

TEST_F(CudaOps, AttentionWithEveryKeyInSharedMemoryIsTheUnsplitKernelsBits) {
  // The small grids of kSplitCases (W + k <= 192) take the whole-keys kernel automatically: the same bits as
  // the unsplit kernel (S = 1 forced), which walks the same key blocks in the same order.
  for (const AttentionCase& c : kSplitCases) {
    SCOPED_TRACE(testing::Message() << "d " << c.d << " k " << c.k << " live " << c.live << "/" << c.live_last
                                    << " rope " << c.rope_dim);
    const Outs whole = attention_outputs(*gpu_, c, 27);
    const ForcedSplits forced(1);
    test::expect_same_bits(attention_outputs(*gpu_, c, 27)[0], whole[0]);
  }
}

TEST_F(CudaOps, AttentionSplitOverKeysMatchesTheReference) {
  // S = 2 and 3 forced: each against the CPU reference within the unsplit kernel's tolerance, and two GPU
  // runs with the same bits (the merge in split order).
  for (const int S : {2, 3}) {
    const ForcedSplits forced(S);
    for (const AttentionCase& c : kSplitCases) {
      SCOPED_TRACE(testing::Message() << "S " << S << " d " << c.d << " k " << c.k << " live " << c.live
                                      << "/" << c.live_last << " rope " << c.rope_dim);
      auto [cpu, gpu] = run([&](Backend& be) { return attention_outputs(be, c, 23); });
      test::expect_near_scale(cpu[0], gpu[0], test::kChained);
    }
  }
}

TEST_F(CudaOps, AttentionSplitRepeatsItsBitsEagerAndReplayed) {
  // S = 3 forced: eager runs, then a recording replayed twice, then eager again: all the same bits (the
  // arrival counters are back at zero after every launch, a replay's too), and near the CPU reference.
  const AttentionCase c{4, 512, 128, 5, 2, 70, DType::bf16, 128, 64};
  const ForcedSplits forced(3);
  const AttentionInputs in = attention_inputs(*gpu_, c, 24);
  in.run(*gpu_);
  const test::Out first = fetch(*gpu_, "eager", in.out);
  in.run(*gpu_);
  test::expect_same_bits(first, fetch(*gpu_, "eager again", in.out));
  gpu_->begin_capture();
  in.run(*gpu_);
  const std::shared_ptr<void> graph = gpu_->end_capture();
  ASSERT_TRUE(graph);
  for (int rep = 0; rep < 2; ++rep) {
    SCOPED_TRACE(rep);
    gpu_->zero(in.out);
    gpu_->replay(graph);
    test::expect_same_bits(first, fetch(*gpu_, "replayed", in.out));
  }
  in.run(*gpu_);
  test::expect_same_bits(first, fetch(*gpu_, "eager after the replays", in.out));
  test::expect_near_scale(attention_outputs(cpu_, c, 24)[0], first, test::kChained);
}

TEST_F(CudaOps, AttentionSplitOneIsTheUnsplitKernel) {
  // S = 1 forced takes the kernel without partials: on a grid large enough that the automatic choice is 1
  // (8 heads x 16 requests = 128 pairs) the same bits as the automatic launch, and at small grids (where the
  // automatic choice now splits) the CPU reference's tolerance. The split result differs from it by fp32
  // order only: the same tolerance between the two.
  const AttentionCase big{8, 128, 64, 5, 16, 40, DType::bf16, 64};
  const Outs automatic = attention_outputs(*gpu_, big, 25);
  {
    const ForcedSplits forced(1);
    test::expect_same_bits(automatic[0], attention_outputs(*gpu_, big, 25)[0]);
  }
  for (const AttentionCase& c : kSplitCases) {
    SCOPED_TRACE(testing::Message() << "d " << c.d << " k " << c.k << " live " << c.live << "/" << c.live_last
                                    << " rope " << c.rope_dim);
    const Outs split = attention_outputs(*gpu_, c, 26);  // automatic: splits at these small grids
    const ForcedSplits forced(1);
    auto [cpu, unsplit] = run([&](Backend& be) { return attention_outputs(be, c, 26); });
    test::expect_near_scale(cpu[0], unsplit[0], test::kChained);
    test::expect_near_scale(unsplit[0], split[0], test::kChained);
  }
}

}  // namespace
}  // namespace dspark
