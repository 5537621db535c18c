// The argmax exchange's merge on the device: merge_markov (core/markov_record.hpp) folded in rank order, so a
// GPU tp group agrees with itself and with the CPU communicators. A plain launch on the CUDA runtime (no
// programmatic dependent launch): it follows NCCL's all-gather, whose kernel does not trigger early.
#include <cuda_runtime.h>

#include <cstdint>

#include "lib/core/markov_record.hpp"

namespace dspark {
namespace {

__global__ void merge_records_kernel(const MarkovRecord* __restrict__ gathered,
                                     MarkovRecord* __restrict__ out, int64_t B, int ranks) {
  const int64_t b = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (b >= B) return;
  MarkovRecord acc = gathered[b];
  for (int r = 1; r < ranks; ++r) acc = merge_markov(acc, gathered[static_cast<int64_t>(r) * B + b]);
  out[b] = acc;
}

}  // namespace

namespace detail {

void launch_merge_records(const MarkovRecord* gathered, MarkovRecord* out, int64_t B, int ranks,
                          cudaStream_t stream) {
  constexpr int kThreads = 128;
  const auto blocks = static_cast<unsigned>((B + kThreads - 1) / kThreads);
  merge_records_kernel<<<blocks, kThreads, 0, stream>>>(gathered, out, B, ranks);
}

}  // namespace detail
}  // namespace dspark
