// What every kernel family's launch header (<family>.hpp) shares: the float storage types, the block size and
// the 16-byte alignment test. Plain C++, included by the host wrappers (g++) and by the .cu files (nvcc).
#pragma once

#include <cstdint>

// Every launcher takes raw device pointers, sizes and the stream, enqueues its kernels on that stream and
// returns cudaGetLastError() (cudaSuccess when there was nothing to do); the host side turns an error into a
// dspark::Error that names the op. No launcher synchronises, allocates or copies from the host, so every op
// can be captured in a CUDA graph.
namespace dspark::cuda {

// Float storage types an op may read or write (as dspark::DType bf16 / f16 / f32).
enum class Elt : int32_t { bf16 = 0, f16 = 1, f32 = 2 };

// Whether a pointer allows 16-byte vector loads (the kernels' fast paths and the tensor-core paths need it).
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Block sizes are constants (never derived from the GPU), so every rank reduces in the same order.
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

}  // namespace dspark::cuda
