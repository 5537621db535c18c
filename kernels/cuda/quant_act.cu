// The activation quantisation of SPEC §3, before a product with fp8 block or fp4 weights: a warp per (row,
// block of B elements), its amax by butterfly, the power-of-two scale from the exponent bits of
// max(amax, 1e-4) * fp32(1/448) rounded up, and each element's e4m3 code of x / s (round to nearest even,
// saturating). The bits of lib/core/block_quant's quantize_activation_row; as codes and scales (the fp8 and
// fp4 kernels) or as the quantised values in bf16 (a bf16 matrix product against a dequantised copy).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "kernels/cuda/act_quant.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/quant_linear.hpp"

namespace dspark::cuda {
namespace {

// The bf16 value of an e4m3 code times 2^e (exact: at most 4 significant bits, in bf16's range for the
// activation scales, 2^-21 .. 2^127).
__device__ __forceinline__ uint16_t e4m3_times_pow2_bf16(uint8_t code, float scale) {
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(code), __NV_E4M3);
  return float_to_bf16_bits(__half2float(__half(h)) * scale);
}

// kBf16Out: x's quantised values written back as bf16 (code times scale) instead of codes and scales.
template <bool kBf16Out>
__global__ void quantize_act_kernel(const uint16_t* x, int64_t T, int64_t K, int64_t x_stride, int64_t B,
                                    QuantAct q, uint16_t* qdq) {
  wait_for_previous_kernels();
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t blocks = K / B;
  if (warp >= T * blocks) return;
  const int64_t t = warp / blocks, c0 = warp % blocks * B;
  const uint16_t* row = x + t * x_stride;
  float amax = 0.0f;
  for (int64_t c = c0 + lane; c < c0 + B; c += 32) amax = fmaxf(amax, fabsf(bf16_bits_to_float(row[c])));
  amax = warp_max(amax);
  const int e = act_scale_exponent(amax);
  const float s = pow2(e);
  for (int64_t c = c0 + lane; c < c0 + B; c += 32) {
    const uint8_t code = act_code(bf16_bits_to_float(row[c]), e);
    if constexpr (kBf16Out)
      qdq[t * K + c] = e4m3_times_pow2_bf16(code, s);
    else
      q.codes[t * K + c] = code;
  }
  if constexpr (!kBf16Out)
    for (int64_t c = lane; c < B / kMmaChunk; c += 32) q.scales[t * (K / kMmaChunk) + c0 / kMmaChunk + c] = s;
}

}  // namespace

size_t quant_act_bytes(int64_t T, int64_t K) {
  const int64_t codes = (T * K + 255) / 256 * 256;
  return static_cast<size_t>(codes + T * (K / kMmaChunk) * 4);
}

QuantAct quant_act_at(void* buf, int64_t T, int64_t K) {
  auto* p = static_cast<uint8_t*>(buf);
  return {p, reinterpret_cast<float*>(p + (T * K + 255) / 256 * 256)};
}

cudaError_t launch_quantize_act(const void* x, int64_t T, int64_t K, int64_t x_stride, int64_t B, QuantAct q,
                                cudaStream_t s) {
  if (T <= 0 || K <= 0) return cudaSuccess;
  if (B <= 0 || B % kMmaChunk != 0 || K % B != 0 || x_stride < K) return cudaErrorInvalidValue;
  const int64_t warps = T * (K / B);
  return launch_kernel(quantize_act_kernel<false>, grid_for(warps, kWarps), kThreads, 0, s,
                       static_cast<const uint16_t*>(x), T, K, x_stride, B, q, nullptr);
}

cudaError_t launch_quantize_act_bf16(const void* x, int64_t T, int64_t K, int64_t x_stride, int64_t B,
                                     void* out, cudaStream_t s) {
  if (T <= 0 || K <= 0) return cudaSuccess;
  if (B <= 0 || B % kMmaChunk != 0 || K % B != 0 || x_stride < K || out == x) return cudaErrorInvalidValue;
  const int64_t warps = T * (K / B);
  return launch_kernel(quantize_act_kernel<true>, grid_for(warps, kWarps), kThreads, 0, s,
                       static_cast<const uint16_t*>(x), T, K, x_stride, B, QuantAct{},
                       static_cast<uint16_t*>(out));
}

}  // namespace dspark::cuda
