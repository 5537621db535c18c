// A warp's share of a skinny product with quantised weights (SPEC §3) on the tensor cores: a 16-row fp8 block
// or fp4 weight tile times up to 8 activation rows per pass, one 32-element chunk (one activation block) per
// step. Each chunk's product is exact in fp32 on its own (mma m16n8k32 on e4m3 codes) and is then scaled by
// its weight and activation scales and added to the fp32 accumulator: the "per-block partial sums scaled
// afterwards" form of SPEC §3. fp4 codes are turned into e4m3 codes in registers (every e2m1 value is an
// e4m3 value); the weights are read once, in their stored width.
//
// Tile layouts (WeightFormat::fp8_mma_tiles / fp4_mma_tiles, made by CudaBackend::prepare_weights from the
// checkpoint's row-major parts): a matrix [rows, cols] (rows % 16 == 0, cols % 32 == 0) as rows / 16 tiles
// of 16 rows in row order, each chunk by chunk (32 columns), a chunk lane by lane: lane l = 4 g + q holds
// columns 8q .. 8q + 7 of row g of the tile, then the same of row g + 8. fp8: 16 bytes per lane (512 per
// chunk); its scales stay the checkpoint's [rows / B, cols / B] blocks. fp4: 8 bytes per lane (256 per
// chunk), each byte two codes (low nibble = the even column); its scales (one per row and chunk) are tiled
// too: 16 bytes per tile chunk, rows g and g + 8 of the tile at bytes 2g and 2g + 1.
//
// Fragment order: m16n8k32 gives thread (g, q) the k slots {4q .. 4q + 3} and {16 + 4q .. 16 + 4q + 3} of
// rows g and g + 8 (A) and of column g (B). Thread q feeds them the chunk's columns 8q .. 8q + 7: fp8 in
// order (slots 4q + j = column 8q + j, slots 16 + 4q + j = column 8q + 4 + j); fp4 even columns first
// (slots 4q + j = column 8q + 2j, slots 16 + 4q + j = column 8q + 2j + 1), the order its nibbles come out
// in. The activation codes are permuted the same way, so each product pairs the same elements.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace dspark::cuda {

enum class QuantKind { fp8, fp4 };

constexpr int kFp8TileChunkBytes = kMmaRows * kMmaChunk;      // 512
constexpr int kFp4TileChunkBytes = kMmaRows * kMmaChunk / 2;  // 256
constexpr int kFp4TileChunkScales = kMmaRows;                 // 16

// An e4m3 code as bf16 bits (exact: e4m3 is a subset of bf16; the NaN codes never reach a product).
__device__ __forceinline__ uint32_t e4m3_to_bf16_bits(uint32_t b) {
  const uint32_t sign = (b & 0x80u) << 8, e = (b >> 3) & 15u, m = b & 7u;
  if (e != 0) return sign | ((e + 120u) << 7) | (m << 4);
  return sign | (__float_as_uint(static_cast<float>(m) * 0x1p-9f) >> 16);  // subnormal: m 2^-9
}
// Bytes 2h and 2h + 1 of four e4m3 codes as a bf16 pair (the lower byte in the low half).
__device__ __forceinline__ uint32_t e4m3_pair_to_bf16x2(uint32_t codes, int h) {
  return e4m3_to_bf16_bits((codes >> (16 * h)) & 0xffu) | e4m3_to_bf16_bits((codes >> (16 * h + 8)) & 0xffu)
                                                              << 16;
}

// The m16n8k32 e4m3 product (sm_89 on), or where the code is built for an older target the same products
// through two bf16 m16n8k16 (sm_80): thread q's four codes of k 4q..4q+3 become the bf16 pairs the k16 layout
// puts at k 2q, 2q + 1 and 8 + 2q, 9 + 2q, in A and B alike, so each product pairs the same two codes (the
// sum runs over a permutation of k, in fp32).
__device__ __forceinline__ void mma_e4m3_16x8x32(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                                 uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  mma_bf16_16x8x16(c, e4m3_pair_to_bf16x2(a0, 0), e4m3_pair_to_bf16x2(a1, 0), e4m3_pair_to_bf16x2(a0, 1),
                   e4m3_pair_to_bf16x2(a1, 1), e4m3_pair_to_bf16x2(b0, 0), e4m3_pair_to_bf16x2(b0, 1));
  mma_bf16_16x8x16(c, e4m3_pair_to_bf16x2(a2, 0), e4m3_pair_to_bf16x2(a3, 0), e4m3_pair_to_bf16x2(a2, 1),
                   e4m3_pair_to_bf16x2(a3, 1), e4m3_pair_to_bf16x2(b1, 0), e4m3_pair_to_bf16x2(b1, 1));
#endif
}

// 2^(e - 127) for an e8m0 byte (255, NaN, is refused at load).
__device__ __forceinline__ float e8m0_scale(uint32_t e) {
  return e > 0 ? __uint_as_float(e << 23) : __uint_as_float(0x00400000u);
}

// Four fp4 codes (the low nibble of each byte of p) as e4m3 codes of 2^-6 times their value: the nibble's
// magnitude bits eem go to e4m3 bits 4..2 (exponent field ee, mantissa m00: 2^(ee - 7) (1 + m / 2), and for
// ee = 0 the subnormal m 2^-7), its sign to bit 7. kFp4Fold undoes the 2^-6 in the chunk's scale.
__device__ __forceinline__ uint32_t fp4_low_nibbles_to_e4m3(uint32_t p) {
  return ((p << 2) & 0x1c1c1c1cu) | ((p << 4) & 0x80808080u);
}
__device__ __forceinline__ uint32_t fp4_high_nibbles_to_e4m3(uint32_t p) {
  return ((p >> 2) & 0x1c1c1c1cu) | (p & 0x80808080u);
}
constexpr float kFp4Fold = 64.0f;

// acc[m][p] += the quantised product of weight tile m with activation column set p over the chunks [c0, c1).
// w[m]: the first byte of tile m in its tile layout. fp8: wscale[m] points at the tile's row of block scales
// (block index = chunk >> block_shift); fp4: at the tile's tiled scales. xq[p]: the e4m3 codes of this
// thread's column g of pass p (nullptr: a zero column), xs[p] its per-chunk scales (2^e, fp32). Every lane of
// the warp must call it (the activation scales of a thread's accumulator columns come by shuffle). kAhead
// chunks' weights, scales and activations are loaded before their mma.
template <QuantKind kKind, int NM, int NP, int kAhead>
__device__ __forceinline__ void quant_tile_dots(const uint8_t* const (&w)[NM],
                                                const uint8_t* const (&wscale)[NM], int block_shift,
                                                const uint8_t* const (&xq)[NP], const float* const (&xs)[NP],
                                                int c0, int c1, float (&acc)[NM][NP][4]) {
  const int lane = static_cast<int>(threadIdx.x) % 32, g = lane / 4, q = lane % 4;
  for (int cb = c0; cb < c1; cb += kAhead) {
    uint2 wv[kAhead][NM][2];  // fp8: rows g, g + 8 (8 bytes each); fp4: .x of [0] and [1]
    uint32_t sc[kAhead][NM];  // fp8: the block's scale byte; fp4: rows g (low byte) and g + 8 (high byte)
    uint2 xv[kAhead][NP] = {};
    float xsv[kAhead][NP] = {};
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
      const int c = cb + u;
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        if constexpr (kKind == QuantKind::fp8) {
          const auto* p = reinterpret_cast<const uint4*>(w[m] + (c * kFp8TileChunkBytes + 16 * lane));
          const uint4 v = __ldcs(p);
          wv[u][m][0] = make_uint2(v.x, v.y);
          wv[u][m][1] = make_uint2(v.z, v.w);
          sc[u][m] = __ldg(wscale[m] + (c >> block_shift));
        } else {
          const auto* p = reinterpret_cast<const uint2*>(w[m] + (c * kFp4TileChunkBytes + 8 * lane));
          const uint2 v = __ldcs(p);
          wv[u][m][0] = make_uint2(v.x, 0u);
          wv[u][m][1] = make_uint2(v.y, 0u);
          const auto* sp = reinterpret_cast<const uint16_t*>(wscale[m] + (c * kFp4TileChunkScales + 2 * g));
          sc[u][m] = __ldg(sp);
        }
      }
#pragma unroll
      for (int p = 0; p < NP; ++p)
        if (xq[p]) {
          xv[u][p] = __ldg(reinterpret_cast<const uint2*>(xq[p] + c * kMmaChunk + 8 * q));
          xsv[u][p] = __ldg(xs[p] + c);
        }
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
      uint32_t a[NM][4];
      float s_lo[NM], s_hi[NM];  // weight scales of rows g and g + 8
#pragma unroll
      for (int m = 0; m < NM; ++m) {
        if constexpr (kKind == QuantKind::fp8) {
          s_lo[m] = s_hi[m] = e8m0_scale(sc[u][m]);
          a[m][0] = wv[u][m][0].x, a[m][1] = wv[u][m][1].x, a[m][2] = wv[u][m][0].y, a[m][3] = wv[u][m][1].y;
        } else {
          s_lo[m] = e8m0_scale(sc[u][m] & 0xffu) * kFp4Fold;
          s_hi[m] = e8m0_scale(sc[u][m] >> 8) * kFp4Fold;
          const uint32_t r0 = wv[u][m][0].x, r1 = wv[u][m][1].x;
          a[m][0] = fp4_low_nibbles_to_e4m3(r0), a[m][1] = fp4_low_nibbles_to_e4m3(r1);
          a[m][2] = fp4_high_nibbles_to_e4m3(r0), a[m][3] = fp4_high_nibbles_to_e4m3(r1);
        }
      }
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        // The activation scales of this thread's accumulator columns 2q and 2q + 1 (lanes 8q, 8q + 4).
        const float sa0 = __shfl_sync(0xffffffffu, xsv[u][p], 8 * q);
        const float sa1 = __shfl_sync(0xffffffffu, xsv[u][p], 8 * q + 4);
        uint32_t b0 = xv[u][p].x, b1 = xv[u][p].y;
        if constexpr (kKind == QuantKind::fp4) {
          b0 = __byte_perm(xv[u][p].x, xv[u][p].y, 0x6420);  // columns 8q + 0, 2, 4, 6
          b1 = __byte_perm(xv[u][p].x, xv[u][p].y, 0x7531);  // columns 8q + 1, 3, 5, 7
        }
#pragma unroll
        for (int m = 0; m < NM; ++m) {
          float part[4] = {};
          mma_e4m3_16x8x32(part, a[m][0], a[m][1], a[m][2], a[m][3], b0, b1);
          acc[m][p][0] = fmaf(part[0], s_lo[m] * sa0, acc[m][p][0]);
          acc[m][p][1] = fmaf(part[1], s_lo[m] * sa1, acc[m][p][1]);
          acc[m][p][2] = fmaf(part[2], s_hi[m] * sa0, acc[m][p][2]);
          acc[m][p][3] = fmaf(part[3], s_hi[m] * sa1, acc[m][p][3]);
        }
      }
    }
  }
}

// acc[p] += x . W^T for bf16 activations (SPEC §3's wo_a rule: no activation quantisation) and one fp8 block
// weight tile, dequantised in registers: e4m3 -> f16 (exact), whose bits shifted into bf16's are 2^-112
// times the value, times 2^64 (exact): bf16 2^-48 w. Each chunk's two bf16 mma go to a partial scaled by
// 2^48 times the block scale. xb[p]: this thread's column g of pass p, bf16 (nullptr: zero).
template <int NP, int kAhead>
__device__ __forceinline__ void fp8_bf16_tile_dots(const uint8_t* w, const uint8_t* wscale, int block_shift,
                                                   const uint16_t* const (&xb)[NP], int c0, int c1,
                                                   float (&acc)[NP][4]) {
  const int lane = static_cast<int>(threadIdx.x) % 32, q = lane % 4;
  for (int cb = c0; cb < c1; cb += kAhead) {
    uint4 wv[kAhead];
    float sw[kAhead];
    uint4 xv[kAhead][NP] = {};
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
      const int c = cb + u;
      wv[u] = __ldcs(reinterpret_cast<const uint4*>(w + (c * kFp8TileChunkBytes + 16 * lane)));
      sw[u] = e8m0_scale(__ldg(wscale + (c >> block_shift))) * 0x1p48f;
#pragma unroll
      for (int p = 0; p < NP; ++p)
        if (xb[p]) xv[u][p] = __ldg(reinterpret_cast<const uint4*>(xb[p] + c * kMmaChunk + 8 * q));
    }
#pragma unroll
    for (int u = 0; u < kAhead; ++u) {
      if (cb + u >= c1) break;
      const uint32_t bytes[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
      uint32_t d[8];  // bf16 pairs: d[0..3] row g columns 8q + (0,1), (2,3), (4,5), (6,7); d[4..7] row g + 8
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(
            static_cast<__nv_fp8x2_storage_t>(bytes[i / 2] >> (16 * (i % 2))), __NV_E4M3);
        const uint32_t hb = static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
        const uint32_t bb = ((hb >> 3) & 0x0fff0fffu) | (hb & 0x80008000u);
        const __nv_bfloat162 v =
            __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&bb),
                    __nv_bfloat162(__float2bfloat16(0x1p64f), __float2bfloat16(0x1p64f)));
        d[i] = *reinterpret_cast<const uint32_t*>(&v);
      }
#pragma unroll
      for (int p = 0; p < NP; ++p) {
        float part[4] = {};
        mma_bf16_16x8x16(part, d[0], d[4], d[1], d[5], xv[u][p].x, xv[u][p].y);
        mma_bf16_16x8x16(part, d[2], d[6], d[3], d[7], xv[u][p].z, xv[u][p].w);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[p][i] = fmaf(part[i], sw[u], acc[p][i]);
      }
    }
  }
}

// log2(B / 32) for an fp8 block B of 32 times a power of two: a chunk's block column is chunk >> it.
__host__ __device__ inline int fp8_block_shift(int64_t B) {
  int shift = 0;
  while ((int64_t{kMmaChunk} << shift) < B) ++shift;
  return shift;
}

// The tile-layout byte offset of row-major element (row, col) of an fp8 [rows, cols] matrix: tile row / 16,
// chunk col / 32, lane 4 (row % 8) + (col % 32) / 8, its half (row % 16) / 8, byte col % 8.
__host__ __device__ inline int64_t fp8_tile_offset(int64_t row, int64_t col, int64_t cols) {
  const int64_t tile = row / kMmaRows, chunk = col / kMmaChunk, r = row % kMmaRows, k = col % kMmaChunk;
  const int64_t lane = 4 * (r % 8) + k / 8;
  return (tile * (cols / kMmaChunk) + chunk) * kFp8TileChunkBytes + 16 * lane + 8 * (r / 8) + k % 8;
}
// The same for an fp4 matrix's packed bytes (byte b of a row = columns 2b, 2b + 1): lanes hold 4 bytes of
// each of their two rows.
__host__ __device__ inline int64_t fp4_tile_offset(int64_t row, int64_t byte, int64_t cols) {
  const int64_t tile = row / kMmaRows, chunk = byte / (kMmaChunk / 2), r = row % kMmaRows,
                k = byte % (kMmaChunk / 2);
  const int64_t lane = 4 * (r % 8) + k / 4;
  return (tile * (cols / kMmaChunk) + chunk) * kFp4TileChunkBytes + 8 * lane + 4 * (r / 8) + k % 4;
}
// The tiled fp4 scale of row `row`, chunk `chunk`: rows g and g + 8 of the tile side by side (one 2-byte
// load per thread).
__host__ __device__ inline int64_t fp4_tile_scale_offset(int64_t row, int64_t chunk, int64_t cols) {
  const int64_t r = row % kMmaRows;
  return ((row / kMmaRows) * (cols / kMmaChunk) + chunk) * kFp4TileChunkScales + 2 * (r % 8) + r / 8;
}

}  // namespace dspark::cuda
