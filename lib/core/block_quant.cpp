#include "lib/core/block_quant.hpp"

#include <algorithm>
#include <bit>
#include <cmath>

#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

// 1 / 2^(e - 127), exact for every scale byte (2^-127 is a float subnormal), so x * inverse_scale(e) is x
// divided by the scale, bit for bit.
float inverse_scale(uint8_t e) {
  return std::ldexp(1.0f, 127 - static_cast<int>(e));
}

// The codes' magnitudes are 0, 0.5, 1, 1.5, 2, 3, 4, 6: the code is the number of midpoints below |f|, a
// midpoint itself going to the even code (>= where the upper code is even, > where it is odd). NaN gives 0.
inline uint8_t e2m1_code(float f) {
  const float a = std::fabs(f);
  const int c =
      (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return static_cast<uint8_t>((std::signbit(f) ? 8 : 0) | c);
}

}  // namespace

int ceil_pow2_exponent(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v);
  const int exp_field = static_cast<int>((bits >> 23) & 0xffu);
  const bool mantissa = (bits & 0x7fffffu) != 0;
  if (exp_field == 0) return mantissa ? -126 : -127;  // subnormals round up to the smallest normal
  return exp_field - 127 + (mantissa ? 1 : 0);
}

float activation_block_scale(float amax) {
  constexpr float kInv448 = 1.0f / kE4m3Max;  // fp32(1/448), as the reference kernels multiply by it
  return std::ldexp(1.0f, ceil_pow2_exponent(std::max(amax, 1e-4f) * kInv448));
}

void quantize_activation_row(const float* x, int64_t n, int64_t block, float* out) {
  for (int64_t b0 = 0; b0 < n; b0 += block) {
    const int64_t b1 = std::min(n, b0 + block);
    float amax = 0.0f;
    for (int64_t i = b0; i < b1; ++i) amax = std::max(amax, std::fabs(x[i]));
    const float s = activation_block_scale(amax);
    for (int64_t i = b0; i < b1; ++i)
      out[i] = e4m3_to_float(float_to_e4m3(std::clamp(x[i] / s, -kE4m3Max, kE4m3Max))) * s;
  }
}

uint8_t float_to_e2m1(float f) {
  return e2m1_code(f);
}

uint8_t weight_scale_byte(float amax, float max_code) {
  return static_cast<uint8_t>(std::clamp(ceil_pow2_exponent(amax / max_code) + 127, 0, 254));
}

void quantize_fp8_block(const float* w, int64_t rows, int64_t cols, int64_t block, uint8_t* codes,
                        uint8_t* scales) {
  const int64_t bcols = (cols + block - 1) / block;
  for (int64_t br = 0; br * block < rows; ++br) {
    for (int64_t bc = 0; bc < bcols; ++bc) {
      const int64_t r1 = std::min(rows, (br + 1) * block), c1 = std::min(cols, (bc + 1) * block);
      float amax = 0.0f;
      for (int64_t r = br * block; r < r1; ++r)
        for (int64_t c = bc * block; c < c1; ++c) amax = std::max(amax, std::fabs(w[r * cols + c]));
      const uint8_t e = weight_scale_byte(amax, kE4m3Max);
      scales[br * bcols + bc] = e;
      const float inv = inverse_scale(e);
      for (int64_t r = br * block; r < r1; ++r)
        for (int64_t c = bc * block; c < c1; ++c) codes[r * cols + c] = float_to_e4m3(w[r * cols + c] * inv);
    }
  }
}

float fp8_block_value(const uint8_t* codes, const uint8_t* scales, int64_t cols, int64_t block, int64_t r,
                      int64_t c) {
  const int64_t bcols = (cols + block - 1) / block;
  return e4m3_to_float(codes[r * cols + c]) * e8m0_to_float(scales[(r / block) * bcols + c / block]);
}

void quantize_fp4(const float* w, int64_t rows, int64_t cols, uint8_t* packed, uint8_t* scales) {
  const int64_t nblocks = cols / kFp4Block;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < nblocks; ++b) {
      const float* x = w + r * cols + b * kFp4Block;
      float amax = 0.0f;
      for (int64_t i = 0; i < kFp4Block; ++i) amax = std::max(amax, std::fabs(x[i]));
      const uint8_t e = weight_scale_byte(amax, kE2m1Max);
      scales[r * nblocks + b] = e;
      const float inv = inverse_scale(e);
      uint8_t codes[kFp4Block];  // coded first, then packed: the first loop vectorises
      for (int64_t i = 0; i < kFp4Block; ++i) codes[i] = e2m1_code(x[i] * inv);
      uint8_t* out = packed + r * (cols / 2) + b * (kFp4Block / 2);
      for (int64_t i = 0; i < kFp4Block / 2; ++i)
        out[i] = static_cast<uint8_t>(codes[2 * i] | (codes[2 * i + 1] << 4));
    }
  }
}

float fp4_value(const uint8_t* packed, const uint8_t* scales, int64_t cols, int64_t r, int64_t c) {
  const uint8_t byte = packed[r * (cols / 2) + c / 2];
  const uint8_t code = (c % 2 == 0) ? (byte & 0xfu) : (byte >> 4);
  return e2m1_to_float(code) * e8m0_to_float(scales[r * (cols / kFp4Block) + c / kFp4Block]);
}

}  // namespace dspark
