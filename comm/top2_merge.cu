// The argmax exchange's merge on the device: the same rule as merge_top2 (comm/top2_merge.hpp, host only),
// folded in rank order, so a GPU tp group agrees with itself and with the CPU communicators.
#include <cuda_runtime.h>

#include "model/backend.hpp"

namespace dspark {
namespace {

// merge_top2: the best of a and b (ties to the lower vocabulary id), the larger of the rest as second.
__device__ Top2 merge(const Top2& a, const Top2& b) {
  const bool a_wins = a.best > b.best || (a.best == b.best && a.index <= b.index);
  const Top2& w = a_wins ? a : b;
  const Top2& l = a_wins ? b : a;
  Top2 out = w;
  out.second = w.second > l.best ? w.second : l.best;
  return out;
}

__global__ void merge_top2_kernel(const Top2* __restrict__ gathered, Top2* __restrict__ out, int64_t B,
                                  int ranks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  Top2 acc = gathered[b];
  for (int r = 1; r < ranks; ++r) acc = merge(acc, gathered[static_cast<int64_t>(r) * B + b]);
  out[b] = acc;
}

}  // namespace

namespace detail {

void launch_merge_top2(const Top2* gathered, Top2* out, int64_t B, int ranks, cudaStream_t stream) {
  constexpr int kThreads = 128;
  const auto blocks = static_cast<unsigned>((B + kThreads - 1) / kThreads);
  merge_top2_kernel<<<blocks, kThreads, 0, stream>>>(gathered, out, B, ranks);
}

}  // namespace detail
}  // namespace dspark
