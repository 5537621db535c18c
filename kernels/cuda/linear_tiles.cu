// Few-row linear layers (T <= 16: a draft step's at B <= 3) on the tensor cores, from weights in mma tiles
// (mma_tile.cuh): every warp load is 512 contiguous bytes of the tile, and the step's 5-16 rows ride along as
// the product's columns (one or two passes of 8 held together, so the weights are read once). Block (tile of
// 16 rows, part s of S): its 8 warps split the part's 32-column chunks; their partial tiles are added in warp
// order and, when S > 1 (the layer has too few tiles to fill the GPU), the S blocks of a cluster hand theirs
// to block 0 through distributed shared memory, which adds them in part order. No atomics: the bits depend
// only on the shapes.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/linear_tiles.hpp"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/tile_place.cuh"
#include "kernels/cuda/tile_sum.cuh"

namespace dspark::cuda {
namespace {

constexpr int kAhead = 4;  // chunks whose loads a warp issues before their mma

struct Args {
  const uint16_t* x;
  int64_t T, x_stride;                         // rows, and elements between them (G K)
  const uint16_t* w[kLinearTilesMaxMatrices];  // M matrices of [G out_g, K] in mma tiles, all on x
  int64_t N, K;                                // N = G out_g
  void* out[kLinearTilesMaxMatrices];          // each [T, N]
  Elt out_t;
  TileGrid grid;
};

template <int NP>  // passes of 8 rows
__global__ void __launch_bounds__(kThreads) linear_tiles_kernel(Args a) {
  // The block's place and pointers come from the launch alone: worked out before the wait.
  const TilePlace at = tile_place(a.grid);
  const int lane = static_cast<int>(threadIdx.x) % 32, gi = lane / 4, q = lane % 4;
  const uint16_t* tile = a.w[at.m] + at.row0 * a.K;
  const int c0 = at.c0, c1 = at.c1;
  const uint16_t* xr[NP];
#pragma unroll
  for (int p = 0; p < NP; ++p) {
    const int64_t t = p * kMmaCols + gi;
    xr[p] = t < a.T ? a.x + t * a.x_stride + at.group * a.K + 8 * q : nullptr;  // past T: a zero column
  }
  wait_for_previous_kernels();
  float acc[NP][4] = {};
  for (int cb = c0; cb < c1; cb += kAhead) {
    uint4 lo[kAhead], hi[kAhead], xv[kAhead][NP] = {};  // weights past c1 are neither loaded nor used
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
      const uint16_t* w = tile + (cb + u) * kTileChunkElems + 8 * lane;
      lo[u] = __ldcs(reinterpret_cast<const uint4*>(w));
      hi[u] = __ldcs(reinterpret_cast<const uint4*>(w + kTileChunkElems / 2));
#pragma unroll
      for (int p = 0; p < NP; ++p)
        if (xr[p]) xv[u][p] = __ldg(reinterpret_cast<const uint4*>(xr[p] + (cb + u) * kMmaChunk));
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        mma_bf16_16x8x16(acc[p], lo[u].x, hi[u].x, lo[u].y, hi[u].y, xv[u][p].x, xv[u][p].y);
        mma_bf16_16x8x16(acc[p], lo[u].z, hi[u].z, lo[u].w, hi[u].w, xv[u][p].z, xv[u][p].w);
      }
    }
  }
  __shared__ float part[kWarps][NP][kMmaRows * kMmaCols];
  cluster_sum_store<NP>(acc, part, a.grid.splits(), at.s, at.row0, a.T, a.N, a.out[at.m], a.out_t);
}

}  // namespace

cudaError_t launch_linear_tiles_multi(const void* x, int64_t T, int64_t groups, const void* const* w_tiles,
                                      int matrices, int64_t out_g, int64_t K, void* const* out, Elt out_t,
                                      cudaStream_t s) {
  if (T <= 0 || T > kLinearTilesMaxRows || groups < 1 || out_g <= 0 || out_g % kMmaRows != 0 || K <= 0 ||
      K % kMmaChunk != 0 || !aligned16(x) || out_t == Elt::f16 || matrices < 1 ||
      matrices > kLinearTilesMaxMatrices)
    return cudaErrorInvalidValue;
  Args a{};
  a.x = static_cast<const uint16_t*>(x);
  a.T = T;
  a.x_stride = groups * K;
  a.N = groups * out_g;
  a.K = K;
  a.out_t = out_t;
  for (int m = 0; m < matrices; ++m) {
    if (!aligned16(w_tiles[m])) return cudaErrorInvalidValue;
    a.w[m] = static_cast<const uint16_t*>(w_tiles[m]);
    a.out[m] = out[m];
  }
  a.grid = plan_tile_grid(a.N, out_g, K);
  const dim3 grid(a.grid.blocks(matrices));
  const unsigned cluster = static_cast<unsigned>(a.grid.splits());
  return T <= kMmaCols ? launch_clustered(linear_tiles_kernel<1>, grid, kThreads, 0, s, cluster, a)
                       : launch_clustered(linear_tiles_kernel<2>, grid, kThreads, 0, s, cluster, a);
}

cudaError_t launch_linear_tiles(const void* x, int64_t T, int64_t groups, const void* w_tiles, int64_t out_g,
                                int64_t K, void* out, Elt out_t, cudaStream_t s) {
  return launch_linear_tiles_multi(x, T, groups, &w_tiles, 1, out_g, K, &out, out_t, s);
}

}  // namespace dspark::cuda
