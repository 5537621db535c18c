// Seeded mutation of an encoded message's bytes, for the codec and host-message fuzzers: random bytes and
// bits, 32- and 64-bit fields set to telling values (counts, lengths), truncation, extension, misaligned
// sizes and an inconsistent header length.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <random>
#include <vector>

namespace dspark::test {

inline uint32_t interesting_u32(std::mt19937_64& rng, size_t size) {
  const uint32_t values[] = {0,
                             1,
                             2,
                             3,
                             7,
                             8,
                             16,
                             0xffffffffu,
                             0x7fffffffu,
                             0x80000000u,
                             1u << 16,
                             (1u << 16) + 1,
                             4096,
                             4097,
                             static_cast<uint32_t>(size),
                             static_cast<uint32_t>(size + 8),
                             static_cast<uint32_t>(size - 8),
                             static_cast<uint32_t>(rng())};
  return values[rng() % std::size(values)];
}

inline void mutate_bytes(std::vector<uint8_t>& b, std::mt19937_64& rng) {
  const int n = 1 + static_cast<int>(rng() % 3);
  for (int i = 0; i < n; ++i) {
    switch (rng() % 8) {
      case 0:  // a random byte
        if (!b.empty()) b[rng() % b.size()] = static_cast<uint8_t>(rng());
        break;
      case 1:  // a bit
        if (!b.empty()) b[rng() % b.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 2:  // an aligned 32-bit field (a count, a length, a status) set to a telling value
        if (b.size() >= 4) {
          const uint32_t v = interesting_u32(rng, b.size());
          std::memcpy(b.data() + (rng() % (b.size() / 4)) * 4, &v, sizeof(v));
        }
        break;
      case 3:  // a 64-bit field
        if (b.size() >= 8) {
          const uint64_t v = rng();
          std::memcpy(b.data() + (rng() % (b.size() / 8)) * 8, &v, sizeof(v));
        }
        break;
      case 4:  // truncated anywhere
        b.resize(b.empty() ? 0 : rng() % b.size());
        break;
      case 5:  // truncated to a multiple of 8
        b.resize(b.size() / 8 > 0 ? rng() % (b.size() / 8) * 8 : 0);
        break;
      case 6:  // extended by random or zero bytes, aligned or not
      {
        const size_t extra = 1 + rng() % 64;
        const bool zeros = rng() % 2 == 0;
        for (size_t k = 0; k < extra; ++k) b.push_back(zeros ? 0 : static_cast<uint8_t>(rng()));
      } break;
      default:  // the header's length made inconsistent
        if (b.size() >= 4) {
          const uint32_t v = static_cast<uint32_t>(b.size()) + static_cast<uint32_t>(rng() % 16) - 8;
          std::memcpy(b.data(), &v, sizeof(v));
        }
    }
  }
  // Mostly keep the header's length right, so the checks past it are reached.
  if (b.size() >= 4 && rng() % 4 != 0) {
    const auto v = static_cast<uint32_t>(b.size());
    std::memcpy(b.data(), &v, sizeof(v));
  }
}

}  // namespace dspark::test
