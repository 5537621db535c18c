// Linear layers with fp8 block weights (SPEC §3) on the tensor cores: the activation quantisation
// (quant_act.cu), the few-row product from weights in fp8 mma tiles (quant_linear.cu, layout: quant_tile.cuh)
// and the packing of checkpoint weights into those tiles (quant_tiles.cu). linear and grouped_linear
// (dense_ops.cpp, quant_ops.cpp) take them for fp8 weights. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "kernels/cuda/quant_act.hpp"

namespace dspark::cuda {

// x bf16 [T, K] (row stride x_stride elements) quantised per block of B (a multiple of 32 dividing K).
cudaError_t launch_quantize_act(const void* x, int64_t T, int64_t K, int64_t x_stride, int64_t B, QuantAct q,
                                cudaStream_t s);

// The same quantisation written as the quantised values in bf16, out [T, K] = code times scale (exact).
cudaError_t launch_quantize_act_bf16(const void* x, int64_t T, int64_t K, int64_t x_stride, int64_t B,
                                     void* out, cudaStream_t s);

// out [T, N] = the quantised product of x (as a QuantAct of [T, K]) with W [N, K] fp8 block (its tiles, its
// block scales [ceil(N / B), K / B] e8m0): N a multiple of 16, K of 32 and of B, B of 16. out bf16 or f32.
// T up to kQuantLinearMaxRows per launch (the caller splits larger T).
constexpr int64_t kQuantLinearMaxRows = 80;
cudaError_t launch_fp8_linear(QuantAct x, int64_t T, const void* w_tiles, const uint8_t* w_scales, int64_t N,
                              int64_t K, int64_t B, void* out, Elt out_t, cudaStream_t s);
// launch_fp8_linear of `matrices` weights of one shape on the same x in one launch (an insert's wkv of every
// stage): out[i] = x W_i^T, each with the bits launch_fp8_linear gives it alone.
constexpr int kFp8LinearMaxMatrices = 4;
cudaError_t launch_fp8_linear_multi(QuantAct x, int64_t T, const void* const* w_tiles,
                                    const uint8_t* const* w_scales, int matrices, int64_t N, int64_t K,
                                    int64_t B, void* const* out, Elt out_t, cudaStream_t s);

// out [T, G out_g] = x [T, G K] W^T per group with W [G out_g, K] fp8 block dequantised and x bf16 used as
// it is (SPEC §3's wo_a rule): group g's rows read x's columns [g K, g K + K). out_g a multiple of 16, K of
// 32 and of B; x 16-byte aligned; T up to kQuantLinearMaxRows.
cudaError_t launch_fp8_grouped_bf16(const void* x, int64_t T, int64_t groups, const void* w_tiles,
                                    const uint8_t* w_scales, int64_t out_g, int64_t K, int64_t B, void* out,
                                    Elt out_t, cudaStream_t s);

// Row-major checkpoint parts into the tile layouts of quant_tile.cuh (rows % 16 == 0, cols % 32 == 0):
// fp8 codes [rows, cols]; fp4 packed codes [rows, cols / 2] and their scales [rows, cols / 32].
cudaError_t launch_pack_fp8_tiles(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t s);
cudaError_t launch_pack_fp4_tiles(const void* src, void* dst, const void* src_scales, void* dst_scales,
                                  int64_t rows, int64_t cols, cudaStream_t s);

// SPEC §3's weight quantisation of a bf16 matrix [rows, cols] (the bench's synthetic fp8 checkpoint, made on
// the device; lib/core/block_quant's rules and bits): fp8 block codes [rows, cols] + scales [ceil(rows / B),
// ceil(cols / B)]; fp4 packed [rows, cols / 2] + scales [rows, cols / 32] (cols % 32 == 0).
cudaError_t launch_quantize_fp8_block(const void* w, int64_t rows, int64_t cols, int64_t B, void* codes,
                                      void* scales, cudaStream_t s);
cudaError_t launch_quantize_fp4(const void* w, int64_t rows, int64_t cols, void* packed, void* scales,
                                cudaStream_t s);

// An fp8 block matrix (row-major codes [rows, cols], scales [ceil(rows / B), ceil(cols / B)]) dequantised to
// bf16 [rows, cols]: code times 2^(scale - 127), exact and normal when every scale byte lies in [10, 246]
// (fp8_dequantised_exact_scale); the caller checks.
cudaError_t launch_dequantize_fp8_block(const void* codes, const void* scales, int64_t rows, int64_t cols,
                                        int64_t B, void* out, cudaStream_t s);
// Whether an e8m0 block scale keeps every e4m3 code times it an exact, normal bf16 value (no subnormal for a
// matrix product to flush): the smallest step, 2^(e - 136), at least 2^-126, and the largest value,
// 448 2^(e - 127), below bf16's overflow.
constexpr bool fp8_dequantised_exact_scale(uint8_t e) {
  return e >= 10 && e <= 246;
}

}  // namespace dspark::cuda
