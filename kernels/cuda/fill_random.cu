// The synthetic weight generator of fill_random.hpp: one thread per element, grid-stride. The arithmetic is
// synthetic.cpp's, operation for operation (the target builds with --fmad=false, so mean + std * z rounds
// twice as on the CPU), hence the same bits.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/fill_random.hpp"

namespace dspark::cuda {
namespace {

constexpr uint64_t kGamma = 0x9e3779b97f4a7c15ull;

__host__ __device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Sum of four 16-bit uniforms, centred and scaled to unit variance (bounded at +-3.46).
__host__ __device__ __forceinline__ float unit_normal(uint64_t x) {
  const uint64_t f = (x & 0xffff) + ((x >> 16) & 0xffff) + ((x >> 32) & 0xffff) + (x >> 48);
  const float u4 = (static_cast<float>(f) + 2.0f) * (1.0f / 65536.0f);
  return (u4 - 2.0f) * 1.7320508f;
}

__host__ __device__ __forceinline__ float synthetic_value(uint64_t key, int64_t global_index, float mean,
                                                          float std) {
  const uint64_t x = mix64(key + static_cast<uint64_t>(global_index + 1) * kGamma);
  return mean + std * unit_normal(x);
}

__global__ void fill_synthetic_kernel(void* dst, Elt dst_t, SyntheticFill f) {
  const int64_t n = f.rows * f.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / f.cols, c = i - r * f.cols;
    const int64_t g = (f.row0 + r) * f.full_cols + f.col0 + c;
    st(dst, dst_t, i, synthetic_value(f.key, g, f.mean, f.std));
  }
}

__global__ void fill_trellis_kernel(int16_t* dst, TrellisFill f) {
  const int64_t per_row = f.tiles_out * f.per_tile, n = f.tiles_in * per_row;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t a = i / per_row, rest = i - a * per_row;
    const int64_t g = ((f.tk0 + a) * f.tiles_out_full + f.tn0) * f.per_tile + rest;
    const uint64_t bits = mix64(f.key + static_cast<uint64_t>(g / 4 + 1) * kGamma);
    dst[i] = static_cast<int16_t>(static_cast<uint16_t>(bits >> (16 * (g % 4))));
  }
}

}  // namespace

cudaError_t launch_fill_trellis(int16_t* dst, const TrellisFill& f, cudaStream_t s) {
  const int64_t n = f.tiles_in * f.tiles_out * f.per_tile;
  if (n <= 0) return cudaSuccess;
  const int64_t g = grid_for(n, kThreads);
  fill_trellis_kernel<<<static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid), kThreads, 0, s>>>(dst, f);
  return cudaGetLastError();
}

cudaError_t launch_fill_synthetic(void* dst, Elt dst_t, const SyntheticFill& f, cudaStream_t s) {
  const int64_t n = f.rows * f.cols;
  if (n <= 0) return cudaSuccess;
  const int64_t g = grid_for(n, kThreads);
  fill_synthetic_kernel<<<static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid), kThreads, 0, s>>>(dst, dst_t,
                                                                                                f);
  return cudaGetLastError();
}

}  // namespace dspark::cuda
