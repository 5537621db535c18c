// Weight matrices in bf16 mma tiles (layout: mma_tile.cuh): their shape unit and the packing of a row-major
// matrix into them (weight_tiles.cu), which CudaBackend::prepare_weights (cuda_prepare.cpp) runs at start-up.
// Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dspark::cuda {

// dst = src [rows, cols] bf16 (row-major) rearranged into mma tiles (mma_tile.cuh): rows a multiple of
// kMmaTileRows, cols of kMmaTileCols, both buffers 16-byte aligned, not overlapping.
constexpr int64_t kMmaTileRows = 16, kMmaTileCols = 32;
cudaError_t launch_pack_mma_tiles(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t s);

}  // namespace dspark::cuda
