// A bf16 matrix from row-major into mma tiles (mma_tile.cuh), once at start-up: a thread per 16-byte piece of
// the destination, which names the row-major piece it copies.
#include <algorithm>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/weight_tiles.hpp"

namespace dspark::cuda {
namespace {

__global__ void pack_mma_tiles_kernel(const uint4* src, uint4* dst, int64_t rows, int64_t cols) {
  const int64_t pieces = rows * cols / 8;
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < pieces;
       p += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t row = 0, col = 0;
    mma_tile_piece_source(p * 8, cols, &row, &col);
    dst[p] = src[(row * cols + col) / 8];
  }
}

}  // namespace

cudaError_t launch_pack_mma_tiles(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t s) {
  if (rows <= 0 || cols <= 0 || rows % kMmaRows != 0 || cols % kMmaChunk != 0 || !aligned16(src) ||
      !aligned16(dst) || src == dst)
    return cudaErrorInvalidValue;
  const int64_t pieces = rows * cols / 8;
  const int64_t blocks = std::min<int64_t>((pieces + kThreads - 1) / kThreads, 4096);
  pack_mma_tiles_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(
      static_cast<const uint4*>(src), static_cast<uint4*>(dst), rows, cols);
  return cudaGetLastError();
}

}  // namespace dspark::cuda
