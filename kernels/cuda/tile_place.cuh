// Where a block of the few-row tile kernels (linear_tiles.cu, quant_linear.cu) works: the grid is matrices x
// tiles of 16 weight rows x S parts of k (a cluster of S consecutive blocks per tile, S a power of two), and
// a block's 8 warps split its part's 32-element chunks. The place comes from the launch's shape alone (no
// memory read), so a kernel works it out before its programmatic-launch wait, beside the previous kernel's
// tail; shifts for the split and two 32-bit divisions keep it short.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/launch_policy.hpp"
#include "kernels/cuda/mma_tile.cuh"

namespace dspark::cuda {

struct TileGrid {
  unsigned tiles;        // tiles per matrix (N / 16)
  unsigned group_tiles;  // tiles per group (out_g / 16)
  int chunks;            // 32-element chunks of k (K / 32)
  int split_shift;       // log2 S
  __host__ __device__ int splits() const { return 1 << split_shift; }
  unsigned blocks(int matrices) const { return static_cast<unsigned>(matrices) * tiles << split_shift; }
};

// The grid of a launch of N = G out_g rows on K: k split over up to 8 blocks while the tiles alone leave the
// GPU idle (fewer than kTargetBlocks blocks), each part at least a chunk per warp. Counted per matrix, so
// that a matrix's split, and so its bits, do not depend on how many run in its launch. Splits need clusters
// (hopper_kernels()).
inline TileGrid plan_tile_grid(int64_t N, int64_t out_g, int64_t K) {
  constexpr int64_t kTargetBlocks = 256;  // two per SM of an H100 / H200
  constexpr int kMaxSplitShift = 3;       // 8 blocks: the portable cluster size
  TileGrid t{static_cast<unsigned>(N / kMmaRows), static_cast<unsigned>(out_g / kMmaRows),
             static_cast<int>(K / kMmaChunk), 0};
  while (hopper_kernels() && int64_t{t.tiles} << (t.split_shift + 1) <= kTargetBlocks &&
         t.split_shift < kMaxSplitShift && t.chunks >> (t.split_shift + 1) >= kWarps)
    ++t.split_shift;
  return t;
}

struct TilePlace {
  int m;         // matrix
  int s;         // part of k (the block's rank in its cluster)
  int64_t row0;  // the tile's first weight row
  int64_t group;
  int c0, c1;  // this warp's chunks
};

__device__ __forceinline__ TilePlace tile_place(const TileGrid& t) {
  const unsigned b = blockIdx.x, shift = static_cast<unsigned>(t.split_shift);
  const unsigned s = b & ((1u << shift) - 1u), all = b >> shift, m = all / t.tiles, tile = all - m * t.tiles;
  const int C = t.chunks, per_s = (C + (1 << shift) - 1) >> shift;
  const auto lesser = [](int u, int v) { return u < v ? u : v; };
  const int p0 = lesser(static_cast<int>(s) * per_s, C), p1 = lesser(p0 + per_s, C);
  const int per_w = (p1 - p0 + kWarps - 1) / kWarps, warp = static_cast<int>(threadIdx.x) / 32;
  const int c0 = lesser(p0 + warp * per_w, p1), c1 = lesser(c0 + per_w, p1);
  return {static_cast<int>(m),
          static_cast<int>(s),
          int64_t{tile} * kMmaRows,
          int64_t{tile / t.group_tiles},
          c0,
          c1};
}

}  // namespace dspark::cuda
