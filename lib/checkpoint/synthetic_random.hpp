// The counter-based generator of synthetic checkpoints: a value is a function of (seed, tensor name, element
// index) alone, so any slice of any tensor can be produced on its own, in any order or thread.
#pragma once

#include <cstdint>
#include <string_view>

namespace dspark::synthetic {

// splitmix64's finaliser: a bijective 64-bit mix, so mix(key + i * gamma) is a counter-based stream.
inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

// Keyed by the tensor's name rather than its position in the table, so a tensor's values do not change when
// other tensors are added or the expert count differs.
inline uint64_t tensor_key(uint64_t seed, std::string_view name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (char ch : name) h = (h ^ static_cast<uint8_t>(ch)) * 0x100000001b3ull;
  return mix64(mix64(seed + kGamma) ^ h);
}

// The i-th 64 random bits of a tensor's stream.
inline uint64_t element_bits(uint64_t key, int64_t i) {
  return mix64(key + static_cast<uint64_t>(i + 1) * kGamma);
}

// Unit-variance, roughly normal: the sum of four 16-bit uniforms (Irwin-Hall, n = 4), centred and scaled.
// Cheap, no transcendental functions, and bounded at +-3.46, which keeps synthetic activations free of
// outliers.
inline float unit_normal(uint64_t x) {
  const uint64_t f = (x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48);
  const float u4 = (static_cast<float>(f) + 2.0f) * (1.0f / 65536.0f);  // sum of 4 uniforms on (0, 1)
  return (u4 - 2.0f) * 1.7320508f;                                      // variance 4/12 -> 1
}

}  // namespace dspark::synthetic
