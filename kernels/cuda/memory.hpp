// Fills, copies, dtype conversion and the embedding gather (memory.cu); their CudaBackend ops are in
// memory_ops.cpp. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/launch_common.hpp"

namespace dspark::cuda {

cudaError_t launch_fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t s);
cudaError_t launch_copy(const void* src, void* dst, int64_t bytes, bool last_after_rest, cudaStream_t s);
// Row r of dst (row_bytes each) = the row_bytes at address sources[r] (mapped host memory), unless it is 0.
cudaError_t launch_gather_rows(const uint64_t* sources, void* dst, int64_t rows, int64_t row_bytes,
                               cudaStream_t s);
cudaError_t launch_convert(const void* src, Elt src_t, void* dst, Elt dst_t, int64_t n, cudaStream_t s);
// out[t] = table[ids[t]]; an id outside [0, V) gives a zero row.
cudaError_t launch_embed(const void* table, Elt table_t, int64_t V, int64_t H, const int32_t* ids, int64_t T,
                         void* out, Elt out_t, cudaStream_t s);

}  // namespace dspark::cuda
