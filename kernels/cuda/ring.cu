// KV ring writes: row n goes to slot row_slot[n] at entry row_pos[n] mod W; when several rows land on one
// entry the last of them wins (the CPU writes in order), so a row skips itself when a later row targets its
// entry.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/ring.hpp"

namespace dspark::cuda {
namespace {

__global__ void ring_write_kernel(uint16_t* ring_kv, int32_t* ring_pos, int64_t slots, int64_t W, int64_t d,
                                  const uint16_t* kv, const int32_t* row_slot, const int32_t* row_pos,
                                  int64_t N) {
  wait_for_previous_kernels();
  const int64_t n = blockIdx.x;
  const int32_t slot = row_slot[n], p = row_pos[n];
  if (slot < 0 || slot >= slots || p < 0) return;  // invalid rows are dropped (the host validates plans)
  const int64_t e = p % W;
  // A later row of the chunk for the same entry wins (the sequential order): the block's threads share the
  // scan.
  bool later = false;
  for (int64_t m = n + 1 + threadIdx.x; m < N; m += blockDim.x)
    later = later || (row_slot[m] == slot && row_pos[m] >= 0 && row_pos[m] % W == e);
  if (__syncthreads_or(later)) return;
  uint16_t* dst = ring_kv + (slot * W + e) * d;
  const uint16_t* src = kv + n * d;
  for (int64_t c = threadIdx.x; c < d; c += blockDim.x) dst[c] = src[c];
  if (threadIdx.x == 0) ring_pos[slot * W + e] = p;
}

}  // namespace

cudaError_t launch_ring_write(uint16_t* ring_kv, int32_t* ring_pos, int64_t slots, int64_t W, int64_t d,
                              const uint16_t* kv, const int32_t* row_slot, const int32_t* row_pos, int64_t N,
                              cudaStream_t s) {
  if (N <= 0) return cudaSuccess;
  return launch_kernel(ring_write_kernel, static_cast<unsigned>(N), kThreads, 0, s, ring_kv, ring_pos, slots,
                       W, d, kv, row_slot, row_pos, N);
}

}  // namespace dspark::cuda
