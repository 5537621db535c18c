// The handshake of a kernel that reads every rank's buffer of an exchange point directly
// (lib/core/peer_view.hpp): per exchange an epoch (the point's count of exchanges, kept by each rank), a
// release store of "mine is complete for epoch e" into every peer's arrival word for this rank, and an
// acquire wait, bounded by the view's timeout, until every peer's word here reaches e. Epochs only grow, so
// nothing is re-armed and a late rank can never pass on a word of an earlier exchange. A wait that gives up
// marks the rank missed (device and host words) and the kernel goes on with whatever the late rank's buffer
// holds: the step has failed and the host learns so from the host word (Communicator::check_exchanges); later
// exchanges of that step do not wait again.
#pragma once

#include <cstdint>

#include "lib/core/markov_record.hpp"
#include "lib/core/peer_view.hpp"

namespace dspark::peer {

__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
// A word of a peer's buffer (read after the acquire, never from a cache of an earlier exchange).
__device__ __forceinline__ uint32_t load_relaxed_sys(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ float load_peer_float(const float* p) {
  return __uint_as_float(load_relaxed_sys(reinterpret_cast<const uint32_t*>(p)));
}
__device__ __forceinline__ uint64_t global_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
// Epoch `have` is at least `want` (wrap-safe).
__device__ __forceinline__ bool reached(uint32_t have, uint32_t want) {
  return static_cast<int32_t>(have - want) >= 0;
}

// Thread 0 of a block: waits until rank s's arrival word reaches e, or gives up (marking s missed) once the
// wait has lasted the view's timeout since `start` (set at the first wait of the block).
__device__ __forceinline__ void wait_for_rank(const PeerView& p, int s, uint32_t e, uint64_t& start,
                                              bool& given_up) {
  if (reached(load_acquire_sys(p.arrived + s), e)) return;
  if (given_up || *reinterpret_cast<volatile uint32_t*>(p.missed) != 0u) {  // the step failed already
    given_up = true;
    return;
  }
  if (start == 0) start = global_ns();
  while (!reached(load_acquire_sys(p.arrived + s), e)) {
    if (global_ns() - start > p.timeout_ns) {
      atomicOr(p.missed, 1u);
      *reinterpret_cast<volatile uint32_t*>(p.missed_host + s) = 1u;
      __threadfence_system();
      given_up = true;
      return;
    }
  }
}

// Every thread, after this rank's buffer is complete (the PDL wait): block (0, 0) publishes it, every block
// waits for every peer's, then each thread acquires the words itself, so its reads of the peers' buffers come
// after them. The release store alone publishes the buffer: the previous grid's writes are ordered before
// this thread by the PDL wait, and a release is cumulative over what its thread has observed.
__device__ __forceinline__ void peer_arrive(const PeerView& p) {
  if (threadIdx.x == 0) {
    const uint32_t e = *reinterpret_cast<volatile const uint32_t*>(p.state) + 1u;
    if (blockIdx.x == 0 && blockIdx.y == 0)
      for (int s = 0; s < p.ranks; ++s)
        if (s != p.rank) store_release_sys(p.signal[s] + p.rank, e);
    uint64_t start = 0;
    bool given_up = false;
    for (int s = 0; s < p.ranks; ++s)
      if (s != p.rank) wait_for_rank(p, s, e, start, given_up);
  }
  __syncthreads();
  for (int s = 0; s < p.ranks; ++s)
    if (s != p.rank) (void)load_acquire_sys(p.arrived + s);
}

// Every thread, at the end (no early return before it): the last block to get here advances the point's
// epoch for its next exchange. No block reads the epoch after the last one arrives here.
__device__ __forceinline__ void peer_depart(const PeerView& p) {
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned blocks = gridDim.x * gridDim.y;
    if (atomicAdd(p.state + 1, 1u) == blocks - 1) {
      p.state[1] = 0;
      p.state[0] += 1u;
    }
  }
}

// Rank s's buffer as this rank reads it: its own directly, a peer's through the system-scope load.
__device__ __forceinline__ float rank_float(const PeerView& p, int s, int64_t i) {
  const float* b = static_cast<const float*>(p.buffers[s]);
  return s == p.rank ? b[i] : load_peer_float(b + i);
}

// The sum over the ranks' buffers at element i, in rank order from 0.0f: the bits of MpiCommunicator's
// all_reduce_sum on every rank.
__device__ __forceinline__ float rank_order_sum(const PeerView& p, int64_t i) {
  float acc = 0.0f;
  for (int s = 0; s < p.ranks; ++s) acc += rank_float(p, s, i);
  return acc;
}

// Rank s's record b as this rank reads it.
__device__ __forceinline__ MarkovRecord rank_record(const PeerView& p, int s, int64_t b) {
  const MarkovRecord* recs = static_cast<const MarkovRecord*>(p.buffers[s]);
  if (s == p.rank) return recs[b];
  const auto* w = reinterpret_cast<const uint32_t*>(recs + b);
  uint32_t x[kMarkovRecordWords];
#pragma unroll
  for (int i = 0; i < kMarkovRecordWords; ++i) x[i] = load_relaxed_sys(w + i);
  MarkovRecord t;
  t.best = __uint_as_float(x[0]);
  t.second = __uint_as_float(x[1]);
  t.index = static_cast<int32_t>(x[2]);
  t.sample_index = static_cast<int32_t>(x[3]);
  t.score = __uint_as_float(x[4]);
  t.z = __uint_as_float(x[5]);
  t.z_max = __uint_as_float(x[6]);
  t.z_sum = __uint_as_float(x[7]);
  return t;
}

// The ranks' records b folded with merge_markov in rank order: argmax_exchange's answer on every rank.
__device__ __forceinline__ MarkovRecord rank_order_merge(const PeerView& p, int64_t b) {
  MarkovRecord acc = rank_record(p, 0, b);
  for (int s = 1; s < p.ranks; ++s) acc = merge_markov(acc, rank_record(p, s, b));
  return acc;
}

}  // namespace dspark::peer
