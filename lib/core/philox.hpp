// Philox-4x32-10 (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011): a
// counter-based generator, so any (key, counter) draws its numbers on its own, in any order, on any rank or
// backend. The sampled drafts' noise (SPEC §4, "Sampled drafts") is keyed by the request's seed and counted
// by (position, vocabulary id). Dependency-free and callable from kernels.
#pragma once

#include <cstdint>

#include "lib/core/host_device.hpp"

namespace dspark {

struct PhiloxBlock {
  uint32_t v[4];
};

// Ten rounds of the Philox-4x32 bijection of `counter` under the 64-bit key (k0, k1).
DSPARK_HOST_DEVICE PhiloxBlock philox4x32_10(PhiloxBlock counter, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // the multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // the key schedule's Weyl increments
  uint32_t* c = counter.v;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * c[0], p1 = static_cast<uint64_t>(kM1) * c[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    const uint32_t n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
    k0 += kW0;
    k1 += kW1;
  }
  return counter;
}

}  // namespace dspark
