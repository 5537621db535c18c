// first_non_finite against std::isfinite of the decoded values: every bf16 and f16 bit pattern (alone, and
// inside a whole chunk), f32's edges, the e4m3 / e8m0 NaN codes, and a bad element at every place relative to
// the scan's chunks.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "lib/core/non_finite.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

TEST(NonFinite, EveryBf16AndF16PatternMatchesIsFinite) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const auto v = static_cast<uint16_t>(b);
    const int64_t want_bf16 = std::isfinite(bf16_to_float(v)) ? -1 : 0;
    const int64_t want_f16 = std::isfinite(f16_to_float(v)) ? -1 : 0;
    ASSERT_EQ(first_non_finite(DType::bf16, &v, 1), want_bf16) << std::hex << b;
    ASSERT_EQ(first_non_finite(DType::f16, &v, 1), want_f16) << std::hex << b;
  }
}

TEST(NonFinite, EveryBf16AndF16PatternInsideAWholeChunk) {
  // The same patterns where the chunked test (not the tail's element loop) meets them: one element of a whole
  // chunk of zeros, in its middle and at its last place, the copy included.
  constexpr int64_t n = 2048;
  std::vector<uint16_t> chunk(n, 0), copy(n);
  for (const int64_t at : {int64_t{1000}, n - 1}) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const auto v = static_cast<uint16_t>(b);
      chunk[static_cast<size_t>(at)] = v;
      const int64_t want_bf16 = std::isfinite(bf16_to_float(v)) ? -1 : at;
      const int64_t want_f16 = std::isfinite(f16_to_float(v)) ? -1 : at;
      ASSERT_EQ(first_non_finite(DType::bf16, chunk.data(), n), want_bf16) << std::hex << b;
      ASSERT_EQ(first_non_finite(DType::f16, chunk.data(), n), want_f16) << std::hex << b;
      ASSERT_EQ(copy_bf16_first_non_finite(copy.data(), chunk.data(), n), want_bf16) << std::hex << b;
      ASSERT_EQ(copy[static_cast<size_t>(at)], v);
    }
    chunk[static_cast<size_t>(at)] = 0;
  }
}

TEST(NonFinite, F32Edges) {
  const float finite[] = {0.0f,
                          -0.0f,
                          1.0f,
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::denorm_min()};
  for (float f : finite) EXPECT_EQ(first_non_finite(DType::f32, &f, 1), -1) << f;
  const float bad[] = {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                       std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0xff800001u)};
  for (float f : bad) EXPECT_EQ(first_non_finite(DType::f32, &f, 1), 0) << f;
}

TEST(NonFinite, Fp8Codes) {
  for (uint32_t b = 0; b < 256; ++b) {
    const auto v = static_cast<uint8_t>(b);
    EXPECT_EQ(first_non_finite(DType::f8_e4m3, &v, 1), std::isnan(e4m3_to_float(v)) ? 0 : -1) << b;
    EXPECT_EQ(first_non_finite(DType::f8_e8m0, &v, 1), b == 255 ? 0 : -1) << b;
  }
}

TEST(NonFinite, IntegersAreNeverNonFinite) {
  const std::vector<uint8_t> ones(64, 0xff);
  for (DType t : {DType::i8, DType::u8, DType::i16, DType::i32, DType::i64})
    EXPECT_EQ(first_non_finite(t, ones.data(), static_cast<int64_t>(64 / dtype_size(t))), -1);
}

TEST(NonFinite, FindsTheFirstBadElementAnywhereAndUnaligned) {
  // 3 chunks of 2048 bf16 and a tail; the buffer starts one byte into the allocation (no alignment).
  const int64_t n = 3 * 2048 + 77;
  for (int64_t at :
       {int64_t{0}, int64_t{1}, int64_t{2047}, int64_t{2048}, int64_t{4097}, n - 78, n - 77, n - 1}) {
    std::vector<uint8_t> raw(static_cast<size_t>(2 * n + 1), 0);
    auto put = [&](int64_t i, uint16_t v) { std::memcpy(raw.data() + 1 + 2 * i, &v, 2); };
    for (int64_t i = 0; i < n; ++i) put(i, 0x7f7f);  // the largest finite bf16 everywhere
    EXPECT_EQ(first_non_finite(DType::bf16, raw.data() + 1, n), -1);
    put(at, 0x7f80);                      // +Inf
    if (at + 5 < n) put(at + 5, 0xffc1);  // a later NaN does not hide the first
    EXPECT_EQ(first_non_finite(DType::bf16, raw.data() + 1, n), at) << at;
    EXPECT_EQ(first_non_finite(DType::bf16, raw.data() + 1, at), -1) << "before " << at;
  }
}

TEST(NonFinite, CopyFindsTheFirstBadElementAndCopiesEverything) {
  // The same places as above; the copy must equal the source bit for bit whether or not one is bad.
  const int64_t n = 3 * 2048 + 77;
  for (int64_t at : {int64_t{-1}, int64_t{0}, int64_t{1}, int64_t{2047}, int64_t{2048}, int64_t{4097}, n - 78,
                     n - 77, n - 1}) {
    std::vector<uint16_t> src(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) src[static_cast<size_t>(i)] = static_cast<uint16_t>(0x3f80u + i % 97);
    if (at >= 0) src[static_cast<size_t>(at)] = 0xff80;                    // -Inf
    if (at >= 0 && at + 5 < n) src[static_cast<size_t>(at + 5)] = 0x7fc0;  // a later NaN
    std::vector<uint8_t> raw(static_cast<size_t>(2 * n + 2), 0xaa);        // dst one byte in, one byte after
    EXPECT_EQ(copy_bf16_first_non_finite(raw.data() + 1, src.data(), n), at) << at;
    EXPECT_EQ(std::memcmp(raw.data() + 1, src.data(), static_cast<size_t>(2 * n)), 0) << at;
    EXPECT_EQ(raw[0], 0xaa);
    EXPECT_EQ(raw.back(), 0xaa) << "written past the end";
  }
  uint16_t one = 0;
  EXPECT_EQ(copy_bf16_first_non_finite(&one, &one + 1, 0), -1);  // nothing to copy
}

}  // namespace
}  // namespace dspark
