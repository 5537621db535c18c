// CpuBackend KV rings (ring_write, ring_clear) and the stage attention against a naive double
// softmax-with-sink over the key set SPEC §4 prescribes.
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

using test::make_i32;
using test::make_tensor;
using test::rand_bf16;
using test::to_floats;
using test::to_i32;

// ---- rings

TEST(CpuRing, WriteGoesToEntryPosModWLaterRowWinsPaddingNowhereClearIsPerSlot) {
  CpuBackend be;
  const int64_t slots = 3, W = 4, d = 3;
  Tensor ring_kv = be.alloc(DType::bf16, {slots, W, d});
  Tensor ring_pos = be.alloc(DType::i32, {slots, W});
  be.fill_i32(ring_pos, -1);
  // Rows: (slot 1, pos 5) -> entry 1; (slot 0, pos 2) -> entry 2; (slot 1, pos 9) -> entry 1 again (wins);
  // (slot 1, pos 6) -> entry 2; (slot 2, pos 3) -> entry 3; (slot -1, pos 1): padding, written nowhere.
  std::vector<float> kv;
  for (int n = 0; n < 6; ++n)
    for (int c = 0; c < d; ++c) kv.push_back(static_cast<float>(10 * (n + 1) + c));
  Tensor kvt = make_tensor(be, DType::bf16, {6, d}, kv);
  Tensor st = make_i32(be, {6}, {1, 0, 1, 1, 2, -1});
  Tensor pt = make_i32(be, {6}, {5, 2, 9, 6, 3, 1});
  be.ring_write(ring_kv, ring_pos, kvt, st, pt);

  const std::vector<int32_t> pos = to_i32(be, ring_pos);
  EXPECT_EQ(pos, (std::vector<int32_t>{-1, -1, 2, -1, /*slot 1*/ -1, 9, 6, -1, /*slot 2*/ -1, -1, -1, 3}));
  const std::vector<float> r = to_floats(be, ring_kv);
  auto entry = [&](int64_t s, int64_t e, int64_t c) { return r[static_cast<size_t>((s * W + e) * d + c)]; };
  for (int c = 0; c < d; ++c) {
    EXPECT_EQ(entry(0, 2, c), static_cast<float>(20 + c));
    EXPECT_EQ(entry(1, 1, c), static_cast<float>(30 + c));  // row 2 (pos 9) overwrote row 0 (pos 5)
    EXPECT_EQ(entry(1, 2, c), static_cast<float>(40 + c));
    EXPECT_EQ(entry(2, 3, c), static_cast<float>(50 + c));
    EXPECT_EQ(entry(0, 0, c), 0.0f);
  }

  be.ring_clear(ring_pos, 1);
  EXPECT_EQ(to_i32(be, ring_pos), (std::vector<int32_t>{-1, -1, 2, -1, -1, -1, -1, -1, -1, -1, -1, 3}));
}

// ---- attention

struct Request {
  int32_t slot, low, P, outputs;
};

// Naive double attention output of one query head over explicit keys (K = V) with a sink logit.
std::vector<double> naive_attend(const std::vector<float>& q, const std::vector<std::vector<float>>& keys,
                                 double sink, std::vector<double>* mag = nullptr) {
  const size_t d = q.size();
  std::vector<double> s(keys.size());
  double M = -1e300;
  for (size_t j = 0; j < keys.size(); ++j) {
    double acc = 0.0;
    for (size_t c = 0; c < d; ++c) acc += static_cast<double>(q[c]) * keys[j][c];
    s[j] = acc / std::sqrt(static_cast<double>(d));
    M = std::max(M, s[j]);
  }
  double den = std::exp(sink - M);
  for (double v : s) den += std::exp(v - M);
  std::vector<double> o(d, 0.0);
  if (mag) mag->assign(d, 0.0);
  for (size_t j = 0; j < keys.size(); ++j) {
    const double p = std::exp(s[j] - M) / den;
    for (size_t c = 0; c < d; ++c) {
      o[c] += p * keys[j][c];
      if (mag) (*mag)[c] += p * std::fabs(keys[j][c]);
    }
  }
  return o;
}

struct AttnCase {
  int64_t heads, d, k, slots, W;
  std::vector<float> q, block_kv, ring_kv, sink;
  std::vector<int32_t> ring_pos;
  std::vector<Request> reqs;
};

std::vector<float> run_attention(CpuBackend& be, const AttnCase& c) {
  const int64_t B = static_cast<int64_t>(c.reqs.size()), T = B * c.k;
  std::vector<int32_t> req;
  for (const Request& r : c.reqs) req.insert(req.end(), {r.slot, r.low, r.P, r.outputs});
  Tensor q = make_tensor(be, DType::bf16, {T, c.heads, c.d}, c.q);
  Tensor bkv = make_tensor(be, DType::bf16, {T, c.d}, c.block_kv);
  Tensor rkv = make_tensor(be, DType::bf16, {c.slots, c.W, c.d}, c.ring_kv);
  Tensor rpos = make_i32(be, {c.slots, c.W}, c.ring_pos);
  Tensor rq = make_i32(be, {B, kReqFields}, req);
  Tensor sink = make_tensor(be, DType::f32, {c.heads}, c.sink);
  Tensor out = be.alloc(DType::bf16, {T, c.heads, c.d});
  be.attention(q, bkv, rkv, rpos, rq, sink, c.k, out);
  return to_floats(be, out);
}

// The keys SPEC §4 prescribes for request b: ring entries of its slot with position in [low, P - 1]
// (optionally ignoring the window filter, for sensitivity checks), then its k block rows (optionally only the
// first `causal_upto + 1`, for the no-causal-mask sensitivity check).
std::vector<std::vector<float>> keys_of(const AttnCase& c, size_t b, bool filter = true,
                                        int64_t causal_upto = -1) {
  const Request& r = c.reqs[b];
  std::vector<std::vector<float>> keys;
  for (int64_t e = 0; e < c.W; ++e) {
    const int32_t p = c.ring_pos[static_cast<size_t>(r.slot * c.W + e)];
    const bool live = filter ? (p >= 0 && p >= r.low && p <= r.P - 1) : p >= 0;
    if (live) {
      const auto it = c.ring_kv.begin() + (r.slot * c.W + e) * c.d;
      keys.emplace_back(it, it + c.d);
    }
  }
  const int64_t nb = causal_upto >= 0 ? causal_upto + 1 : c.k;
  for (int64_t j = 0; j < nb; ++j) {
    const auto it = c.block_kv.begin() + (static_cast<int64_t>(b) * c.k + j) * c.d;
    keys.emplace_back(it, it + c.d);
  }
  return keys;
}

std::vector<float> query(const AttnCase& c, int64_t t, int64_t h) {
  const auto it = c.q.begin() + (t * c.heads + h) * c.d;
  return {it, it + c.d};
}

// Compares every output row with the naive formula over the prescribed key set.
void expect_matches_naive(const AttnCase& c, const std::vector<float>& out) {
  for (size_t b = 0; b < c.reqs.size(); ++b) {
    const std::vector<std::vector<float>> keys = keys_of(c, b);
    for (int64_t i = 0; i < c.k; ++i) {
      const int64_t t = static_cast<int64_t>(b) * c.k + i;
      for (int64_t h = 0; h < c.heads; ++h) {
        std::vector<double> mag;
        const std::vector<double> ref =
            naive_attend(query(c, t, h), keys, c.sink[static_cast<size_t>(h)], &mag);
        for (int64_t ch = 0; ch < c.d; ++ch) {
          const double got = out[static_cast<size_t>((t * c.heads + h) * c.d + ch)];
          // Probabilities rounded to bf16 (2^-9 each) and the bf16 output: ~1% of the weighted magnitude.
          EXPECT_NEAR(got, ref[static_cast<size_t>(ch)], 1e-2 * mag[static_cast<size_t>(ch)] + 1e-6)
              << "b " << b << " row " << i << " head " << h << " ch " << ch;
        }
      }
    }
  }
}

double max_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(a[i] - b[i]));
  return m;
}

TEST(CpuAttention, OneKeyIsKvTimesSigmoidAgainstTheSink) {
  CpuBackend be;
  // Empty ring, k = 1: the only key is the block row. p = exp(s - s) = 1 exactly, so
  // out = kv / (1 + exp(sink - s)) with s = q.kv / sqrt(d), rounded to bf16.
  AttnCase c{2, 4, 1, 1, 4, {}, {}, {}, {}, {}, {}};
  c.q = {1.0f, 0.5f, -1.0f, 2.0f, /*head 1*/ -0.5f, 0.25f, 0.0f, 1.0f};
  c.block_kv = {0.5f, -1.5f, 2.0f, 1.0f};
  c.ring_kv.assign(static_cast<size_t>(c.W * c.d), 0.0f);
  c.ring_pos.assign(static_cast<size_t>(c.W), -1);
  c.sink = {0.3f, -2.0f};
  c.reqs = {{0, 0, 7, 1}};
  const std::vector<float> out = run_attention(be, c);
  for (int64_t h = 0; h < c.heads; ++h) {
    double s = 0.0;
    for (int64_t ch = 0; ch < c.d; ++ch)
      s += static_cast<double>(c.q[static_cast<size_t>(h * c.d + ch)]) * c.block_kv[static_cast<size_t>(ch)];
    s /= 2.0;  // sqrt(4)
    const double w = 1.0 / (1.0 + std::exp(c.sink[static_cast<size_t>(h)] - s));
    for (int64_t ch = 0; ch < c.d; ++ch) {
      const double ref = c.block_kv[static_cast<size_t>(ch)] * w;
      const float got = out[static_cast<size_t>(h * c.d + ch)];
      EXPECT_NEAR(got, ref, std::fabs(ref) / 256.0) << "head " << h << " ch " << ch;
      // Within half a bf16 spacing of the exact value up to fp32 noise: the bf16 rounding of the exact
      // result.
      EXPECT_NEAR(got, round_bf16(static_cast<float>(ref)), std::fabs(ref) * 1e-5 + 1e-7)
          << "head " << h << " ch " << ch;
    }
  }
}

TEST(CpuAttention, WindowFilterEmptyEntriesSlotsAndFullBlockVisibility) {
  CpuBackend be;
  std::mt19937 g(71);
  AttnCase c{2, 8, 3, 2, 8, {}, {}, {}, {}, {}, {}};
  // Slot 1, P = 12, low = 6. Entries: e0 8 (in), e1 9 (in), e2 empty, e3 11 = P - 1 (in), e4 12 = P (out),
  // e5 5 < low (out), e6 6 = low (in), e7 15 > P (out). Slot 0 holds other rows, for request 1 (P = 6, low =
  // 2).
  c.ring_pos = {/*slot 0*/ 0, 1, 2, 3, 4, 5, 6, 7, /*slot 1*/ 8, 9, -1, 11, 12, 5, 6, 15};
  c.ring_kv = rand_bf16(g, static_cast<size_t>(c.slots * c.W * c.d), -1.0f, 1.0f);
  c.block_kv = rand_bf16(g, static_cast<size_t>(2 * c.k * c.d), -1.0f, 1.0f);
  c.q = rand_bf16(g, static_cast<size_t>(2 * c.k * c.heads * c.d), -2.0f, 2.0f);
  // Make the excluded entries of slot 1 (e2, e4, e5, e7) loud and aligned with the queries: including any of
  // them would move the output far beyond the tolerance.
  for (int64_t e : {2, 4, 5, 7})
    for (int64_t ch = 0; ch < c.d; ++ch) {
      const float qsum = c.q[static_cast<size_t>(ch)] + c.q[static_cast<size_t>(c.d + ch)];
      c.ring_kv[static_cast<size_t>((1 * c.W + e) * c.d + ch)] = round_bf16(qsum > 0 ? 3.0f : -3.0f);
    }
  c.sink = {0.5f, -1.0f};
  c.reqs = {{1, 6, 12, 3}, {0, 2, 6, 2}};
  const std::vector<float> out = run_attention(be, c);
  expect_matches_naive(c, out);

  // Sensitivity: the excluded entries and a causal mask inside the block both change the naive result by much
  // more than the tolerance, so the comparison above really pins the key set.
  const std::vector<double> spec = naive_attend(query(c, 0, 0), keys_of(c, 0), c.sink[0]);
  EXPECT_GT(max_diff(spec, naive_attend(query(c, 0, 0), keys_of(c, 0, false), c.sink[0])), 0.1);
  EXPECT_GT(max_diff(spec, naive_attend(query(c, 0, 0), keys_of(c, 0, true, 0), c.sink[0])), 0.05);
  EXPECT_EQ(keys_of(c, 0).size(), 4u + 3u);
  EXPECT_EQ(keys_of(c, 1).size(), 4u + 3u);  // slot 0 positions 2..5
}

TEST(CpuAttention, MoreThan64KeysFromAFullRing) {
  CpuBackend be;
  std::mt19937 g(72);
  // W = 128, all entries live in [P - 128, P - 1] -> 128 ring keys + 2 block rows = 130 keys (three blocks of
  // 64).
  AttnCase c{2, 16, 2, 1, 128, {}, {}, {}, {}, {}, {}};
  const int32_t P = 300;
  for (int32_t e = 0; e < 128; ++e) {
    // Entry e holds the position p in [P - 128, P - 1] with p mod 128 = e.
    int32_t p = P - 128 + ((e - (P - 128) % 128 + 128) % 128);
    c.ring_pos.push_back(p);
  }
  c.ring_kv = rand_bf16(g, static_cast<size_t>(c.W * c.d), -1.0f, 1.0f);
  c.block_kv = rand_bf16(g, static_cast<size_t>(c.k * c.d), -1.0f, 1.0f);
  c.q = rand_bf16(g, static_cast<size_t>(c.k * c.heads * c.d), -1.5f, 1.5f);
  // Key 100 (second block of 64) aligned with head 0 of row 0: its score dominates only after the first
  // block, so the online max has to rescale what the first block accumulated.
  for (int64_t ch = 0; ch < c.d; ++ch)
    c.ring_kv[static_cast<size_t>(100 * c.d + ch)] =
        round_bf16(c.q[static_cast<size_t>(ch)] > 0 ? 1.5f : -1.5f);
  c.sink = {-1.0f, 3.0f};
  c.reqs = {{0, P - 128, P, 2}};
  const std::vector<float> out = run_attention(be, c);
  EXPECT_EQ(keys_of(c, 0).size(), 130u);
  expect_matches_naive(c, out);

  // Sensitivity: dropping the last 64 ring keys (a kernel stopping after one block) changes the result.
  AttnCase half = c;
  for (int64_t e = 64; e < 128; ++e) half.ring_pos[static_cast<size_t>(e)] = -1;
  EXPECT_GT(max_diff(naive_attend(query(c, 0, 0), keys_of(c, 0), c.sink[0]),
                     naive_attend(query(c, 0, 0), keys_of(half, 0), c.sink[0])),
            0.1);
}

}  // namespace
}  // namespace dspark
