// Host side of RoPE for the CUDA ops that rotate (rope, kv_norm_rope_qdq, attention_inverse_rope): the
// rope_dim check and the frequencies, computed with the CPU reference's expression so that they are the same
// bits. Host code only (fmt through core/error.hpp).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/norm_rope.hpp"
#include "lib/core/error.hpp"

namespace dspark::cuda {

inline void check_rope_dim(int64_t rope_dim, int64_t d, const char* op) {
  if (rope_dim <= 0 || rope_dim % 2 != 0 || rope_dim > d || rope_dim / 2 > kMaxRopeHalf)
    fail("cuda {}: rope_dim {} must be even, in (0, {}] and at most {}", op, rope_dim, d, 2 * kMaxRopeHalf);
}

inline RopeFreqs rope_freqs(int64_t rope_dim, double theta) {
  RopeFreqs freqs{};
  for (int64_t j = 0; j < rope_dim / 2; ++j)
    freqs.f[j] =
        1.0f / std::pow(static_cast<float>(theta), static_cast<float>(2 * j) / static_cast<float>(rope_dim));
  return freqs;
}

}  // namespace dspark::cuda
