// The handshake of a kernel that reads its tp = 2 peer's buffer directly (core/peer_buffer.hpp): a release
// store of "mine is complete" into the peer's flag word, an acquire wait on this rank's own, and the re-arm
// by the kernel's last block. A buffer's flag is set again only in its next exchange, which the peer starts
// after this kernel has finished (the exchanges alternate between two buffers): the re-arm cannot clear it
// early.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// A word of the peer's buffer (read after the acquire, never from a cache of an earlier exchange).
__device__ __forceinline__ uint32_t load_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Every thread, after the PDL wait (this rank's buffer is complete): block (0, 0) tells the peer, every
// block waits for the peer's word, then each thread acquires it itself, so its reads of the peer's buffer
// come after it. The release store alone publishes the buffer: the previous grid's writes are ordered before
// this thread by the PDL wait, and a release is cumulative over what its thread has observed (no separate
// system-wide fence before it).
__device__ __forceinline__ void peer_signal_and_wait(uint32_t* signal_peer, uint32_t* flag) {
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0 && blockIdx.y == 0) store_release_sys(signal_peer, 1u);
    while (load_acquire_sys(flag) == 0u) {
    }
  }
  __syncthreads();
  (void)load_acquire_sys(flag);
}

// Every thread, at the end (no early return before it): the last block to get here clears the flag and the
// arrival count for the buffer's next exchange.
__device__ __forceinline__ void peer_rearm(uint32_t* flag, uint32_t* arrivals) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned blocks = gridDim.x * gridDim.y;
    if (atomicAdd(arrivals, 1u) == blocks - 1) {  // every block has read the flag and the peer's buffer
      *arrivals = 0;
      atomicExch(flag, 0u);
    }
  }
}

}  // namespace dspark::cuda
