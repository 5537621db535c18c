// L2 prefetch of a weight range: bulk prefetches (cp.async.bulk.prefetch.L2, sm_90) of 64 KiB each, a thread
// per chunk. They only warm the cache: nothing is written and nothing waits for the data, so the kernel ends
// as soon as they are issued and later kernels read the same values whether the lines arrived or not.
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {
namespace {

constexpr uint64_t kPrefetchChunk = uint64_t{64} << 10;

__global__ void prefetch_l2_kernel(const char* begin, uint64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t off = (blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x) * kPrefetchChunk;
  if (off >= bytes) return;
  const uint64_t n = bytes - off < kPrefetchChunk ? bytes - off : kPrefetchChunk;
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(begin + off), "r"(static_cast<uint32_t>(n))
               : "memory");
#else
  (void)begin;
  (void)bytes;
#endif
}

}  // namespace

cudaError_t launch_prefetch_l2(const void* p, uint64_t bytes, cudaStream_t s) {
  // The bulk prefetch wants a 16-byte aligned start and a multiple of 16 bytes: the ragged ends are left out
  // (never a byte outside the range).
  const auto a = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (a + 15) / 16 * 16, last = (a + bytes) / 16 * 16;
  if (p == nullptr || last <= first) return cudaSuccess;
  const uint64_t n = last - first, chunks = (n + kPrefetchChunk - 1) / kPrefetchChunk;
  constexpr unsigned kPerBlock = 128;
  return launch_kernel(prefetch_l2_kernel, static_cast<unsigned>((chunks + kPerBlock - 1) / kPerBlock),
                       kPerBlock, 0, s, reinterpret_cast<const char*>(first), n);
}

}  // namespace dspark::cuda
