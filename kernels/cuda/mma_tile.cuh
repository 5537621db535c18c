// A warp's share of a skinny product on the tensor cores: a 16-row bf16 weight tile times up to 8 bf16
// activation rows, fp32 accumulation (mma.sync m16n8k16, sm_80 and later). The grouped experts use it instead
// of per-element fmaf: two mma instructions per 32-element chunk instead of hundreds of scalar ones, so the
// SM keeps up with the memory however many rows share the weights.
//
// Operand order: the fragment of m16n8k16 gives thread (g = lane / 4, q = lane % 4) the k slots {2q, 2q + 1,
// 2q + 8, 2q + 9} of weight rows g and g + 8 and of activation column g. Here thread q instead loads elements
// 8q .. 8q + 7 of a 32-element chunk with one 16-byte load and feeds them to two mma as those slots; the
// activations are permuted the same way, so each product pairs the same weight and activation elements as
// the plain order (a dot product's terms are only reordered). The tensor core's summation order is fixed,
// so the result is deterministic.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/weight_tiles.hpp"

namespace dspark::cuda {

constexpr int kMmaRows = 16;   // weight rows of a tile
constexpr int kMmaCols = 8;    // activation rows (columns of the product) of a tile
constexpr int kMmaChunk = 32;  // k elements per step (two mma)

__device__ __forceinline__ void mma_bf16_16x8x16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                 uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

// ldmatrix: 8x8 bf16 matrices from shared memory, lanes 8i .. 8i + 7 giving the 16-byte row addresses of
// matrix i; register i of thread (g = lane / 4, q = lane % 4) receives row g, elements 2q and 2q + 1 of
// matrix i (with .trans: of its transpose, i.e. rows 2q and 2q + 1 of column g). x4 fills an m16n8k16 A
// fragment from a row-major 16x16 tile (matrices: rows 0-7 / 8-15 x k 0-7, then k 8-15); x2 a B fragment from
// 8 rows of 16 k (k contiguous), or with .trans from 16 rows of k holding 8 columns each.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
#endif
}
__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const auto a = static_cast<uint32_t>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
#endif
}

// Weight matrices in bf16 mma tiles (WeightFormat::bf16_mma_tiles): a [rows, cols] matrix (rows % 16 == 0,
// cols % 32 == 0) as rows / 16 tiles of 16 whole rows, in row order; tile t holds its 16 x cols elements
// chunk by chunk (32 columns, 512 elements each), and inside a chunk the 16-byte pieces in lane order: lane
// l's piece of row g = l / 4 (the chunk's first 256 elements), then of row g + 8 (the next 256), each columns
// 8 (l % 4) .. 8 (l % 4) + 7 of the chunk. Those are the pieces mma_tile_dots' threads load from row-major
// rows, laid end to end: the same products, but every warp load reads 512 contiguous bytes (row-major rows
// give 16 runs of 64 bytes, 10 KiB apart at H = 5120), which streams from DRAM markedly faster.
constexpr int kTileChunkElems = kMmaRows * kMmaChunk;  // 512
static_assert(kMmaTileRows == kMmaRows && kMmaTileCols == kMmaChunk,
              "weight_tiles.hpp's shape unit of the tiles");

// The row-major element (row, col) that starts the 8-element piece at element index i (i % 8 == 0) of a
// matrix in mma tiles with `cols` columns.
__host__ __device__ inline void mma_tile_piece_source(int64_t i, int64_t cols, int64_t* row, int64_t* col) {
  const int64_t tile_elems = kMmaRows * cols, t = i / tile_elems, in_tile = i % tile_elems;
  const int64_t chunk = in_tile / kTileChunkElems, w = in_tile % kTileChunkElems;
  const int64_t half = w / (kTileChunkElems / 2), lane = w % (kTileChunkElems / 2) / 8;
  *row = t * kMmaRows + half * 8 + lane / 4;
  *col = chunk * kMmaChunk + lane % 4 * 8;
}

// How mma_tile_dots finds a thread's weights: rows: w_lo[m] / w_hi[m] are row-major rows g and g + 8 of
// tile m; tiles: w_lo[m] is the first element of tile m in mma tiles (w_hi unused).
enum class WeightOrder { rows, tiles };

// acc[m] += tile_m . x over the chunks [c0, c1) of the k dimension, for NM weight tiles sharing the
// activations. w_lo[m] / w_hi[m]: this thread's weight rows (g and g + 8 of tile m), or the tile (kOrder);
// x: the activation row of column g (nullptr: a zero row); all bf16, 16-byte aligned, at least 32 c1
// elements. acc[m] is the C fragment: [0], [1] = (row g, columns 2q, 2q + 1), [2], [3] = (row g + 8, the
// same columns). Both orders give the same bits. The loads of kAhead chunks are issued before their mma, so
// each warp keeps kAhead * NM KiB of weights in flight. kStreamed: the weights are read once per step
// (evict-first loads, the MoE experts); otherwise they are cached normally (markov_head, read again at
// every Markov position, can stay in L2 between them).
template <int NM, int kAhead = 4, bool kStreamed = true, WeightOrder kOrder = WeightOrder::rows>
__device__ __forceinline__ void mma_tile_dots(const uint16_t* const (&w_lo)[NM],
                                              const uint16_t* const (&w_hi)[NM], const uint16_t* x,
                                              int64_t c0, int64_t c1, float (&acc)[NM][4]) {
  const int lane = static_cast<int>(threadIdx.x) % 32, q = lane % 4;
  for (int64_t cb = c0; cb < c1; cb += kAhead) {
    uint4 lo[kAhead][NM], hi[kAhead][NM], xv[kAhead] = {};  // weights past c1 are neither loaded nor used
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
      const int64_t off = (cb + u) * kMmaChunk + 8 * q;
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const uint16_t* const tiled = w_lo[m] + (cb + u) * kTileChunkElems + 8 * lane;
        const auto* plo =
            reinterpret_cast<const uint4*>(kOrder == WeightOrder::tiles ? tiled : w_lo[m] + off);
        const auto* phi = reinterpret_cast<const uint4*>(
            kOrder == WeightOrder::tiles ? tiled + kTileChunkElems / 2 : w_hi[m] + off);
        lo[u][m] = kStreamed ? __ldcs(plo) : __ldg(plo);
        hi[u][m] = kStreamed ? __ldcs(phi) : __ldg(phi);
      }
      if (x) xv[u] = __ldg(reinterpret_cast<const uint4*>(x + off));  // shared by the block's warps: cached
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        const uint4 a = lo[u][m], b = hi[u][m], v = xv[u];
        mma_bf16_16x8x16(acc[m], a.x, b.x, a.y, b.y, v.x, v.y);
        mma_bf16_16x8x16(acc[m], a.z, b.z, a.w, b.w, v.z, v.w);
      }
    }
  }
}

// Index of C-fragment element i (0..3) of this thread in a row-major [kMmaRows, kMmaCols] tile.
__device__ __forceinline__ int mma_c_index(int i) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, q = lane % 4;
  return (g + (i >= 2 ? 8 : 0)) * kMmaCols + 2 * q + (i & 1);
}

}  // namespace dspark::cuda
