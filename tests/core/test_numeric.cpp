// Number formats against hand-worked values (bit patterns from the formats' definitions).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3F80);
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f), 0x3F80);             // halfway: down to the even mantissa
  EXPECT_EQ(float_to_bf16(1.0f + 3 * 0x1p-8f), 0x3F82);         // halfway: up to the even mantissa
  EXPECT_EQ(float_to_bf16(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);  // above halfway
  EXPECT_EQ(float_to_bf16(-2.0f), 0xC000);
  EXPECT_FLOAT_EQ(bf16_to_float(0x4049), 3.140625f);
  EXPECT_TRUE(std::isnan(bf16_to_float(float_to_bf16(NAN))));
}

TEST(F16, KnownValues) {
  EXPECT_EQ(float_to_f16(1.0f), 0x3C00);
  EXPECT_EQ(float_to_f16(65504.0f), 0x7BFF);
  EXPECT_EQ(float_to_f16(70000.0f), 0x7C00);  // overflow to inf
  EXPECT_EQ(float_to_f16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(float_to_f16(0.1f), 0x2E66);
  EXPECT_EQ(float_to_f16(-0.0f), 0x8000);
  EXPECT_FLOAT_EQ(f16_to_float(0x3555), 0.333251953125f);
  EXPECT_FLOAT_EQ(f16_to_float(0x0200), 0x1p-15f);
}

TEST(E4m3, EncodesKnownValues) {
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(-1.0f), 0xB8);
  EXPECT_EQ(float_to_e4m3(0.5f), 0x30);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7E);
  EXPECT_EQ(float_to_e4m3(0x1p-6f), 0x08);  // smallest normal
  EXPECT_EQ(float_to_e4m3(0x1p-9f), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
}

TEST(E4m3, RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(round_e4m3(1.0625f), 1.0f);   // halfway between 1 and 1.125: even mantissa 0
  EXPECT_EQ(round_e4m3(1.1875f), 1.25f);  // halfway between 1.125 and 1.25: even mantissa 2
  EXPECT_EQ(round_e4m3(1.07f), 1.125f);
  EXPECT_EQ(round_e4m3(15.5f), 16.0f);  // carries into the next binade
  EXPECT_EQ(round_e4m3(1000.0f), 448.0f);
  EXPECT_EQ(round_e4m3(-464.0f), -448.0f);
  EXPECT_EQ(round_e4m3(3 * 0x1p-10f), 0x1p-8f);  // subnormal halfway 1.5 units: up to 2 units
  EXPECT_EQ(round_e4m3(0x1p-10f), 0.0f);         // half a unit: down to 0 (even)
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
}

TEST(E4m3, EveryCodeRoundTrips) {
  for (int c = 0; c < 256; ++c) {
    const uint8_t code = static_cast<uint8_t>(c);
    if ((code & 0x7F) == 0x7F) continue;  // NaN
    if (code == 0x80) continue;           // -0 encodes as +0's sign-flipped twin; checked below
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(code)), code) << c;
  }
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
}

TEST(E4m3, EncodesToTheNearestCodeByExhaustiveSearch) {
  // Every bf16 value and a million random float bit patterns against a search over the 127 finite
  // magnitudes (a tie to the even code, i.e. the even mantissa; above 448 the largest, 0x7e).
  std::vector<float> mags;
  for (int c = 0; c < 127; ++c) {
    const int exp = c >> 3, man = c & 7;
    mags.push_back(exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(1.0f + man / 8.0f, exp - 7));
  }
  auto nearest = [&](float f) {
    const float a = std::fabs(f);
    int best = 0;
    for (int c = 1; c < 127; ++c) {
      const float d = std::fabs(a - mags[c]), db = std::fabs(a - mags[best]);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return static_cast<uint8_t>((std::signbit(f) ? 0x80 : 0) | best);
  };
  std::mt19937 rng(1);
  for (uint32_t i = 0; i < 0x10000 + 1000000; ++i) {
    const float f = i < 0x10000 ? bf16_to_float(static_cast<bf16_t>(i))
                                : std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_e4m3(f), nearest(f)) << f;
  }
}

TEST(E8m0AndE2m1, Decode) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(130), 8.0f);
  EXPECT_EQ(e8m0_to_float(0), 0x1p-127f);
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
  EXPECT_EQ(e2m1_to_float(0x7), 6.0f);
  EXPECT_EQ(e2m1_to_float(0xF), -6.0f);
  EXPECT_EQ(e2m1_to_float(0x3), 1.5f);
  EXPECT_EQ(e2m1_to_float(0x1), 0.5f);
}

}  // namespace
}  // namespace dspark
