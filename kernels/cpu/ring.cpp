// Per-stage KV rings of the slots: entry p mod W holds position p.
#include <algorithm>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cpu/element.hpp"

namespace dspark {

void CpuBackend::ring_write(const Tensor& ring_kv, const Tensor& ring_pos, const Tensor& kv,
                            const Tensor& slots, const Tensor& pos) {
  const int64_t W = ring_pos.dim(1), d = kv.dim(1);
  for (int64_t n = 0; n < kv.dim(0); ++n) {
    const int32_t slot = slots.as<const int32_t>()[n], p = pos.as<const int32_t>()[n];
    if (slot < 0) continue;  // a padding row of an insert bucket
    const int64_t e = p % W;
    std::copy_n(kv.as<const uint16_t>() + n * d, d, ring_kv.as<uint16_t>() + (slot * W + e) * d);
    ring_pos.as<int32_t>()[slot * W + e] = p;
  }
}

void CpuBackend::ring_clear(const Tensor& ring_pos, int64_t slot) {
  const int64_t W = ring_pos.dim(1);
  std::fill_n(ring_pos.as<int32_t>() + slot * W, W, -1);
}

}  // namespace dspark
