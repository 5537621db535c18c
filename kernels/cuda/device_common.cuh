// Device helpers shared by the kernels: element loads and stores with the CPU reference's rounding,
// fixed-order reductions, and the transcendental functions evaluated as the CPU's libm does (correctly
// rounded fp32 in all but vanishingly rare cases). Only .cu files include this.
//
// The target compiles with --fmad=false: a * b + c is two roundings, as in the CPU reference (g++ in ISO mode
// does not contract), so element-wise ops match it bit for bit. Long dot products use fmaf explicitly: their
// summation order differs from the CPU's sequential order anyway.
#pragma once

#include <cuda_fp16.h>

#include <cstdint>
#include <utility>

#include "kernels/cuda/launch_common.hpp"
#include "kernels/cuda/launch_policy.hpp"
#ifdef DSPARK_KERNEL_TRACE
#include "kernels/cuda/kernel_trace.hpp"
#endif

namespace dspark::cuda {

// ---- bf16 / f16 with the CPU's conversions (core/numeric.hpp)

__device__ __forceinline__ float bf16_bits_to_float(uint16_t b) {
  return __uint_as_float(static_cast<uint32_t>(b) << 16);
}

__device__ __forceinline__ uint16_t float_to_bf16_bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0)
    return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even on the dropped 16 bits
  return static_cast<uint16_t>(u >> 16);
}

__device__ __forceinline__ float round_bf16(float f) {
  return bf16_bits_to_float(float_to_bf16_bits(f));
}

// A value as it reads back after st() to type t: fused kernels hand a value on as the separate kernels would
// through memory.
__device__ __forceinline__ float as_stored(Elt t, float v) {
  switch (t) {
    case Elt::bf16:
      return round_bf16(v);
    case Elt::f16:
      return __half2float(__float2half_rn(v));
    default:
      return v;
  }
}

struct Bf16 {
  static __device__ __forceinline__ float ld(const void* p, int64_t i) {
    return bf16_bits_to_float(static_cast<const uint16_t*>(p)[i]);
  }
};
struct F16 {
  static __device__ __forceinline__ float ld(const void* p, int64_t i) {
    return __half2float(static_cast<const __half*>(p)[i]);
  }
};
struct F32 {
  static __device__ __forceinline__ float ld(const void* p, int64_t i) {
    return static_cast<const float*>(p)[i];
  }
};

__host__ __device__ __forceinline__ int64_t elt_size(Elt t) {
  return t == Elt::f32 ? 4 : 2;
}

__device__ __forceinline__ float ld(const void* p, Elt t, int64_t i) {
  switch (t) {
    case Elt::bf16:
      return Bf16::ld(p, i);
    case Elt::f16:
      return F16::ld(p, i);
    default:
      return F32::ld(p, i);
  }
}

__device__ __forceinline__ void st(void* p, Elt t, int64_t i, float v) {
  switch (t) {
    case Elt::bf16:
      static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(v);
      return;
    case Elt::f16:
      static_cast<__half*>(p)[i] = __float2half_rn(v);
      return;
    default:
      static_cast<float*>(p)[i] = v;
      return;
  }
}

// Element access for kernels instantiated per dtype: AnyElt switches on the runtime Elt; AllBf16 is the
// all-bf16 case of the draft step, where loads are plain instructions the compiler issues together (behind a
// runtime switch each load sits in a branch whose merge waits for its value, so a kernel's loads run one
// round trip after another).
struct AnyElt {
  static __device__ __forceinline__ float load(const void* p, Elt t, int64_t i) { return ld(p, t, i); }
  static __device__ __forceinline__ void store(void* p, Elt t, int64_t i, float v) { st(p, t, i, v); }
  static __device__ __forceinline__ float stored(Elt t, float v) { return as_stored(t, v); }
};
struct AllBf16 {
  static __device__ __forceinline__ float load(const void* p, Elt, int64_t i) { return Bf16::ld(p, i); }
  static __device__ __forceinline__ void store(void* p, Elt, int64_t i, float v) {
    static_cast<uint16_t*>(p)[i] = float_to_bf16_bits(v);
  }
  static __device__ __forceinline__ float stored(Elt, float v) { return round_bf16(v); }
};

// ---- libm-like fp32 functions: evaluated in double and rounded once, which is the correctly rounded fp32
// result except in double-rounding corner cases (glibc's fp32 functions are correctly rounded in nearly all
// cases, so these agree with the CPU reference far more often than CUDA's 1-2 ulp fp32 versions would).

__device__ __forceinline__ float exp_f(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}
__device__ __forceinline__ float log1p_f(float x) {
  return static_cast<float>(log1p(static_cast<double>(x)));
}
__device__ __forceinline__ float cos_f(float x) {
  return static_cast<float>(cos(static_cast<double>(x)));
}
__device__ __forceinline__ float sin_f(float x) {
  return static_cast<float>(sin(static_cast<double>(x)));
}
__device__ __forceinline__ float sigmoid_f(float v) {
  return 1.0f / (1.0f + exp_f(-v));
}

// std::max / std::min / std::clamp semantics (NaN handling included).
__device__ __forceinline__ float std_max(float a, float b) {
  return (a < b) ? b : a;
}
__device__ __forceinline__ float std_min(float a, float b) {
  return (b < a) ? b : a;
}
__device__ __forceinline__ float std_clamp(float v, float lo, float hi) {
  return (v < lo) ? lo : (hi < v) ? hi : v;
}

// ---- fixed-order reductions

// Butterfly over the 32 lanes: every lane ends with the same bits.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of kThreads threads: warp butterflies, then every thread adds the warp sums in warp order.
// `red` is kWarps floats of shared memory; the call synchronises the block twice (safe to call repeatedly).
__device__ __forceinline__ float block_sum(float v, float* red) {
  v = warp_sum(v);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += red[w];
  __syncthreads();
  return total;
}

// Dot product of n elements by one warp: lane l sums elements l, l + 32, ... with fmaf, then a butterfly.
template <class A, class B>
__device__ __forceinline__ float warp_dot_t(const void* a, const void* b, int64_t n, int lane) {
  float acc = 0.0f;
  for (int64_t i = lane; i < n; i += 32) acc = fmaf(A::ld(a, i), B::ld(b, i), acc);
  return warp_sum(acc);
}

// Both bf16, n % 8 == 0, both rows 16-byte aligned: lane l takes the 8-element chunks l, l + 32, ... (fmaf in
// index order), then a butterfly. An eighth of warp_dot's load instructions.
__device__ __forceinline__ float warp_dot_bf16x8(const void* a, const void* b, int64_t n, int lane) {
  float acc = 0.0f;
#pragma unroll 4  // the loads of several chunks in flight at once; the adds stay in index order
  for (int64_t c = lane; c < n / 8; c += 32) {
    const uint4 p = __ldg(static_cast<const uint4*>(a) + c), q = __ldg(static_cast<const uint4*>(b) + c);
    const uint32_t pa[4] = {p.x, p.y, p.z, p.w}, qa[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc = fmaf(__uint_as_float(pa[k] << 16), __uint_as_float(qa[k] << 16), acc);
      acc = fmaf(__uint_as_float(pa[k] & 0xffff0000u), __uint_as_float(qa[k] & 0xffff0000u), acc);
    }
  }
  return warp_sum(acc);
}

__device__ __forceinline__ float warp_dot(const void* a, Elt at, const void* b, Elt bt, int64_t n, int lane) {
#define DSPARK_DOT_CASE(EA, TA, EB, TB) \
  if (at == Elt::EA && bt == Elt::EB) return warp_dot_t<TA, TB>(a, b, n, lane);
  DSPARK_DOT_CASE(bf16, Bf16, bf16, Bf16)
  DSPARK_DOT_CASE(bf16, Bf16, f32, F32)
  DSPARK_DOT_CASE(f32, F32, bf16, Bf16)
  DSPARK_DOT_CASE(f32, F32, f32, F32)
  DSPARK_DOT_CASE(bf16, Bf16, f16, F16)
  DSPARK_DOT_CASE(f16, F16, bf16, Bf16)
  DSPARK_DOT_CASE(f16, F16, f16, F16)
  DSPARK_DOT_CASE(f16, F16, f32, F32)
  DSPARK_DOT_CASE(f32, F32, f16, F16)
#undef DSPARK_DOT_CASE
  return 0.0f;
}

// Eight bf16 values (one 16-byte load) as floats.
__device__ __forceinline__ void unpack_bf16x8(uint4 q, float v[8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

// Row `row` of a row-major matrix of n-element rows.
__device__ __forceinline__ const void* row_ptr(const void* base, Elt t, int64_t row, int64_t n) {
  return static_cast<const char*>(base) + row * n * elt_size(t);
}

// ---- launches

#ifdef DSPARK_KERNEL_TRACE
// This file's pointers to the kernel start trace (kernel_trace.hpp), set through the registered setter.
namespace kernel_trace_here {
static __device__ KernelTraceRecord* records;
static __device__ unsigned* count;
static __device__ unsigned capacity;
static cudaError_t set(KernelTraceRecord* r, unsigned* c, unsigned cap) {
  cudaError_t err = cudaMemcpyToSymbol(records, &r, sizeof r);
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(count, &c, sizeof c);
  if (err == cudaSuccess) err = cudaMemcpyToSymbol(capacity, &cap, sizeof cap);
  return err;
}
[[maybe_unused]] static const bool registered = kernel_trace_register(&set);
__device__ __forceinline__ uint64_t now() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
}  // namespace kernel_trace_here
#endif

// Programmatic dependent launch (Hopper): launch_kernel lets a kernel start while the previous kernel of its
// stream is still running, so its launch and block scheduling overlap that kernel's tail. Every kernel
// launched through launch_kernel therefore calls this before it touches memory that a kernel may write
// (weights are the exception: nothing in a step writes them, and hc_mix_dots reads some first): it waits
// until the kernels it depends on have finished and their writes are visible, then lets the next kernel start
// its own launch. Without the launch attribute (Tuning::pdl off) both instructions are no-ops.
// let_next_start = false leaves the second to let_next_kernel_start(): a kernel that waits for its peers lets
// the next kernel in only after that wait, so that the next kernel's blocks do not sit on the GPU meanwhile
// (with ranks sharing a GPU, those of a late rank need the room).
__device__ __forceinline__ void let_next_kernel_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void wait_for_previous_kernels(bool let_next_start = true) {
#ifdef DSPARK_KERNEL_TRACE
  const uint64_t launched = kernel_trace_here::now();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  if (let_next_start) let_next_kernel_start();
#ifdef DSPARK_KERNEL_TRACE
  // The first block's last thread, so that warp 0 is not held by the record's atomic.
  if (blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0 && threadIdx.x == blockDim.x - 1 &&
      threadIdx.y == 0 && kernel_trace_here::records != nullptr) {
    const uint64_t ready = kernel_trace_here::now();
    const unsigned i = atomicAdd(kernel_trace_here::count, 1u);
    if (i < kernel_trace_here::capacity)
      kernel_trace_here::records[i] = {launched, ready, gridDim.x, gridDim.y, gridDim.z, blockDim.x};
  }
#endif
}

// kernel<<<grid, block, smem, s>>>(args...), returning the launch's error (one call shape for every kernel of
// the backend, templates and __grid_constant__ parameters included); with programmatic serialisation unless
// programmatic_launch() is off. The kernel must begin with wait_for_previous_kernels().
// launch_clustered: the same, its blocks in clusters of cluster_x consecutive blocks along x (grid.x a
// multiple).
template <class... Params, class... Args>
cudaError_t launch_clustered(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                             unsigned cluster_x, Args&&... args) {
  cudaLaunchAttribute attrs[2] = {};
  unsigned n = 0;
  if (programmatic_launch()) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n++].val.programmaticStreamSerializationAllowed = 1;
  }
  if (cluster_x > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n++].val.clusterDim = {cluster_x, 1, 1};
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attrs;
  cfg.numAttrs = n;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}
template <class... Params, class... Args>
cudaError_t launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
                          Args&&... args) {
  return launch_clustered(kernel, grid, block, smem, s, 1, std::forward<Args>(args)...);
}

// cp.async (sm_80 and later): 16 bytes global -> shared without registers, in commit groups.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src) {
  asm volatile(
      "cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(static_cast<uint32_t>(__cvta_generic_to_shared(dst))),
      "l"(src)
      : "memory");
}
__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
__device__ __forceinline__ void cp_async_wait_all() {
  asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
}

// Launch bookkeeping.
inline unsigned grid_for(int64_t n, int64_t per_block) {
  const int64_t g = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(g < 1 ? 1 : g);
}
constexpr int64_t kMaxGrid = 1 << 20;  // grid-stride loops cap their grid here

}  // namespace dspark::cuda
