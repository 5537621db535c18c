// SPEC §3's block quantisation against hand-worked blocks, the format definitions, bounds that follow from
// them, and bytes of the released DeepSeek-V4.1-Flash checkpoint (golden/tiny-v41-fp8/real_wkv_probe.json).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <vector>

#include "lib/core/block_quant.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

TEST(BlockQuant, CeilPow2ExponentFromTheBits) {
  EXPECT_EQ(ceil_pow2_exponent(1.0f), 0);
  EXPECT_EQ(ceil_pow2_exponent(1.5f), 1);
  EXPECT_EQ(ceil_pow2_exponent(0.75f), 0);
  EXPECT_EQ(ceil_pow2_exponent(0x1p-7f), -7);
  EXPECT_EQ(ceil_pow2_exponent(std::nextafter(0x1p-7f, 1.0f)), -6);
  EXPECT_EQ(ceil_pow2_exponent(0x1p-140f), -126);  // subnormal: the smallest normal power
  EXPECT_EQ(ceil_pow2_exponent(0.0f), -127);
}

TEST(BlockQuant, ActivationScalesOfHandWorkedBlocks) {
  // 1e-4 * fp32(1/448) = 2.23e-7 lies in (2^-23, 2^-22]: the floor of amax decides an all-zero block.
  EXPECT_EQ(activation_block_scale(0.0f), 0x1p-22f);
  EXPECT_EQ(activation_block_scale(1.0f), 0x1p-8f);  // 1/448 = 0.00223 in (2^-9, 2^-8]
  EXPECT_EQ(activation_block_scale(3.5f), 0x1p-7f);  // 3.5 = 448 * 2^-7 exactly: no step up
  EXPECT_EQ(activation_block_scale(3.6f), 0x1p-6f);
  EXPECT_EQ(activation_block_scale(448.0f), 1.0f);
}

TEST(BlockQuant, ActivationRowQuantisesEachBlockWithItsOwnScale) {
  // Block 0: amax 3.5 -> s = 2^-7; 3.5 -> 448; -1 -> -128; 0.01 * 128 = 1.28 -> e4m3 1.25 -> 1.25 / 128.
  // Block 1: amax 0.5 -> s = 2^-9 (0.5 / 448 = 0.00112 in (2^-10, 2^-9]); 0.3 * 512 = 153.6 -> e4m3 grid of
  // 16 in [128, 256): 160 -> 160 / 512 = 0.3125.
  std::vector<float> x(64, 0.0f), out(64);
  x[0] = 3.5f, x[1] = -1.0f, x[2] = 0.01f, x[32] = 0.5f, x[33] = 0.3f;
  quantize_activation_row(x.data(), 64, 32, out.data());
  EXPECT_EQ(out[0], 3.5f);
  EXPECT_EQ(out[1], -1.0f);
  EXPECT_EQ(out[2], 1.25f / 128.0f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_EQ(out[32], 0.5f);
  EXPECT_EQ(out[33], 0.3125f);
}

TEST(BlockQuant, E2m1RoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(float_to_e2m1(0.25f), 0x0);  // between 0 (code 0) and 0.5 (code 1): even
  EXPECT_EQ(float_to_e2m1(0.75f), 0x2);  // between 0.5 (1) and 1 (2)
  EXPECT_EQ(float_to_e2m1(1.25f), 0x2);  // between 1 (2) and 1.5 (3)
  EXPECT_EQ(float_to_e2m1(1.75f), 0x4);  // between 1.5 (3) and 2 (4)
  EXPECT_EQ(float_to_e2m1(2.5f), 0x4);
  EXPECT_EQ(float_to_e2m1(3.5f), 0x6);
  EXPECT_EQ(float_to_e2m1(5.0f), 0x6);
  EXPECT_EQ(float_to_e2m1(5.1f), 0x7);
  EXPECT_EQ(float_to_e2m1(100.0f), 0x7);
  EXPECT_EQ(float_to_e2m1(-1.5f), 0xB);
  for (uint8_t c = 0; c < 16; ++c) {
    if (c == 8) continue;  // -0
    EXPECT_EQ(float_to_e2m1(e2m1_to_float(c)), c) << int(c);
  }
}

TEST(BlockQuant, E2m1IsTheNearestCodeForEveryBf16Value) {
  // Nearest magnitude by search, a tie to the even code, saturating at 6: every bf16 bit pattern (the
  // synthetic writer's inputs) and its halves, the values a scale divides them into.
  static const float kMag[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  auto nearest = [](float f) {
    const float a = std::min(std::fabs(f), 6.0f);
    int best = 0;
    for (int c = 1; c < 8; ++c) {
      const float d = std::fabs(a - kMag[c]), db = std::fabs(a - kMag[best]);
      if (d < db || (d == db && c % 2 == 0)) best = c;
    }
    return static_cast<uint8_t>((std::signbit(f) ? 8 : 0) | best);
  };
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const float f = bf16_to_float(static_cast<bf16_t>(b));
    if (std::isnan(f)) continue;
    ASSERT_EQ(float_to_e2m1(f), nearest(f)) << f;
    ASSERT_EQ(float_to_e2m1(f * 0.75f), nearest(f * 0.75f)) << f * 0.75f;
  }
}

TEST(BlockQuant, WeightScalesOfBf16BlocksAreSpecsActivationStyleScales) {
  // SPEC §3 writes the re-quantised head's weight scale as 2^ceil(log2(amax * fp32(1/448))); the weight
  // rule divides (amax / 448). For every positive finite bf16 amax they are the same power of two.
  for (uint32_t b = 1; b < 0x7f80; ++b) {
    const float amax = bf16_to_float(static_cast<bf16_t>(b));
    ASSERT_EQ(int(weight_scale_byte(amax, kE4m3Max)),
              std::clamp(ceil_pow2_exponent(amax * (1.0f / kE4m3Max)) + 127, 0, 254))
        << amax;
  }
}

TEST(BlockQuant, Fp4NibbleOrderOnAHandMadeByte) {
  // Byte 0x7A: low nibble 0xA (-1.0) is element 0, high nibble 0x7 (6.0) element 1; scale 2^(126-127) = 0.5.
  std::vector<uint8_t> packed(16, 0), scales = {126};
  packed[0] = 0x7A;
  EXPECT_EQ(fp4_value(packed.data(), scales.data(), 32, 0, 0), -0.5f);
  EXPECT_EQ(fp4_value(packed.data(), scales.data(), 32, 0, 1), 3.0f);
  EXPECT_EQ(fp4_value(packed.data(), scales.data(), 32, 0, 2), 0.0f);
}

TEST(BlockQuant, Fp8BlockScalesAndCodesOfAHandWorkedBlock) {
  // A 2 x 3 weight in one 32 x 32 block: amax 7 -> 7 / 448 = 0.0156 in (2^-7, 2^-6] -> byte 121, s = 2^-6;
  // codes are w * 64: 7 -> 448, -0.5 -> -32, 0.01 -> 0.64 -> e4m3 grid of 2^-4 in [0.5, 1) -> 0.625.
  const std::vector<float> w = {7.0f, -0.5f, 0.01f, 0.0f, 1.0f, -7.0f};
  std::vector<uint8_t> codes(6), scales(1);
  quantize_fp8_block(w.data(), 2, 3, 32, codes.data(), scales.data());
  EXPECT_EQ(scales[0], 121);
  EXPECT_EQ(codes[0], 0x7E);  // 448
  EXPECT_EQ(fp8_block_value(codes.data(), scales.data(), 3, 32, 0, 0), 7.0f);
  EXPECT_EQ(fp8_block_value(codes.data(), scales.data(), 3, 32, 0, 1), -0.5f);
  EXPECT_EQ(fp8_block_value(codes.data(), scales.data(), 3, 32, 0, 2), 0.625f / 64.0f);
  EXPECT_EQ(fp8_block_value(codes.data(), scales.data(), 3, 32, 1, 2), -7.0f);
}

TEST(BlockQuant, QuantiseThenDequantiseStaysWithinHalfAQuantum) {
  // e4m3 keeps 3 mantissa bits: a normal code is within 2^-4 relative, a subnormal within half of 2^-9 * s.
  // e2m1 codes are spaced at most 2 apart above 4 (relative 1/4 at worst below 6), 0.5 below 2.
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.05f);
  const int64_t rows = 64, cols = 96;
  std::vector<float> w(rows * cols);
  for (float& v : w) v = nd(rng);
  w[5] = 0.9f;  // one large element: its block's others become small codes
  std::vector<uint8_t> codes(rows * cols), scales(2 * 3);
  quantize_fp8_block(w.data(), rows, cols, 32, codes.data(), scales.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = e8m0_to_float(scales[(r / 32) * 3 + c / 32]);
      const float v = fp8_block_value(codes.data(), scales.data(), cols, 32, r, c), x = w[r * cols + c];
      EXPECT_LE(std::fabs(v - x), std::max(std::fabs(x) * 0x1p-4f, 0x1p-10f * s)) << r << "," << c;
      EXPECT_LE(std::fabs(x) / s, 448.0f);
    }
  std::vector<uint8_t> packed(rows * cols / 2), s4(rows * cols / 32);
  quantize_fp4(w.data(), rows, cols, packed.data(), s4.data());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const float s = e8m0_to_float(s4[r * (cols / 32) + c / 32]);
      const float v = fp4_value(packed.data(), s4.data(), cols, r, c), x = w[r * cols + c];
      const float a = std::fabs(x) / s;
      const float half_gap = a < 2.0f ? 0.25f : (a < 4.0f ? 0.5f : 1.0f);
      EXPECT_LE(std::fabs(v - x), half_gap * s) << r << "," << c;
      EXPECT_LE(a, 6.0f);
    }
}

TEST(BlockQuant, BytesOfTheReleasedCheckpointDecodeToTheirValues) {
  const std::filesystem::path probe =
      std::filesystem::path(DSPARK_SHARED_DIR) / "golden" / "tiny-v41-fp8" / "real_wkv_probe.json";
  if (!std::filesystem::exists(probe)) GTEST_SKIP() << "no probe at " << probe;
  std::ifstream in(probe);
  const nlohmann::json j = nlohmann::json::parse(in);
  const std::string hex = j["bytes_hex"];
  ASSERT_EQ(hex.size(), 64u);
  std::vector<uint8_t> codes(32);
  for (size_t i = 0; i < 32; ++i)
    codes[i] = static_cast<uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
  const std::vector<uint8_t> scales = {static_cast<uint8_t>(j["scale_byte"].get<int>())};
  EXPECT_EQ(e8m0_to_float(scales[0]), j["scale"].get<float>());
  const std::vector<float> want = j["oracle_all32"], first8 = j["expected_first8"];
  for (int64_t c = 0; c < 32; ++c) {
    const float v = fp8_block_value(codes.data(), scales.data(), 32, 32, 0, c);
    EXPECT_EQ(v, want[static_cast<size_t>(c)]) << c;
    if (c < 8) {
      EXPECT_EQ(v, first8[static_cast<size_t>(c)]) << c;
    }
  }
}

}  // namespace
}  // namespace dspark
