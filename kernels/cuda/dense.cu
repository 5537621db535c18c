// The dense fallback of linear / grouped_linear: one warp per output element, fp32 accumulation (fmaf over a
// strided slice per lane, then a butterfly), the result rounded once to the output type.
#include "kernels/cuda/dense.hpp"
#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {
namespace {

constexpr int64_t kMaxGridY = 65535;

__global__ void dense_gemv_kernel(const void* x, Elt x_t, int64_t x_stride, const void* w, Elt w_t, void* y,
                                  Elt y_t, int64_t y_stride, int64_t row0, int64_t n_out, int64_t in_g,
                                  int64_t out_g) {
  wait_for_previous_kernels();
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t o = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  if (o >= n_out) return;
  const int64_t t = row0 + blockIdx.y;
  const int64_t g = o / out_g;
  const float v = warp_dot(static_cast<const char*>(x) + (t * x_stride + g * in_g) * elt_size(x_t), x_t,
                           static_cast<const char*>(w) + o * in_g * elt_size(w_t), w_t, in_g, lane);
  if (lane == 0) st(y, y_t, t * y_stride + o, v);
}

}  // namespace

cudaError_t launch_dense_gemv(const void* x, Elt x_t, int64_t x_stride, const void* w, Elt w_t, void* y,
                              Elt y_t, int64_t y_stride, int64_t rows, int64_t n_out, int64_t in_g,
                              int64_t out_g, cudaStream_t s) {
  if (rows <= 0 || n_out <= 0) return cudaSuccess;
  for (int64_t r0 = 0; r0 < rows; r0 += kMaxGridY) {
    const int64_t n = rows - r0 < kMaxGridY ? rows - r0 : kMaxGridY;
    const dim3 grid(grid_for(n_out, kWarps), static_cast<unsigned>(n));
    const cudaError_t err = launch_kernel(dense_gemv_kernel, grid, kThreads, 0, s, x, x_t, x_stride, w, w_t,
                                          y, y_t, y_stride, r0, n_out, in_g, out_g);
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace dspark::cuda
