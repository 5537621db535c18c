// Fills, copies, dtype conversion and the embedding gather.
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/memory.hpp"

namespace dspark::cuda {
namespace {

constexpr int kCopyThreads = 1024;
constexpr int64_t kBulkCopyGrid = 1024;  // blocks of a bulk copy: 4 MB per grid-stride round
constexpr int64_t kGatherPiece = 8192;   // bytes of a row per block of a row gather

__global__ void fill_i32_kernel(int32_t* p, int64_t n, int32_t value) {
  wait_for_previous_kernels();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p[i] = value;
}

__global__ void convert_kernel(const void* src, Elt src_t, void* dst, Elt dst_t, int64_t n) {
  wait_for_previous_kernels();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    st(dst, dst_t, i, ld(src, src_t, i));
}

// dst = src, n bytes, by one block: 32-bit words when both sides and n allow, else bytes. Either side may be
// mapped host memory (each word one PCIe transaction, all in flight together). With last_after_rest the last
// word (or byte) is written only after every thread's others are visible system-wide, so that a host polling
// it (Backend::wait_for_word) finds the rest in place.
__global__ void __launch_bounds__(kCopyThreads)
    copy_kernel(const void* src, void* dst, int64_t n, bool last_after_rest) {
  wait_for_previous_kernels();
  const bool words = ((reinterpret_cast<uintptr_t>(src) | reinterpret_cast<uintptr_t>(dst) | n) & 3) == 0;
  const int64_t count = words ? n / 4 : n;
  const auto copy_one = [&](int64_t i) {
    if (words)
      static_cast<uint32_t*>(dst)[i] = static_cast<const uint32_t*>(src)[i];
    else
      static_cast<uint8_t*>(dst)[i] = static_cast<const uint8_t*>(src)[i];
  };
  const int64_t rest = last_after_rest ? count - 1 : count;
  for (int64_t i = threadIdx.x; i < rest; i += blockDim.x) copy_one(i);
  if (!last_after_rest) return;
  __threadfence_system();  // this thread's words are visible before the barrier
  __syncthreads();
  if (threadIdx.x == 0) copy_one(count - 1);
}

// A copy with no completion word (e.g. an insert's staged rows, mapped host memory into the device): many
// blocks of 16-byte loads, since reads of mapped host memory each wait a bus round trip.
__global__ void __launch_bounds__(kThreads) bulk_copy_kernel(const uint4* src, uint4* dst, int64_t n16) {
  wait_for_previous_kernels();
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n16;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    dst[i] = src[i];
}

// A block per (row, kGatherPiece bytes of it), 16-byte loads where the addresses allow: like the bulk copy,
// many reads of mapped host memory in flight.
__global__ void __launch_bounds__(kThreads)
    gather_rows_kernel(const uint64_t* sources, uint8_t* dst, int64_t row_bytes) {
  wait_for_previous_kernels();
  const uint64_t a = sources[blockIdx.x];
  if (a == 0) return;
  const uint8_t* src = reinterpret_cast<const uint8_t*>(a);
  uint8_t* out = dst + blockIdx.x * row_bytes;
  const int64_t begin = blockIdx.y * kGatherPiece;
  const int64_t end = begin + kGatherPiece < row_bytes ? begin + kGatherPiece : row_bytes;
  if (((a | reinterpret_cast<uintptr_t>(out) | static_cast<uint64_t>(row_bytes)) & 15) == 0) {
    for (int64_t i = begin + threadIdx.x * 16; i < end; i += kThreads * 16)
      *reinterpret_cast<uint4*>(out + i) = *reinterpret_cast<const uint4*>(src + i);
  } else {
    for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) out[i] = src[i];
  }
}

// A block per (token, 256 channels): one row of 5120 would otherwise be a few blocks walking it in series.
__global__ void embed_kernel(const void* table, Elt table_t, int64_t V, int64_t H, const int32_t* ids,
                             void* out, Elt out_t) {
  wait_for_previous_kernels();
  const int64_t t = blockIdx.x, i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= H) return;
  const int32_t id = ids[t];
  const bool valid = id >= 0 && id < V;
  st(out, out_t, t * H + i, valid ? ld(table, table_t, id * H + i) : 0.0f);
}

}  // namespace

cudaError_t launch_fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t g = grid_for(n, kThreads);
  return launch_kernel(fill_i32_kernel, static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid), kThreads, 0, s, p,
                       n, value);
}

cudaError_t launch_convert(const void* src, Elt src_t, void* dst, Elt dst_t, int64_t n, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t g = grid_for(n, kThreads);
  return launch_kernel(convert_kernel, static_cast<unsigned>(g < kMaxGrid ? g : kMaxGrid), kThreads, 0, s,
                       src, src_t, dst, dst_t, n);
}

cudaError_t launch_copy(const void* src, void* dst, int64_t bytes, bool last_after_rest, cudaStream_t s) {
  if (bytes <= 0) return cudaSuccess;
  if (!last_after_rest && bytes % 16 == 0 && aligned16(src) && aligned16(dst) && bytes > 16 * kCopyThreads) {
    const int64_t n16 = bytes / 16, g = grid_for(n16, kThreads);
    return launch_kernel(bulk_copy_kernel, static_cast<unsigned>(g < kBulkCopyGrid ? g : kBulkCopyGrid),
                         kThreads, 0, s, static_cast<const uint4*>(src), static_cast<uint4*>(dst), n16);
  }
  return launch_kernel(copy_kernel, 1, kCopyThreads, 0, s, src, dst, bytes, last_after_rest);
}

cudaError_t launch_gather_rows(const uint64_t* sources, void* dst, int64_t rows, int64_t row_bytes,
                               cudaStream_t s) {
  if (rows <= 0 || row_bytes <= 0) return cudaSuccess;
  if (rows > INT32_MAX || (row_bytes + kGatherPiece - 1) / kGatherPiece > 65535) return cudaErrorInvalidValue;
  const dim3 grid(static_cast<unsigned>(rows),
                  static_cast<unsigned>((row_bytes + kGatherPiece - 1) / kGatherPiece));
  return launch_kernel(gather_rows_kernel, grid, kThreads, 0, s, sources, static_cast<uint8_t*>(dst),
                       row_bytes);
}

cudaError_t launch_embed(const void* table, Elt table_t, int64_t V, int64_t H, const int32_t* ids, int64_t T,
                         void* out, Elt out_t, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  return launch_kernel(embed_kernel, dim3(static_cast<unsigned>(T), grid_for(H, kThreads)), kThreads, 0, s,
                       table, table_t, V, H, ids, out, out_t);
}

}  // namespace dspark::cuda
