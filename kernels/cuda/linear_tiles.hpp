// Few-row linear layers on the tensor cores from weights in mma tiles (linear_tiles.cu); linear and
// grouped_linear (dense_ops.cpp) take it for a draft step's rows. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch_common.hpp"

namespace dspark::cuda {

// out [T, G out_g] = x [T, G K] W^T per group (W [G out_g, K] bf16 in mma tiles; group g's rows read x's
// columns [g K, g K + K)) for T <= kLinearTilesMaxRows: the few-row linear layers of a draft step. x bf16,
// 16-byte aligned; out bf16 or f32; out_g a multiple of 16, K of 32.
constexpr int64_t kLinearTilesMaxRows = 16;
cudaError_t launch_linear_tiles(const void* x, int64_t T, int64_t groups, const void* w_tiles, int64_t out_g,
                                int64_t K, void* out, Elt out_t, cudaStream_t s);
// The same for up to kLinearTilesMaxMatrices matrices of one shape on the same x in one launch (an insert's
// wkv of every stage): out[m] = x W_m^T, each with the bits of its own launch_linear_tiles.
constexpr int kLinearTilesMaxMatrices = 8;
cudaError_t launch_linear_tiles_multi(const void* x, int64_t T, int64_t groups, const void* const* w_tiles,
                                      int matrices, int64_t out_g, int64_t K, void* const* out, Elt out_t,
                                      cudaStream_t s);

}  // namespace dspark::cuda
