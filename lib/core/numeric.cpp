#include "lib/core/numeric.hpp"

namespace dspark {

float f16_to_float(f16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24
    const float v = std::ldexp(static_cast<float>(man), -24);
    return sign ? -v : v;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7f800000u | (man << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (man << 13));
}

f16_t float_to_f16(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
  const float a = std::fabs(f);
  if (std::isnan(f)) return static_cast<f16_t>(sign | 0x7e00u);
  if (a >= 65520.0f) return static_cast<f16_t>(sign | 0x7c00u);  // rounds past the largest half: inf
  if (a < 6.103515625e-05f) {                                    // subnormal range: multiples of 2^-24
    const float q = std::nearbyint(a * 16777216.0f);             // exact scaling, RNE
    return static_cast<f16_t>(sign | static_cast<uint16_t>(q));  // q == 1024 becomes the smallest normal
  }
  uint32_t bits = std::bit_cast<uint32_t>(a);
  bits += 0xfffu + ((bits >> 13) & 1u);  // RNE on the 13 dropped mantissa bits
  const uint32_t exp = (bits >> 23) - 112u;
  return static_cast<f16_t>(sign | (exp << 10) | ((bits >> 13) & 0x3ffu));
}

// Normal codes straight to their float bits (e4m3's exponent bias 7 against float's 127: +120); subnormals
// are man * 2^-9, exact in float. The activation quantisation calls this per element.
float e4m3_to_float(uint8_t v) {
  const bool neg = v & 0x80u;
  const uint32_t exp = (v >> 3) & 0xfu;
  const uint32_t man = v & 7u;
  if (exp == 15 && man == 7) return std::nanf("");
  if (exp == 0) {
    const float mag = static_cast<float>(man) * 0x1p-9f;
    return neg ? -mag : mag;
  }
  return std::bit_cast<float>((neg ? 0x80000000u : 0u) | ((exp + 120u) << 23) | (man << 20));
}

uint8_t float_to_e4m3(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint8_t sign = static_cast<uint8_t>((u >> 24) & 0x80u);
  uint32_t bits = u & 0x7fffffffu;
  if (bits > 0x7f800000u) return 0x7f;                                 // NaN
  if (bits >= 0x43e00000u) return static_cast<uint8_t>(sign | 0x7eu);  // |f| >= 448 (or inf): saturate
  if (bits < 0x3c800000u) {  // below 2^-6: subnormals, multiples of 2^-9
    const float q = std::nearbyint(std::bit_cast<float>(bits) * 512.0f);  // exact scaling, RNE
    return static_cast<uint8_t>(sign | static_cast<uint8_t>(q));  // q == 8 is the smallest normal's code
  }
  bits += 0x7ffffu + ((bits >> 20) & 1u);  // RNE on the 20 dropped mantissa bits; may carry into the exponent
  // bits >> 20 is (float exponent << 3) | 3 mantissa bits; e4m3's exponent bias is 7 against float's 127.
  return static_cast<uint8_t>(sign | ((bits >> 20) - (120u << 3)));
}

}  // namespace dspark
