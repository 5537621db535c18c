// The sampled drafts' noise (SPEC §4, "Sampled drafts"): the Gumbel noise of vocabulary id v at position pos
// for a request's seed, the same on every rank and backend for the same (seed, pos, v). Callable from
// kernels.
#pragma once

#include <math.h>  // log: the same name in host and device code

#include <cstdint>

#include "lib/core/host_device.hpp"
#include "lib/core/philox.hpp"

namespace dspark {

// -log(-log(u)), u in (0, 1) from the first word x of Philox-4x32-10 keyed by the seed (low word, high word),
// counter (pos, v, 0, 0): u = (x + 1/2) / 2^32 (exact in double: 33 significant bits), both logs in double,
// rounded to float at the end.
DSPARK_HOST_DEVICE float gumbel_noise(uint64_t seed, uint32_t pos, uint32_t v) {
  const PhiloxBlock r =
      philox4x32_10({{pos, v, 0u, 0u}}, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const double u = (static_cast<double>(r.v[0]) + 0.5) * 0x1p-32;
  return static_cast<float>(-log(-log(u)));
}

}  // namespace dspark
