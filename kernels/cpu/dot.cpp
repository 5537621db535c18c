// The CPU kernels' dot product. Its order is fixed by n alone: lane j (0..15) adds a[i] b[i] for the i = j
// mod 16 in index order; then lanes j and j + 8 are added, then j and j + 4, j and j + 2, j and j + 1 (a
// tree). Every product and sum is rounded to fp32 (no contraction), so the result has the same bits on any
// x86-64: the AVX2 build of the function (picked at load time where the CPU has it) only keeps the 16 lanes
// in two vector registers instead of four.
#include <cstdint>

#include "kernels/cpu/element.hpp"

namespace dspark::cpu {

__attribute__((target_clones("avx2", "default"))) float dot(const float* a, const float* b, int64_t n) {
  constexpr int kLanes = 16;
  float l[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) l[j] += a[i + j] * b[i + j];
  for (int j = 0; i + j < n; ++j) l[j] += a[i + j] * b[i + j];
  for (int s = kLanes / 2; s > 0; s /= 2)
    for (int j = 0; j < s; ++j) l[j] += l[j + s];
  return l[0];
}

}  // namespace dspark::cpu
