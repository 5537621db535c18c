// KV ring writes (ring.cu): 16-bit ring rows, positions i32; the ring ops (ring_write, ring_clear) are in
// ring_ops.cpp. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace dspark::cuda {

cudaError_t launch_ring_write(uint16_t* ring_kv, int32_t* ring_pos, int64_t slots, int64_t W, int64_t d,
                              const uint16_t* kv, const int32_t* row_slot, const int32_t* row_pos, int64_t N,
                              cudaStream_t s);

}  // namespace dspark::cuda
