// The dense fallback of linear / grouped_linear (dense.cu); the linear ops (cuBLAS, linear_tiles.hpp, this)
// are in dense_ops.cpp. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch_common.hpp"

namespace dspark::cuda {

// y[t, o] = x[t, g in_g + i] . w[o, i], g = o / out_g; warp per output, fp32 accumulation. Used for weights
// cuBLAS does not take with bf16 activations (f16 / f32) and for activations that are not bf16.
cudaError_t launch_dense_gemv(const void* x, Elt x_t, int64_t x_stride, const void* w, Elt w_t, void* y,
                              Elt y_t, int64_t y_stride, int64_t rows, int64_t n_out, int64_t in_g,
                              int64_t out_g, cudaStream_t s);

}  // namespace dspark::cuda
