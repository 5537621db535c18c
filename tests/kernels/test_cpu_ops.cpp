// CpuBackend dense ops (memory, embed, linear, grouped_linear, rms_norm, convert, rope, kv_qdq) against
// hand-worked cases and naive double-precision formulations of SPEC §4 written here, independently of the
// kernels.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark {
namespace {

using test::make_i32;
using test::make_tensor;
using test::rand_bf16;
using test::to_floats;
using test::to_i32;

constexpr double kBf16Ulp = 1.0 / 256.0;  // relative spacing of bf16 (8 significant bits)

LinearWeight dense(const char* name, int64_t out, int64_t in, Tensor t) {
  LinearWeight l = dense_linear(name, std::move(t));
  EXPECT_EQ(l.out, out);
  EXPECT_EQ(l.in, in);
  return l;
}

// ---- memory

// The documented order of cpu::dot, written out plainly: element i goes to lane i mod 16 in index order, then
// lanes j and j + 8, j and j + 4, j and j + 2, j and j + 1 are added.
float dot_in_documented_order(const float* a, const float* b, int64_t n) {
  float lane[16] = {};
  for (int64_t i = 0; i < n; ++i) lane[i % 16] += a[i] * b[i];
  for (int s = 8; s > 0; s /= 2)
    for (int j = 0; j < s; ++j) lane[j] += lane[j + s];
  return lane[0];
}

TEST(CpuDot, HasTheDocumentedOrderWhicheverBuildOfItRuns) {
  std::mt19937 g(5);
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> a(300), b(300);
  for (float& v : a) v = d(g) * 1e3f;  // terms of many magnitudes: another order changes the bits
  for (float& v : b) v = d(g);
  for (const int64_t n : {0, 1, 7, 15, 16, 17, 31, 33, 64, 100, 256, 300}) {
    const float want = dot_in_documented_order(a.data(), b.data(), n);
    EXPECT_EQ(std::bit_cast<uint32_t>(cpu::dot(a.data(), b.data(), n)), std::bit_cast<uint32_t>(want))
        << "n " << n;
  }
}

TEST(CpuDot, RowsAgainstOneVectorHaveEachRowsDocumentedOrder) {
  // 1 to 9 rows (groups of four and the rest), each row its own bits: the documented order, row by row.
  std::mt19937 g(6);
  std::normal_distribution<float> d(0.0f, 1.0f);
  const int64_t n_max = 300;
  std::vector<std::vector<float>> a(9, std::vector<float>(n_max));
  std::vector<float> b(n_max);
  for (auto& row : a)
    for (float& v : row) v = d(g) * 1e3f;
  for (float& v : b) v = d(g);
  std::vector<const float*> rows;
  for (const auto& row : a) rows.push_back(row.data());
  for (const int64_t m : {1, 3, 4, 5, 8, 9})
    for (const int64_t n : {0, 1, 15, 16, 17, 100, 300}) {
      std::vector<float> got(static_cast<size_t>(m), -1.0f);
      cpu::dot_rows(rows.data(), m, b.data(), n, got.data());
      for (int64_t r = 0; r < m; ++r)
        EXPECT_EQ(std::bit_cast<uint32_t>(got[static_cast<size_t>(r)]),
                  std::bit_cast<uint32_t>(dot_in_documented_order(rows[static_cast<size_t>(r)], b.data(), n)))
            << "m " << m << ", n " << n << ", row " << r;
    }
  // b stored as bf16: the bits of the same order on b's fp32 values.
  std::vector<uint16_t> b16(static_cast<size_t>(n_max));
  std::vector<float> b16f(b16.size());
  for (size_t i = 0; i < b16.size(); ++i) b16f[i] = bf16_to_float(b16[i] = float_to_bf16(b[i]));
  for (const int64_t m : {1, 2, 7, 9})
    for (const int64_t n : {0, 5, 16, 33, 300}) {
      std::vector<float> got(static_cast<size_t>(m), -1.0f);
      cpu::dot_rows(rows.data(), m, b16.data(), n, got.data());
      for (int64_t r = 0; r < m; ++r)
        EXPECT_EQ(
            std::bit_cast<uint32_t>(got[static_cast<size_t>(r)]),
            std::bit_cast<uint32_t>(dot_in_documented_order(rows[static_cast<size_t>(r)], b16f.data(), n)))
            << "bf16 b: m " << m << ", n " << n << ", row " << r;
    }
}

TEST(CpuMemory, AllocIsZeroedFillAndZeroWork) {
  CpuBackend be;
  Tensor t = be.alloc(DType::i32, {3, 5});
  for (int32_t v : to_i32(be, t)) EXPECT_EQ(v, 0);
  be.fill_i32(t, -1);
  for (int32_t v : to_i32(be, t)) EXPECT_EQ(v, -1);
  be.zero(t);
  for (int32_t v : to_i32(be, t)) EXPECT_EQ(v, 0);
  const std::vector<float> src = {1.5f, -2.0f, 3.25f};
  Tensor f = make_tensor(be, DType::f32, {3}, src);
  EXPECT_EQ(to_floats(be, f), src);
}

TEST(CpuMemory, CopyIsByteForByteBetweenHostAndDeviceBuffersAndRefusesOtherSizes) {
  CpuBackend be;
  Tensor host = be.alloc_host(DType::i32, {4});
  for (int32_t v : to_i32(be, host)) EXPECT_EQ(v, 0);
  const std::vector<int32_t> want = {7, -1, 0x7fc00001, 123456789};  // a NaN's bits pass unchanged
  std::copy(want.begin(), want.end(), host.as<int32_t>());
  Tensor dev = be.alloc(DType::f32, {4});
  be.copy(host, dev);
  EXPECT_EQ(to_i32(be, dev.view(0, DType::i32, {4})), want);
  Tensor back = be.alloc_host(DType::i32, {4});
  be.copy(dev, back);
  EXPECT_TRUE(std::equal(want.begin(), want.end(), back.as<int32_t>()));
  EXPECT_THROW(be.copy(host, be.alloc(DType::i32, {3})), Error);
  // The ops ran as issued: the word is there (a return) or never will be (an error that says so).
  be.wait_for_word(back.view(12, DType::i32, {1}), 123456789);
  try {
    be.wait_for_word(back.view(12, DType::i32, {1}), 5);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("without writing 5"), std::string::npos) << e.what();
  }
}

// ---- embed

TEST(CpuEmbed, PicksRows) {
  CpuBackend be;
  const int64_t V = 5, H = 3;
  std::vector<float> table(V * H);
  for (int64_t i = 0; i < V * H; ++i) table[static_cast<size_t>(i)] = static_cast<float>(i) * 0.5f - 3.0f;
  Tensor tt = make_tensor(be, DType::bf16, {V, H}, table);
  const std::vector<int32_t> ids = {2, 0, 4, 2};
  Tensor it = make_i32(be, {4}, ids);
  Tensor out = be.alloc(DType::bf16, {4, H});
  be.embed(tt, it, out);
  const std::vector<float> o = to_floats(be, out);
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t i = 0; i < H; ++i)
      EXPECT_EQ(o[t * H + static_cast<size_t>(i)], table[static_cast<size_t>(ids[t] * H + i)])
          << t << "," << i;
}

// ---- convert

TEST(CpuConvert, F32ToBf16RoundsToNearestEven) {
  CpuBackend be;
  const std::vector<float> in = {
      1.0f + 0x1p-8f,             // exactly halfway: down to the even mantissa (1.0)
      1.0f + 3 * 0x1p-8f,         // exactly halfway: up to the even mantissa (1 + 2^-6)
      1.0f + 0x1p-8f + 0x1p-20f,  // just above halfway: up
      -2.0f,
      3.140625f,       // exact in bf16
      1.0f + 0x1p-9f,  // below halfway: down
  };
  const std::vector<float> want = {1.0f, 1.0f + 0x1p-6f, 1.0f + 0x1p-7f, -2.0f, 3.140625f, 1.0f};
  Tensor src = make_tensor(be, DType::f32, {6}, in);
  Tensor dst = be.alloc(DType::bf16, {6});
  be.convert(src, dst);
  EXPECT_EQ(to_floats(be, dst), want);

  // bf16 -> f32 is exact.
  Tensor back = be.alloc(DType::f32, {6});
  be.convert(dst, back);
  EXPECT_EQ(to_floats(be, back), want);
}

// ---- linear

TEST(CpuLinear, HandCase) {
  CpuBackend be;
  // x = [1, 2]; W = [[3, 4], [0.5, -1]] -> [11, -1.5].
  Tensor x = make_tensor(be, DType::bf16, {1, 2}, {1, 2});
  LinearWeight w = dense("w", 2, 2, make_tensor(be, DType::bf16, {2, 2}, {3, 4, 0.5f, -1}));
  Tensor out = be.alloc(DType::bf16, {1, 2});
  be.linear(x, w, out);
  EXPECT_EQ(to_floats(be, out), (std::vector<float>{11.0f, -1.5f}));
}

TEST(CpuLinear, MatchesNaiveDoubleMatmul) {
  CpuBackend be;
  std::mt19937 g(11);
  const int64_t T = 3, in = 37, out = 5;
  const std::vector<float> xs = rand_bf16(g, T * in, -2.0f, 2.0f);
  const std::vector<float> ws = rand_bf16(g, out * in, -1.0f, 1.0f);
  Tensor x = make_tensor(be, DType::bf16, {T, in}, xs);
  LinearWeight w = dense("w", out, in, make_tensor(be, DType::bf16, {out, in}, ws));
  Tensor o32 = be.alloc(DType::f32, {T, out});
  Tensor o16 = be.alloc(DType::bf16, {T, out});
  be.linear(x, w, o32);
  be.linear(x, w, o16);
  const std::vector<float> r32 = to_floats(be, o32), r16 = to_floats(be, o16);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < out; ++o) {
      double ref = 0.0, mag = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        const double p =
            static_cast<double>(xs[static_cast<size_t>(t * in + i)]) * ws[static_cast<size_t>(o * in + i)];
        ref += p;
        mag += std::fabs(p);
      }
      const size_t idx = static_cast<size_t>(t * out + o);
      // fp32 accumulation of `in` products: at most ~in unit roundoffs of the magnitude sum.
      EXPECT_NEAR(r32[idx], ref, static_cast<double>(in + 1) * 0x1p-24 * mag) << t << "," << o;
      // The bf16 output is the f32 result rounded once.
      EXPECT_EQ(r16[idx], round_bf16(r32[idx])) << t << "," << o;
      EXPECT_NEAR(r16[idx], ref, kBf16Ulp * std::fabs(ref) + static_cast<double>(in + 1) * 0x1p-24 * mag);
    }
}

TEST(CpuLinear, AcceptsF32WeightsAndLeadingDims) {
  CpuBackend be;
  std::mt19937 g(12);
  const int64_t in = 6, out = 4;
  const std::vector<float> xs = rand_bf16(g, 2 * 2 * in, -1.0f, 1.0f);
  std::vector<float> ws(out * in);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  for (float& v : ws) v = d(g);  // not bf16-representable: the f32 weight must be read at full precision
  Tensor x = make_tensor(be, DType::bf16, {2, 2, in}, xs);
  LinearWeight w = dense("w", out, in, make_tensor(be, DType::f32, {out, in}, ws));
  Tensor o = be.alloc(DType::f32, {2, 2, out});
  be.linear(x, w, o);
  const std::vector<float> r = to_floats(be, o);
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t c = 0; c < out; ++c) {
      double ref = 0.0;
      for (int64_t i = 0; i < in; ++i)
        ref += static_cast<double>(xs[static_cast<size_t>(t * in + i)]) * ws[static_cast<size_t>(c * in + i)];
      EXPECT_NEAR(r[static_cast<size_t>(t * out + c)], ref, 1e-6) << t << "," << c;
    }
}

TEST(CpuGroupedLinear, EqualsSeparateLinearsOnSlices) {
  CpuBackend be;
  std::mt19937 g(13);
  const int64_t T = 2, G = 3, in_g = 4, out_g = 2;
  const std::vector<float> xs = rand_bf16(g, T * G * in_g, -2.0f, 2.0f);
  const std::vector<float> ws = rand_bf16(g, G * out_g * in_g, -1.0f, 1.0f);
  Tensor x = make_tensor(be, DType::bf16, {T, G * in_g}, xs);
  LinearWeight w = dense("wo_a", G * out_g, in_g, make_tensor(be, DType::bf16, {G * out_g, in_g}, ws));
  Tensor out = be.alloc(DType::bf16, {T, G * out_g});
  be.grouped_linear(x, w, G, out);
  const std::vector<float> r = to_floats(be, out);

  for (int64_t grp = 0; grp < G; ++grp) {
    // Group g through its own linear: x's g-th slice, w's g-th rows.
    std::vector<float> xg, wg;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < in_g; ++i) xg.push_back(xs[static_cast<size_t>(t * G * in_g + grp * in_g + i)]);
    for (int64_t o = 0; o < out_g; ++o)
      for (int64_t i = 0; i < in_g; ++i) wg.push_back(ws[static_cast<size_t>((grp * out_g + o) * in_g + i)]);
    Tensor xt = make_tensor(be, DType::bf16, {T, in_g}, xg);
    LinearWeight wl = dense("slice", out_g, in_g, make_tensor(be, DType::bf16, {out_g, in_g}, wg));
    Tensor ot = be.alloc(DType::bf16, {T, out_g});
    be.linear(xt, wl, ot);
    const std::vector<float> rs = to_floats(be, ot);
    for (int64_t t = 0; t < T; ++t)
      for (int64_t o = 0; o < out_g; ++o) {
        const float got = r[static_cast<size_t>(t * G * out_g + grp * out_g + o)];
        EXPECT_EQ(got, rs[static_cast<size_t>(t * out_g + o)]) << "group " << grp << " t " << t << " o " << o;
        double ref = 0.0;
        for (int64_t i = 0; i < in_g; ++i)
          ref += static_cast<double>(xg[static_cast<size_t>(t * in_g + i)]) *
                 wg[static_cast<size_t>(o * in_g + i)];
        EXPECT_NEAR(got, ref, kBf16Ulp * std::fabs(ref) + 1e-6);
      }
  }
}

// ---- rms_norm

TEST(CpuRmsNorm, HandCase) {
  CpuBackend be;
  // x = [3, 4], w = [1, 2]: mean(x^2) = 12.5 -> [3 / sqrt(12.5), 8 / sqrt(12.5)].
  Tensor x = make_tensor(be, DType::bf16, {1, 2}, {3, 4});
  Tensor w = make_tensor(be, DType::bf16, {2}, {1, 2});
  Tensor out = be.alloc(DType::bf16, {1, 2});
  be.rms_norm(x, w, 1e-20f, out);
  const std::vector<float> r = to_floats(be, out);
  EXPECT_EQ(r[0], round_bf16(static_cast<float>(3.0 / std::sqrt(12.5))));
  EXPECT_EQ(r[1], round_bf16(static_cast<float>(8.0 / std::sqrt(12.5))));
}

TEST(CpuRmsNorm, EpsEntersUnderTheRoot) {
  CpuBackend be;
  // x = [2^-7, 2^-7]: mean(x^2) = 2^-14. eps = 0 -> 1; eps = 3 * 2^-14 -> 2^-7 / sqrt(2^-12) = 0.5 exactly.
  Tensor x = make_tensor(be, DType::bf16, {2, 2}, {0x1p-7f, 0x1p-7f, 0x1p-7f, -0x1p-7f});
  Tensor w = make_tensor(be, DType::bf16, {2}, {1, 1});
  Tensor out = be.alloc(DType::bf16, {2, 2});
  be.rms_norm(x, w, 0.0f, out);
  EXPECT_EQ(to_floats(be, out), (std::vector<float>{1.0f, 1.0f, 1.0f, -1.0f}));
  be.rms_norm(x, w, 3 * 0x1p-14f, out);
  EXPECT_EQ(to_floats(be, out), (std::vector<float>{0.5f, 0.5f, 0.5f, -0.5f}));
}

TEST(CpuRmsNorm, MatchesNaiveDoublePerRow) {
  CpuBackend be;
  std::mt19937 g(21);
  const int64_t T = 3, n = 64;
  std::vector<float> xs = rand_bf16(g, T * n, -1.0f, 1.0f);
  for (int64_t i = 0; i < n; ++i)
    xs[static_cast<size_t>(n + i)] = round_bf16(xs[static_cast<size_t>(n + i)] * 300.0f);
  const std::vector<float> ws = rand_bf16(g, n, 0.5f, 2.0f);
  const float eps = 1e-6f;
  Tensor x = make_tensor(be, DType::bf16, {T, n}, xs);
  Tensor w = make_tensor(be, DType::bf16, {n}, ws);
  Tensor out = be.alloc(DType::bf16, {T, n});
  be.rms_norm(x, w, eps, out);
  const std::vector<float> r = to_floats(be, out);
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; ++i)
      ss += static_cast<double>(xs[static_cast<size_t>(t * n + i)]) * xs[static_cast<size_t>(t * n + i)];
    const double rs = 1.0 / std::sqrt(ss / static_cast<double>(n) + eps);
    for (int64_t i = 0; i < n; ++i) {
      const size_t idx = static_cast<size_t>(t * n + i);
      const double ref = static_cast<double>(ws[static_cast<size_t>(i)]) * xs[idx] * rs;
      EXPECT_NEAR(r[idx], ref, kBf16Ulp * std::fabs(ref) + 1e-7) << t << "," << i;
    }
  }
}

// ---- rope

// Naive RoPE of one [heads, d] row at position p (double): adjacent pairs of the last r dims.
std::vector<double> naive_rope(const std::vector<float>& x, int64_t heads, int64_t d, int64_t r, double p,
                               double theta, bool inverse) {
  std::vector<double> y(x.begin(), x.end());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < r / 2; ++j) {
      const double ang = p * std::pow(theta, -2.0 * static_cast<double>(j) / static_cast<double>(r));
      const double c = std::cos(ang), s = inverse ? -std::sin(ang) : std::sin(ang);
      const size_t i = static_cast<size_t>(h * d + (d - r) + 2 * j);
      const double a = x[i], b = x[i + 1];
      y[i] = a * c - b * s;
      y[i + 1] = a * s + b * c;
    }
  return y;
}

TEST(CpuRope, HandCaseOnePair) {
  CpuBackend be;
  // d = r = 4 at pos 5: pair 0 (freq 1) holds (1, 0) -> (cos 5, sin 5); pair 1 (freq 10000^(-2/4) = 0.01)
  // holds (0, 1) -> i * e^(0.05 i) = (-sin 0.05, cos 0.05).
  Tensor x = make_tensor(be, DType::bf16, {1, 1, 4}, {1, 0, 0, 1});
  Tensor pos = make_i32(be, {1}, {5});
  be.rope(x, pos, 4, 10000.0, false);
  const std::vector<float> r = to_floats(be, x);
  EXPECT_EQ(r[0], round_bf16(static_cast<float>(std::cos(5.0))));
  EXPECT_EQ(r[1], round_bf16(static_cast<float>(std::sin(5.0))));
  EXPECT_EQ(r[2], round_bf16(static_cast<float>(-std::sin(0.05))));
  EXPECT_EQ(r[3], round_bf16(static_cast<float>(std::cos(0.05))));
}

TEST(CpuRope, PairsAreAdjacentNotHalves) {
  CpuBackend be;
  // A single 1 at the first rope dim rotates into the SECOND dim (pair (0, 1)), never the (r/2)-th.
  const int64_t d = 8, r = 8;
  std::vector<float> xs(d, 0.0f);
  xs[0] = 1.0f;
  Tensor x = make_tensor(be, DType::bf16, {1, 1, d}, xs);
  Tensor pos = make_i32(be, {1}, {1});
  be.rope(x, pos, r, 10000.0, false);
  const std::vector<float> o = to_floats(be, x);
  EXPECT_EQ(o[0], round_bf16(static_cast<float>(std::cos(1.0))));
  EXPECT_EQ(o[1], round_bf16(static_cast<float>(std::sin(1.0))));
  for (int64_t i = 2; i < d; ++i) EXPECT_EQ(o[static_cast<size_t>(i)], 0.0f) << i;
}

TEST(CpuRope, MatchesNaiveAndTouchesOnlyTheLastRopeDims) {
  CpuBackend be;
  std::mt19937 g(31);
  const int64_t T = 4, heads = 3, d = 16, r = 8;
  const double theta = 10000.0;
  const std::vector<int32_t> ps = {0, 1, 37, 1000};
  const std::vector<float> xs = rand_bf16(g, T * heads * d, -2.0f, 2.0f);
  Tensor x = make_tensor(be, DType::bf16, {T, heads, d}, xs);
  Tensor pos = make_i32(be, {T}, ps);
  be.rope(x, pos, r, theta, false);
  const std::vector<float> o = to_floats(be, x);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> row(xs.begin() + t * heads * d, xs.begin() + (t + 1) * heads * d);
    const std::vector<double> ref = naive_rope(row, heads, d, r, ps[static_cast<size_t>(t)], theta, false);
    int changed = 0;
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < d; ++i) {
        const size_t li = static_cast<size_t>(h * d + i), gi = static_cast<size_t>(t * heads * d) + li;
        if (i < d - r) {
          EXPECT_EQ(o[gi], xs[gi]) << "non-rope dim changed: t " << t << " h " << h << " i " << i;
        } else {
          const size_t p0 = li - static_cast<size_t>((i - (d - r)) % 2);  // first of the pair
          const double mag = std::hypot(static_cast<double>(row[p0]), static_cast<double>(row[p0 + 1]));
          EXPECT_NEAR(o[gi], ref[li], kBf16Ulp * mag + 1e-6) << "t " << t << " h " << h << " i " << i;
          changed += o[gi] != xs[gi];
        }
      }
    if (ps[static_cast<size_t>(t)] == 0) {
      EXPECT_EQ(changed, 0) << "position 0 must be the identity";
    } else {
      EXPECT_GT(changed, 0);
    }
  }
}

TEST(CpuRope, InverseUndoesForward) {
  CpuBackend be;
  std::mt19937 g(32);
  const int64_t T = 3, heads = 2, d = 16, r = 16;
  const std::vector<int32_t> ps = {3, 250, 4095};
  const std::vector<float> xs = rand_bf16(g, T * heads * d, -2.0f, 2.0f);
  Tensor x = make_tensor(be, DType::bf16, {T, heads, d}, xs);
  Tensor pos = make_i32(be, {T}, ps);
  be.rope(x, pos, r, 10000.0, false);
  const std::vector<float> mid = to_floats(be, x);
  be.rope(x, pos, r, 10000.0, true);
  const std::vector<float> o = to_floats(be, x);
  int moved = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t p0 = i - (i % 2);
    const double mag = std::hypot(static_cast<double>(xs[p0]), static_cast<double>(xs[p0 + 1]));
    EXPECT_NEAR(o[i], xs[i], 3 * kBf16Ulp * mag + 1e-6) << i;  // two bf16 roundings of the pair
    moved += std::fabs(mid[i] - xs[i]) > 0.05f;
  }
  EXPECT_GT(moved, static_cast<int>(xs.size()) / 4);  // the forward pass really rotated

  // The inverse alone is the rotation by -pos: check it against the naive conjugate too.
  Tensor y = make_tensor(be, DType::bf16, {T, heads, d}, xs);
  be.rope(y, pos, r, 10000.0, true);
  const std::vector<float> yo = to_floats(be, y);
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<float> row(xs.begin() + t * heads * d, xs.begin() + (t + 1) * heads * d);
    const std::vector<double> ref = naive_rope(row, heads, d, r, ps[static_cast<size_t>(t)], 10000.0, true);
    for (int64_t i = 0; i < heads * d; ++i) {
      const size_t li = static_cast<size_t>(i), p0 = li - (li % 2);
      const double mag = std::hypot(static_cast<double>(row[p0]), static_cast<double>(row[p0 + 1]));
      EXPECT_NEAR(yo[static_cast<size_t>(t * heads * d + i)], ref[li], kBf16Ulp * mag + 1e-5)
          << t << "," << i;
    }
  }
}

// ---- kv_qdq

// Naive e4m3fn rounding (RNE, 3 mantissa bits, subnormal spacing 2^-9, max 448) of |v| <= 448.
double naive_e4m3(double v) {
  if (v == 0.0) return 0.0;
  const double a = std::fabs(v);
  const int e = std::max(std::ilogb(a), -6);
  const double ulp = std::ldexp(1.0, e - 3);
  const double q = std::min(std::nearbyint(a / ulp) * ulp, 448.0);
  return std::copysign(q, v);
}

// Naive per-block qdq with the power-of-two scale 2^ceil(log2(max(amax, 1e-4) / 448)).
std::vector<double> naive_qdq(const std::vector<float>& x, size_t block) {
  std::vector<double> y(x.size());
  for (size_t b0 = 0; b0 < x.size(); b0 += block) {
    double amax = 0.0;
    for (size_t i = b0; i < b0 + block; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
    const double s = std::exp2(std::ceil(std::log2(std::max(amax, 1e-4) / 448.0)));
    for (size_t i = b0; i < b0 + block; ++i) y[i] = naive_e4m3(std::clamp(x[i] / s, -448.0, 448.0)) * s;
  }
  return y;
}

TEST(CpuKvQdq, HandBlocks) {
  CpuBackend be;
  std::vector<float> x(6 * 32, 0.0f);
  auto blk = [&](int b, int i) -> float& { return x[static_cast<size_t>(b * 32 + i)]; };
  // Block 0: amax exactly 448 -> scale 1; 1.0625 -> 1.0 and 1.1875 -> 1.25 (RNE); -3.296875 -> -3.25;
  // 300 -> 288 (spacing 32 in [256, 512)).
  blk(0, 0) = 448.0f, blk(0, 1) = 1.0625f, blk(0, 2) = 1.1875f, blk(0, 3) = -3.296875f, blk(0, 4) = 300.0f;
  // Block 1: all zero -> stays zero (scale from the 1e-4 floor).
  // Block 2: amax 1.0 -> scale 2^ceil(log2(1/448)) = 2^-8; values snap to the e4m3 grid times 2^-8:
  // bf16(0.3) = 0.30078125 = 77 * 2^-8 -> 80 * 2^-8; bf16(-0.7) = -179 * 2^-8 -> -176 * 2^-8;
  // bf16(0.01) = 2.5625 * 2^-8 -> 2.5 * 2^-8.
  blk(2, 0) = 1.0f, blk(2, 5) = 0.30078125f, blk(2, 6) = -0.69921875f, blk(2, 7) = 0.010009765625f;
  // Block 3: amax 450 -> scale 2: 450 -> 224 * 2 = 448; 2.125 -> 1.0625 -> 1.0 -> 2.0; 3.0 stays.
  blk(3, 31) = 450.0f, blk(3, 1) = 2.125f, blk(3, 2) = 3.0f;
  // Blocks 4 and 5: amax 896 = 2 * 448 is an exact power-of-two ratio -> scale 2 (not 4), so
  // 1.125 * 2^-5 / 2 = 1.125 * 2^-6 is a normal e4m3 value and survives; with amax 900 the scale is 4 and
  // 1.125 * 2^-7 = 4.5 subnormal units rounds to 4 -> 2^-7 * 4 = 0.03125.
  blk(4, 3) = 896.0f, blk(4, 4) = 0.03515625f;
  blk(5, 3) = 900.0f, blk(5, 4) = 0.03515625f;
  Tensor t = make_tensor(be, DType::bf16, {3, 64}, x);
  be.kv_qdq(t, 32);
  const std::vector<float> o = to_floats(be, t);
  auto got = [&](int b, int i) { return o[static_cast<size_t>(b * 32 + i)]; };
  EXPECT_EQ(got(0, 0), 448.0f);
  EXPECT_EQ(got(0, 1), 1.0f);
  EXPECT_EQ(got(0, 2), 1.25f);
  EXPECT_EQ(got(0, 3), -3.25f);
  EXPECT_EQ(got(0, 4), 288.0f);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(got(1, i), 0.0f) << i;
  EXPECT_EQ(got(2, 0), 1.0f);
  EXPECT_EQ(got(2, 5), 80.0f / 256.0f);
  EXPECT_EQ(got(2, 6), -176.0f / 256.0f);
  EXPECT_EQ(got(2, 7), 2.5f / 256.0f);
  EXPECT_EQ(got(3, 31), 448.0f);
  EXPECT_EQ(got(3, 1), 2.0f);
  EXPECT_EQ(got(3, 2), 3.0f);
  EXPECT_EQ(got(4, 3), 896.0f);
  EXPECT_EQ(got(4, 4), 0.03515625f);
  EXPECT_EQ(got(5, 3), 896.0f);
  EXPECT_EQ(got(5, 4), 0.03125f);
  for (int b = 0; b < 6; ++b)  // untouched zeros stay zero
    for (int i = 8; i < 31; ++i) EXPECT_EQ(got(b, i), 0.0f) << b << "," << i;
}

TEST(CpuKvQdq, TinyBlockUsesTheScaleFloor) {
  CpuBackend be;
  // amax 2^-20 < 1e-4: the scale is 2^ceil(log2(1e-4 / 448)) = 2^-22, not 2^-28. Then 3 * 2^-32 is
  // 1.5 subnormal units (2^-9 * 2^-22) and rounds to 2 -> 2^-30; without the floor it would be exact.
  std::vector<float> x(32, 0.0f);
  x[0] = 0x1p-20f;
  x[1] = 3 * 0x1p-32f;
  Tensor t = make_tensor(be, DType::bf16, {1, 32}, x);
  be.kv_qdq(t, 32);
  const std::vector<float> o = to_floats(be, t);
  EXPECT_EQ(o[0], 0x1p-20f);
  EXPECT_EQ(o[1], 0x1p-30f);
}

TEST(CpuKvQdq, MatchesNaiveIsIdempotentAndBlocksAreIndependent) {
  CpuBackend be;
  std::mt19937 g(41);
  const int64_t T = 3, n = 128;
  std::vector<float> x(T * n);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f), e(-12.0f, 10.0f);
  for (size_t b0 = 0; b0 < x.size(); b0 += 32) {
    const float mag = std::exp2(e(g));  // every block its own magnitude
    for (size_t i = b0; i < b0 + 32; ++i) x[i] = round_bf16(u(g) * mag);
  }
  Tensor t = make_tensor(be, DType::bf16, {T, n}, x);
  be.kv_qdq(t, 32);
  const std::vector<float> once = to_floats(be, t);
  const std::vector<double> ref = naive_qdq(x, 32);
  int changed = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(once[i], ref[i]) << i;
    changed += once[i] != x[i];
  }
  EXPECT_GT(changed, 0);

  be.kv_qdq(t, 32);
  EXPECT_EQ(to_floats(be, t), once) << "qdq twice must equal once";

  // Scaling block 5 up by 1000 changes only block 5.
  std::vector<float> x2 = x;
  for (size_t i = 5 * 32; i < 6 * 32; ++i) x2[i] = round_bf16(x2[i] * 1000.0f);
  Tensor t2 = make_tensor(be, DType::bf16, {T, n}, x2);
  be.kv_qdq(t2, 32);
  const std::vector<float> o2 = to_floats(be, t2);
  for (size_t i = 0; i < x.size(); ++i) {
    if (i / 32 == 5) continue;
    EXPECT_EQ(o2[i], once[i]) << i;
  }
}

}  // namespace
}  // namespace dspark
