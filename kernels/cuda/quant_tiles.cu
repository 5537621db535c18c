// Quantised weights on the device: the checkpoint's row-major fp8 / fp4 parts into the tile layouts of
// quant_tile.cuh (once at start-up, CudaBackend::prepare_weights), and SPEC §3's weight quantisation of a
// bf16 matrix (the bench's synthetic fp8 checkpoint, with lib/core/block_quant's bits).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <algorithm>

#include "kernels/cuda/act_quant.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/quant_linear.hpp"
#include "kernels/cuda/quant_tile.cuh"

namespace dspark::cuda {
namespace {

unsigned grid_capped(int64_t n) {
  return static_cast<unsigned>(std::min<int64_t>((n + kThreads - 1) / kThreads, 8192));
}

// A thread per source byte (grid-stride).
__global__ void pack_fp8_tiles_kernel(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t cols) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[fp8_tile_offset(i / cols, i % cols, cols)] = src[i];
}

__global__ void pack_fp4_tiles_kernel(const uint8_t* src, uint8_t* dst, const uint8_t* src_scales,
                                      uint8_t* dst_scales, int64_t rows, int64_t cols) {
  const int64_t row_bytes = cols / 2, chunks = cols / kMmaChunk;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * row_bytes;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / row_bytes, b = i % row_bytes;
    dst[fp4_tile_offset(r, b, cols)] = src[i];
    if (b % (kMmaChunk / 2) == 0) {
      const int64_t c = b / (kMmaChunk / 2);
      dst_scales[fp4_tile_scale_offset(r, c, cols)] = src_scales[r * chunks + c];
    }
  }
}

// weight_scale_byte: clamp(ceil(log2(amax / max_code)) + 127, 0, 254), with an IEEE division.
__device__ __forceinline__ uint32_t weight_scale_byte(float amax, float max_code) {
  const int e = ceil_pow2_exponent(__fdiv_rn(amax, max_code)) + 127;
  return static_cast<uint32_t>(e < 0 ? 0 : e > 254 ? 254 : e);
}

// Block per B x B weight block: its amax, its scale byte, its codes of w / s.
__global__ void quantize_fp8_block_kernel(const uint16_t* w, int64_t rows, int64_t cols, int64_t B,
                                          uint8_t* codes, uint8_t* scales) {
  __shared__ float red[kWarps];
  const int64_t bcols = (cols + B - 1) / B, br = blockIdx.x / bcols, bc = blockIdx.x % bcols;
  const int64_t r0 = br * B, c0 = bc * B, r1 = r0 + B < rows ? r0 + B : rows,
                c1 = c0 + B < cols ? c0 + B : cols;
  const int64_t n = (r1 - r0) * (c1 - c0), width = c1 - c0;
  float amax = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x)
    amax = fmaxf(amax, fabsf(bf16_bits_to_float(w[(r0 + i / width) * cols + c0 + i % width])));
  amax = warp_max(amax);
  if (threadIdx.x % 32 == 0) red[threadIdx.x / 32] = amax;
  __syncthreads();
  amax = 0.0f;
  for (int i = 0; i < kWarps; ++i) amax = fmaxf(amax, red[i]);
  const uint32_t e = weight_scale_byte(amax, 448.0f);
  if (threadIdx.x == 0) scales[br * bcols + bc] = static_cast<uint8_t>(e);
  const float inv = e8m0_scale(254u - e);  // 2^(127 - e) = 1 / s exactly
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t idx = (r0 + i / width) * cols + c0 + i % width;
    codes[idx] = static_cast<uint8_t>(
        __nv_cvt_float_to_fp8(bf16_bits_to_float(w[idx]) * inv, __NV_SATFINITE, __NV_E4M3));
  }
}

// e2m1 code of v (block_quant's float_to_e2m1: nearest, a tie to the even code, saturating at 6).
__device__ __forceinline__ uint32_t float_to_e2m1(float v) {
  const float a = fabsf(v);
  const uint32_t m = a <= 0.25f   ? 0u
                     : a < 0.75f  ? 1u
                     : a <= 1.25f ? 2u
                     : a < 1.75f  ? 3u
                     : a <= 2.5f  ? 4u
                     : a < 3.5f   ? 5u
                     : a <= 5.0f  ? 6u
                                  : 7u;
  return (signbit(v) ? 8u : 0u) | m;
}

// Warp per (row, 32 columns): the block's amax, its scale byte, the 16 packed bytes of w / s.
__global__ void quantize_fp4_kernel(const uint16_t* w, int64_t rows, int64_t cols, uint8_t* packed,
                                    uint8_t* scales) {
  const int64_t warp = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t blocks = cols / kMmaChunk;
  if (warp >= rows * blocks) return;
  const int64_t r = warp / blocks, b = warp % blocks;
  const float v = bf16_bits_to_float(w[r * cols + b * kMmaChunk + lane]);
  const float amax = warp_max(fabsf(v));
  const uint32_t e = weight_scale_byte(amax, 6.0f);
  if (lane == 0) scales[r * blocks + b] = static_cast<uint8_t>(e);
  const float inv = e8m0_scale(254u - e);
  const uint32_t code = float_to_e2m1(v * inv);
  const uint32_t hi = __shfl_down_sync(0xffffffffu, code, 1);
  if (lane % 2 == 0)
    packed[r * (cols / 2) + b * (kMmaChunk / 2) + lane / 2] = static_cast<uint8_t>(code | hi << 4);
}

// A thread per element (grid-stride): code times its block's scale, in bf16.
__global__ void dequantize_fp8_block_kernel(const uint8_t* codes, const uint8_t* scales, int64_t rows,
                                            int64_t cols, int64_t B, uint16_t* out) {
  const int64_t bcols = (cols + B - 1) / B;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < rows * cols;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i % cols;
    const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<__nv_fp8_storage_t>(codes[i]), __NV_E4M3);
    out[i] = float_to_bf16_bits(__half2float(__half(h)) * e8m0_scale(scales[r / B * bcols + c / B]));
  }
}

}  // namespace

cudaError_t launch_dequantize_fp8_block(const void* codes, const void* scales, int64_t rows, int64_t cols,
                                        int64_t B, void* out, cudaStream_t s) {
  if (rows <= 0 || cols <= 0 || B <= 0 || codes == out) return cudaErrorInvalidValue;
  dequantize_fp8_block_kernel<<<grid_capped(rows * cols), kThreads, 0, s>>>(
      static_cast<const uint8_t*>(codes), static_cast<const uint8_t*>(scales), rows, cols, B,
      static_cast<uint16_t*>(out));
  return cudaGetLastError();
}

cudaError_t launch_pack_fp8_tiles(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0 || rows % kMmaRows != 0 || cols % kMmaChunk != 0 || src == dst)
    return cudaErrorInvalidValue;
  pack_fp8_tiles_kernel<<<grid_capped(rows * cols), kThreads, 0, s>>>(static_cast<const uint8_t*>(src),
                                                                      static_cast<uint8_t*>(dst), rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_pack_fp4_tiles(const void* src, void* dst, const void* src_scales, void* dst_scales,
                                  int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0 || rows % kMmaRows != 0 || cols % kMmaChunk != 0 || src == dst ||
      src_scales == dst_scales)
    return cudaErrorInvalidValue;
  pack_fp4_tiles_kernel<<<grid_capped(rows * cols / 2), kThreads, 0, s>>>(
      static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src_scales),
      static_cast<uint8_t*>(dst_scales), rows, cols);
  return cudaGetLastError();
}

cudaError_t launch_quantize_fp8_block(const void* w, int64_t rows, int64_t cols, int64_t B, void* codes,
                                      void* scales, cudaStream_t s) {
  if (rows <= 0 || cols <= 0 || B <= 0) return cudaErrorInvalidValue;
  const int64_t blocks = (rows + B - 1) / B * ((cols + B - 1) / B);
  if (blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  quantize_fp8_block_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      static_cast<const uint16_t*>(w), rows, cols, B, static_cast<uint8_t*>(codes),
      static_cast<uint8_t*>(scales));
  return cudaGetLastError();
}

cudaError_t launch_quantize_fp4(const void* w, int64_t rows, int64_t cols, void* packed, void* scales,
                                cudaStream_t s) {
  if (rows <= 0 || cols <= 0 || cols % kMmaChunk != 0) return cudaErrorInvalidValue;
  const int64_t warps = rows * (cols / kMmaChunk);
  quantize_fp4_kernel<<<grid_for(warps, kWarps), kThreads, 0, s>>>(static_cast<const uint16_t*>(w), rows,
                                                                   cols, static_cast<uint8_t*>(packed),
                                                                   static_cast<uint8_t*>(scales));
  return cudaGetLastError();
}

}  // namespace dspark::cuda
