// The epilogue the few-row linear kernels share (linear_tiles.cu, quant_linear.cu): a block's 8 warps hold
// partial [16, 8] tiles of NP passes; when a tile is split over a cluster of S blocks (each a part of k),
// block 0 adds every block's warps in (block, warp) order through distributed shared memory. No atomics: the
// bits depend only on the shapes. Clusters exist from sm_90 on: code built for an older target has S = 1
// (the launchers split only where hopper_kernels() holds). Device code.
#pragma once

#include <cooperative_groups.h>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace dspark::cuda {

// out[t, row0 + r] = the sum of every warp's (and cluster block's) acc, for t < T; out [T, N] of type out_t.
// Block s of the S blocks of the cluster; every thread of every block calls it.
template <int NP>
__device__ __forceinline__ void cluster_sum_store(const float (&acc)[NP][4],
                                                  float (&part)[kWarps][NP][kMmaRows * kMmaCols], int S,
                                                  int s, int64_t row0, int64_t T, int64_t N, void* out,
                                                  Elt out_t) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int p = 0; p < NP; ++p)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[warp][p][mma_c_index(i)] = acc[p][i];
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The other blocks keep their shared memory alive until block 0 has read it.
  cooperative_groups::cluster_group cluster = cooperative_groups::this_cluster();
  if (S > 1)
    cluster.sync();
  else
    __syncthreads();
  const auto block_part = [&](int b) -> const float(*)[NP][kMmaRows * kMmaCols] {
    return S > 1 ? cluster.map_shared_rank(part, b) : part;
  };
#else
  S = 1;
  __syncthreads();
  const auto block_part = [&](int) -> const float(*)[NP][kMmaRows * kMmaCols] { return part; };
#endif
  if (s == 0) {
    for (int i = static_cast<int>(threadIdx.x); i < NP * kMmaRows * kMmaCols; i += kThreads) {
      const int p = i / (kMmaRows * kMmaCols), e = i % (kMmaRows * kMmaCols);
      float v = 0.0f;
      for (int b = 0; b < S; ++b) {
        const float(*src)[NP][kMmaRows * kMmaCols] = block_part(b);
        for (int w = 0; w < kWarps; ++w) v += src[w][p][e];
      }
      const int64_t t = p * kMmaCols + e % kMmaCols, r = row0 + e / kMmaCols;
      if (t < T) st(out, out_t, t * N + r, v);
    }
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (S > 1) cluster.sync();
#endif
}

}  // namespace dspark::cuda
