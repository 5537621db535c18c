// SPEC §3's activation quantisation on the device: the power-of-two scale of a block from its amax, and the
// codes written by the kernel that produces the activation (a thread per element, 256 consecutive elements
// per block of threads). The bits of lib/core/block_quant's quantize_activation_row.
#pragma once

#include <cuda_fp8.h>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/quant_act.hpp"

namespace dspark::cuda {

// The unbiased exponent of the smallest power of two >= v (v >= 0 finite; subnormals give -126, 0 gives
// -127), as lib/core/block_quant's ceil_pow2_exponent.
__device__ __forceinline__ int ceil_pow2_exponent(float v) {
  const uint32_t bits = __float_as_uint(v);
  const int field = static_cast<int>((bits >> 23) & 0xffu);
  const bool mantissa = (bits & 0x7fffffu) != 0;
  if (field == 0) return mantissa ? -126 : -127;
  return field - 127 + (mantissa ? 1 : 0);
}

// 2^e for e in [-127, 127].
__device__ __forceinline__ float pow2(int e) {
  return e >= -126 ? __uint_as_float(static_cast<uint32_t>(e + 127) << 23) : __uint_as_float(0x00400000u);
}

// The exponent of a block's scale s = 2^e from the block's amax.
__device__ __forceinline__ int act_scale_exponent(float amax) {
  return ceil_pow2_exponent(fmaxf(amax, 1e-4f) * (1.0f / 448.0f));
}

// The e4m3 code of x / 2^e (x * 2^-e is exact): round to nearest even, saturating.
__device__ __forceinline__ uint8_t act_code(float x, int e) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(x * pow2(-e), __NV_SATFINITE, __NV_E4M3));
}

// Element i of row t of an activation [T, K] has the value v (already rounded to bf16); `valid` is false for
// threads past the row's end. Every thread of the block calls it (it synchronises the block when the block
// spans several warps); thread j of the block holds element blockIdx.y * 256 + j, so that a block of
// out.block elements lies in out.block / 32 consecutive warps. `amax` is kWarps floats of shared memory.
__device__ __forceinline__ void store_act_code(float v, bool valid, int64_t t, int64_t i, int64_t K,
                                               const QuantActOut& out, float* amax) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  float m = warp_max(valid ? fabsf(v) : 0.0f);
  const int warps = static_cast<int>(out.block / 32);
  if (warps > 1) {
    if (lane == 0) amax[warp] = m;
    __syncthreads();
    const int w0 = warp / warps * warps;
    for (int w = w0; w < w0 + warps; ++w) m = fmaxf(m, amax[w]);
  }
  if (!valid) return;
  const int e = act_scale_exponent(m);
  out.q.codes[t * K + i] = act_code(v, e);
  if (i % 32 == 0) out.q.scales[t * (K / 32) + i / 32] = pow2(e);
}

}  // namespace dspark::cuda
