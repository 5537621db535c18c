// Scalar number formats of the drafter: bf16, fp16, fp8 e4m3fn, e8m0 scales, fp4 e2m1.
// Every conversion rounds to nearest even, as the reference numerics do.
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace dspark {

using bf16_t = uint16_t;  // raw bits of a bfloat16
using f16_t = uint16_t;   // raw bits of an IEEE half

inline float bf16_to_float(bf16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline bf16_t float_to_bf16(float f) {
  uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return static_cast<bf16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even on the dropped 16 bits
  return static_cast<bf16_t>(u >> 16);
}

// The value a float takes once stored as bf16.
inline float round_bf16(float f) {
  return bf16_to_float(float_to_bf16(f));
}

float f16_to_float(f16_t h);
f16_t float_to_f16(float f);
inline float round_f16(float f) {
  return f16_to_float(float_to_f16(f));
}

// fp8 e4m3fn: bias 7, no infinities, 0x7f/0xff are NaN, largest finite 448.
constexpr float kE4m3Max = 448.0f;
float e4m3_to_float(uint8_t v);
// Round to nearest even with saturation to +-448 (NaN stays NaN).
uint8_t float_to_e4m3(float f);
// The value of f once rounded through e4m3 (saturating).
inline float round_e4m3(float f) {
  return e4m3_to_float(float_to_e4m3(f));
}

// e8m0 scale: 2^(e - 127); 0xff is NaN. Built from its bits: the exponent field e, or for e = 0 the
// subnormal 2^-127 (the quantised products call this per block, so no libm call).
inline float e8m0_to_float(uint8_t e) {
  if (e == 0xff) return std::nanf("");
  return std::bit_cast<float>(e == 0 ? 0x00400000u : static_cast<uint32_t>(e) << 23);
}

// fp4 e2m1 nibble: bit 3 = sign, magnitudes 0, .5, 1, 1.5, 2, 3, 4, 6.
inline float e2m1_to_float(uint8_t nibble) {
  static constexpr float kMag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  const float m = kMag[nibble & 7u];
  return (nibble & 8u) ? -m : m;
}

}  // namespace dspark
