#include "tests/fuzz/fuzz_shape.hpp"

namespace dspark::fuzz {

uint64_t mix(uint64_t a, uint64_t b) {
  uint64_t x = a ^ (b + 0x9e3779b97f4a7c15ull + (a << 6) + (a >> 2));
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ull;
  return x ^ (x >> 29);
}

uint64_t row_digest(const bf16_t* row, int64_t n) {
  uint64_t h = 0x51ed270b27ull;
  for (int64_t i = 0; i < n; ++i) h = mix(h, row[i]);
  return h;
}

int32_t answer_id(uint64_t context, int32_t token, int32_t pos, int64_t j, int64_t vocab) {
  const uint64_t h = mix(mix(mix(context, static_cast<uint64_t>(token)), static_cast<uint64_t>(pos)),
                         static_cast<uint64_t>(j));
  return static_cast<int32_t>(h % static_cast<uint64_t>(vocab));
}

}  // namespace dspark::fuzz
