// EXL3 on the device (SPEC §9): a lane's eight weights of a 16 x 16 trellis tile decoded in registers, as the
// A fragment of an fp16 m16n8k16 mma (the tile's outputs as M, its inputs as K), and the 128-point
// Walsh-Hadamard butterfly of a warp. The bits of lib/core/exl3.cpp: every weight is the reference's fp16
// value, every butterfly the reference's fp32 sequence. Device code (nvcc only).
#pragma once

#include <cuda_fp16.h>

#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/exl3.hpp"

namespace dspark::cuda {

constexpr float kExl3Scale = 0.088388347648f;  // 1 / sqrt(128) as exllamav3 rounds it (lib/core/exl3.hpp)

// Where lane l's states lie in each tile's stream of 8K words: elements t = 8l .. 8l + 7 take stream bits
// [(8l + 1)K - 16, (8l + 8)K), at most 7K + 16 <= 72 bits from bit `off` of word idx[0]; four words hold
// them. The same for every tile of a matrix, so a kernel computes it once.
struct Exl3LaneWindow {
  int idx[4];
  int off;
};
template <int K>
__device__ __forceinline__ Exl3LaneWindow exl3_lane_window(int lane) {
  constexpr int kWords = 8 * K, kBits = 256 * K;
  int b0 = (8 * lane + 1) * K - 16;
  if (b0 < 0) b0 += kBits;
  Exl3LaneWindow w{};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int wi = (b0 >> 5) + i;
    w.idx[i] = wi >= kWords ? wi - kWords : wi;  // circular (kWords >= 8 > 3)
  }
  w.off = b0 & 31;
  return w;
}

// The lane's eight states of one tile, each in the high 16 bits of st[j] (the low 16 are not defined): the
// window shifted to start at its first bit, then element j's 16 bits from bit jK (known at compile time).
template <int K>
__device__ __forceinline__ void exl3_lane_states(const uint32_t* words, const Exl3LaneWindow& lw,
                                                 uint32_t (&st)[8]) {
  const uint32_t w0 = words[lw.idx[0]], w1 = words[lw.idx[1]], w2 = words[lw.idx[2]], w3 = words[lw.idx[3]];
  const uint32_t s[3] = {__funnelshift_l(w1, w0, lw.off), __funnelshift_l(w2, w1, lw.off),
                         __funnelshift_l(w3, w2, lw.off)};
#pragma unroll
  for (int j = 0; j < 8; ++j) {
    const int r = j * K, q = r >> 5, sh = r & 31;  // q <= 1 (r + 16 <= 72)
    st[j] = sh == 0 ? s[q] : __funnelshift_l(s[q + 1], s[q], sh);
  }
}

// Two states' weights as a half2 (the first in the low half).
template <Exl3Cb kCb>
__device__ __forceinline__ uint32_t exl3_weight_pair(uint32_t hi0, uint32_t hi1) {
  const uint32_t s0 = hi0 >> 16, s1 = hi1 >> 16;
  if constexpr (kCb == Exl3Cb::mul1) {
    // fp16 fma(1024 + bytesum(x), 0x1EEE, 0xC931): 1024 + s (s <= 1020) is the fp16 with exponent 10 and
    // mantissa s, 0x6400 + s (dp4a adds it), and the fused multiply-add rounds once, as the reference.
    const uint32_t a = __dp4a(s0 * 0x83DCD12Du, 0x01010101u, 0x6400u),
                   b = __dp4a(s1 * 0x83DCD12Du, 0x01010101u, 0x6400u);
    const uint32_t h = __byte_perm(a, b, 0x5410);
    const __half2 r = __hfma2(*reinterpret_cast<const __half2*>(&h), __half2half2(__ushort_as_half(0x1EEE)),
                              __half2half2(__ushort_as_half(0xC931)));
    return *reinterpret_cast<const uint32_t*>(&r);
  } else {
    // 3INST / MCG: the masked word's two fp16 halves added, rounded once.
    const uint32_t x0 = kCb == Exl3Cb::inst3 ? s0 * 89226354u + 64248484u : s0 * 0xCBAC1FEDu;
    const uint32_t x1 = kCb == Exl3Cb::inst3 ? s1 * 89226354u + 64248484u : s1 * 0xCBAC1FEDu;
    const uint32_t m0 = (x0 & 0x8FFF8FFFu) ^ 0x3B603B60u, m1 = (x1 & 0x8FFF8FFFu) ^ 0x3B603B60u;
    const uint32_t lo = __byte_perm(m0, m1, 0x5410), hi = __byte_perm(m0, m1, 0x7632);
    const __half2 r = __hadd2(*reinterpret_cast<const __half2*>(&lo), *reinterpret_cast<const __half2*>(&hi));
    return *reinterpret_cast<const uint32_t*>(&r);
  }
}

// Lane l's A fragment of a tile. Element j of the lane sits at input 2(l % 4) + {0, 1, 8, 9}[j % 4] and
// output l / 4 + 8 (j / 4): A's registers {a0 a1} {a2 a3} {a4 a5} {a6 a7} are elements {0 1} {4 5} {2 3}
// {6 7}.
template <Exl3Cb kCb, int K>
__device__ __forceinline__ void exl3_tile_fragment(const uint32_t* words, const Exl3LaneWindow& lw,
                                                   uint32_t (&a)[4]) {
  uint32_t st[8];
  exl3_lane_states<K>(words, lw, st);
  a[0] = exl3_weight_pair<kCb>(st[0], st[1]);
  a[1] = exl3_weight_pair<kCb>(st[4], st[5]);
  a[2] = exl3_weight_pair<kCb>(st[2], st[3]);
  a[3] = exl3_weight_pair<kCb>(st[6], st[7]);
}

__device__ __forceinline__ void mma_f16_16x8x16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#endif
}

// The butterfly of 128 values over a warp, lane l holding elements 4l .. 4l + 3: stages over index bits 0..6
// in that order, (a, b) -> (a + b, a - b), unscaled (lib/core/exl3.cpp's fwht128).
__device__ __forceinline__ void exl3_warp_fwht128(float (&v)[4], int lane) {
  float a = v[0], b = v[1];
  v[0] = a + b, v[1] = a - b;
  a = v[2], b = v[3];
  v[2] = a + b, v[3] = a - b;
  a = v[0], b = v[2];
  v[0] = a + b, v[2] = a - b;
  a = v[1], b = v[3];
  v[1] = a + b, v[3] = a - b;
#pragma unroll
  for (int bit = 1; bit < 32; bit <<= 1) {
    const bool upper = (lane & bit) != 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float other = __shfl_xor_sync(0xffffffffu, v[i], bit);
      v[i] = upper ? other - v[i] : v[i] + other;
    }
  }
}

// The input transform of one 128-block (lane l: elements 4l .. 4l + 3 of x as floats, suh f16): fp16(x),
// fp16(x16 suh), the butterfly, times the scale, fp16 (SPEC §9). Returns the fp16 bits, element i in half i.
__device__ __forceinline__ uint2 exl3_input_block(float (&v)[4], const uint16_t* suh, int lane) {
  const uint2 s = *reinterpret_cast<const uint2*>(suh);
  const uint16_t sv[4] = {static_cast<uint16_t>(s.x), static_cast<uint16_t>(s.x >> 16),
                          static_cast<uint16_t>(s.y), static_cast<uint16_t>(s.y >> 16)};
#pragma unroll
  for (int i = 0; i < 4; ++i)
    v[i] = __half2float(
        __float2half_rn(__half2float(__float2half_rn(v[i])) * __half2float(__ushort_as_half(sv[i]))));
  exl3_warp_fwht128(v, lane);
  uint16_t h[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __half_as_ushort(__float2half_rn(v[i] * kExl3Scale));
  return {h[0] | static_cast<uint32_t>(h[1]) << 16, h[2] | static_cast<uint32_t>(h[3]) << 16};
}

// The output transform of one 128-block in place: the butterfly, times the scale, times svh (fp32, in that
// order).
__device__ __forceinline__ void exl3_output_block(float (&v)[4], const uint16_t* svh, int lane) {
  exl3_warp_fwht128(v, lane);
  const uint2 s = *reinterpret_cast<const uint2*>(svh);
  const uint16_t sv[4] = {static_cast<uint16_t>(s.x), static_cast<uint16_t>(s.x >> 16),
                          static_cast<uint16_t>(s.y), static_cast<uint16_t>(s.y >> 16)};
#pragma unroll
  for (int i = 0; i < 4; ++i) v[i] = v[i] * kExl3Scale * __half2float(__ushort_as_half(sv[i]));
}

}  // namespace dspark::cuda
