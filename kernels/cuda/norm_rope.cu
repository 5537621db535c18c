// RMSNorm, RoPE and the fp8 e4m3 quantise-dequantise of KV rows (separately, and fused for the KV row).
#include "kernels/cuda/act_quant.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/norm_rope.hpp"

namespace dspark::cuda {
namespace {

// This thread's share of row `row`'s sum of squares (n values), in the order rms_norm_kernel's reduction
// expects: kVec (bf16, n % 8 == 0, 16-byte aligned rows): the 8-element chunks tid, tid + 256, ...; otherwise
// elements tid, tid + 256, ... Both norm kernels use it, so the fused KV row gets rms_norm's bits.
template <bool kVec>
__device__ __forceinline__ float row_sum_squares_part(const void* x, Elt x_t, int64_t row, int64_t n,
                                                      int tid) {
  float ss = 0.0f;
  if constexpr (kVec) {
    const uint4* xr = static_cast<const uint4*>(x) + row * n / 8;
    for (int64_t c = tid; c < n / 8; c += kThreads) {
      const uint4 q = xr[c];
      const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float a = __uint_as_float(wq[k] << 16), b = __uint_as_float(wq[k] & 0xffff0000u);
        ss = fmaf(a, a, ss);
        ss = fmaf(b, b, ss);
      }
    }
  } else {
    for (int64_t i = tid; i < n; i += kThreads) {
      const float v = ld(x, x_t, row * n + i);
      ss = fmaf(v, v, ss);
    }
  }
  return ss;
}

// Block (row, 256 outputs): the row's sum of squares in fp32 (fixed-order block reduction: every block of
// the row gets the same bits), then w * (x * r) as the CPU for its outputs. A few rows of 5120 thus spread
// over many blocks instead of one thread walking 20 outputs. kVec: bf16 x, n % 8 == 0, 16-byte aligned rows:
// thread i takes the 8-element chunks i, i + 256, ... (fewer, wider loads: a row of 5120 is 3 loads per
// thread instead of 20).
// codes: also the output's activation quantisation (bf16 out; store_act_code's shape).
template <bool kVec>
__global__ void rms_norm_kernel(const void* x, Elt x_t, const void* w, Elt w_t, float eps, void* out,
                                Elt out_t, int64_t n, QuantActOut codes) {
  wait_for_previous_kernels();
  __shared__ float red[kWarps];
  const int64_t row = blockIdx.x;
  const float ss = row_sum_squares_part<kVec>(x, x_t, row, n, static_cast<int>(threadIdx.x));
  const float ms = block_sum(ss, red) / static_cast<float>(n);
  const float r = 1.0f / sqrtf(ms + eps);
  const int64_t i = blockIdx.y * static_cast<int64_t>(kThreads) + threadIdx.x;
  const bool valid = i < n;
  const float v = valid ? ld(w, w_t, i) * (ld(x, x_t, row * n + i) * r) : 0.0f;
  if (valid) st(out, out_t, row * n + i, v);
  if (codes.wanted()) store_act_code(round_bf16(v), valid, row, i, n, codes, red);
}

// Block (token, pair chunk); a thread per (head, pair). Frequencies come from the host (the CPU's
// expression).
__global__ void rope_kernel(void* x, Elt x_t, const int32_t* pos, int64_t heads, int64_t d, int64_t rope_dim,
                            const __grid_constant__ RopeFreqs freqs, bool inverse) {
  wait_for_previous_kernels();
  const int64_t t = blockIdx.x, half = rope_dim / 2, first = d - rope_dim;
  const int64_t q = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (q >= heads * half) return;
  const float p = static_cast<float>(pos[t]);
  const int64_t h = q / half, j = q % half;
  const float angle = p * freqs.f[j];
  const float c = cos_f(angle), s = inverse ? -sin_f(angle) : sin_f(angle);
  const int64_t i = (t * heads + h) * d + first + 2 * j;
  const float a = ld(x, x_t, i), b = ld(x, x_t, i + 1);
  st(x, x_t, i, a * c - b * s);
  st(x, x_t, i + 1, a * s + b * c);
}

// Power-of-two scale 2^ceil(log2(max(amax, 1e-4) / 448)), exactly as kernels/cpu/rope_quant.cpp.
__device__ float fp8_block_scale(float amax) {
  const float v = std_max(amax, 1e-4f) / 448.0f;
  int e = 0;
  const float m = frexpf(v, &e);
  return ldexpf(1.0f, m == 0.5f ? e - 1 : e);
}

// The value of f rounded to e4m3fn (nearest even, saturating at 448), as core/numeric.cpp's
// e4m3_to_float(float_to_e4m3(f)).
__device__ float round_e4m3(float f) {
  if (isnan(f)) return f;
  const bool neg = signbit(f);
  float a = fminf(fabsf(f), 448.0f);
  if (a < 0.015625f) {
    a = rintf(a * 512.0f) / 512.0f;  // subnormals: multiples of 2^-9 (8 * 2^-9 is the smallest normal)
  } else {
    int e = 0;
    frexpf(a, &e);
    const float ulp = ldexpf(1.0f, e - 1 - 3);
    a = rintf(a / ulp) * ulp;  // 3 mantissa bits, may carry into the next binade (still <= 448)
  }
  return neg ? -a : a;
}

// One warp per quantisation block: lanes stride its elements; the block's amax by a butterfly of std_max
// (max is exact, so the order does not matter for finite values).
__global__ void kv_qdq_kernel(void* x, Elt x_t, int64_t n, int64_t block, int64_t nblocks) {
  wait_for_previous_kernels();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t q = blockIdx.x * static_cast<int64_t>(kWarps) + threadIdx.x / 32;
  if (q >= nblocks) return;
  const int64_t b0 = q * block, len = n - b0 < block ? n - b0 : block;
  float amax = 0.0f;
  for (int64_t i = lane; i < len; i += 32) amax = std_max(amax, fabsf(ld(x, x_t, b0 + i)));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) amax = std_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float s = fp8_block_scale(amax);
  for (int64_t i = lane; i < len; i += 32) {
    const float v = round_e4m3(std_clamp(ld(x, x_t, b0 + i) / s, -448.0f, 448.0f));
    st(x, x_t, b0 + i, v * s);
  }
}

// RMSNorm, forward RoPE and fp8 QDQ of KV rows in one kernel: a block per row, the row kept in shared memory
// (as the values the separate kernels would have stored) between the steps. Each step is the separate
// kernel's arithmetic with its reduction shapes (rms_norm_kernel<kVec>'s sum of squares, rope_kernel's
// rotation, kv_qdq_kernel's warp per quantisation block), so the result is the same bits as running the
// three. d % block == 0 (the quantisation blocks stay inside a row).
template <bool kVec>
__device__ __forceinline__ void kv_finish_row(const void* x, Elt x_t, int64_t row, const void* w, Elt w_t,
                                              float eps, float p, int64_t d, int64_t rope_dim,
                                              const RopeFreqs& freqs, int64_t block, void* out,
                                              int64_t out_base, Elt out_t, float* v, float* red) {
  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const float ss = row_sum_squares_part<kVec>(x, x_t, row, d, tid);
  const float r = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(d) + eps);
  for (int64_t i = tid; i < d; i += kThreads)
    v[i] = as_stored(out_t, ld(w, w_t, i) * (ld(x, x_t, row * d + i) * r));
  __syncthreads();
  const int64_t half = rope_dim / 2, first = d - rope_dim;
  for (int64_t j = tid; j < half; j += kThreads) {
    const float angle = p * freqs.f[j];
    const float c = cos_f(angle), sn = sin_f(angle);
    const int64_t i = first + 2 * j;
    const float a = v[i], b = v[i + 1];
    v[i] = as_stored(out_t, a * c - b * sn);
    v[i + 1] = as_stored(out_t, a * sn + b * c);
  }
  __syncthreads();
  for (int64_t b0 = warp * block; b0 < d; b0 += kWarps * block) {
    float amax = 0.0f;
    for (int64_t i = lane; i < block; i += 32) amax = std_max(amax, fabsf(v[b0 + i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = std_max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float sc = fp8_block_scale(amax);
    for (int64_t i = lane; i < block; i += 32)
      st(out, out_t, out_base + b0 + i, round_e4m3(std_clamp(v[b0 + i] / sc, -448.0f, 448.0f)) * sc);
  }
}

template <bool kVec>
__global__ void kv_norm_rope_qdq_kernel(const void* x, Elt x_t, const void* w, Elt w_t, float eps,
                                        const int32_t* pos, int64_t d, int64_t rope_dim,
                                        const __grid_constant__ RopeFreqs freqs, int64_t block, void* out,
                                        Elt out_t) {
  wait_for_previous_kernels();
  extern __shared__ float v[];  // [d]
  __shared__ float red[kWarps];
  const int64_t row = blockIdx.x;
  kv_finish_row<kVec>(x, x_t, row, w, w_t, eps, static_cast<float>(pos[row]), d, rope_dim, freqs, block, out,
                      row * d, out_t, v, red);
}

// kv_norm_rope_qdq_kernel's rows written straight into the stages' rings (ring_write_kernel's placement and
// its rule that a later row for the same entry wins): a block per (row, stage).
template <bool kVec>
__global__ void kv_rows_to_rings_kernel(const __grid_constant__ KvRingStages st_, Elt x_t, Elt w_t, float eps,
                                        const int32_t* pos, const int32_t* row_slot, int64_t N, int64_t slots,
                                        int64_t W, int64_t d, int64_t rope_dim,
                                        const __grid_constant__ RopeFreqs freqs, int64_t block) {
  wait_for_previous_kernels();
  extern __shared__ float v[];  // [d]
  __shared__ float red[kWarps];
  const int64_t n = blockIdx.x, stage = blockIdx.y;
  const int32_t slot = row_slot[n], p = pos[n];
  if (slot < 0 || slot >= slots || p < 0) return;
  const int64_t e = p % W;
  bool later = false;
  for (int64_t m = n + 1 + threadIdx.x; m < N; m += blockDim.x)
    later = later || (row_slot[m] == slot && pos[m] >= 0 && pos[m] % W == e);
  if (__syncthreads_or(later)) return;
  kv_finish_row<kVec>(st_.kv[stage], x_t, n, st_.norm[stage], w_t, eps, static_cast<float>(p), d, rope_dim,
                      freqs, block, st_.ring_kv[stage], (slot * W + e) * d, Elt::bf16, v, red);
  if (threadIdx.x == 0) st_.ring_pos[stage][slot * W + e] = p;
}

}  // namespace

size_t kv_norm_rope_qdq_smem_bytes(int64_t d) {
  return static_cast<size_t>(d) * sizeof(float);
}

cudaError_t launch_kv_norm_rope_qdq(const void* x, Elt x_t, const void* w, Elt w_t, float eps,
                                    const int32_t* pos, int64_t N, int64_t d, int64_t rope_dim,
                                    const RopeFreqs& freqs, int64_t block, void* out, Elt out_t,
                                    cudaStream_t s) {
  if (N <= 0 || d <= 0) return cudaSuccess;
  if (block < 1 || d % block != 0 || rope_dim < 0 || rope_dim > d || rope_dim % 2 != 0 ||
      kv_norm_rope_qdq_smem_bytes(d) > 48 * 1024)
    return cudaErrorInvalidValue;
  const bool vec = x_t == Elt::bf16 && d % 8 == 0 && aligned16(x);
  return launch_kernel(vec ? kv_norm_rope_qdq_kernel<true> : kv_norm_rope_qdq_kernel<false>,
                       static_cast<unsigned>(N), kThreads, kv_norm_rope_qdq_smem_bytes(d), s, x, x_t, w, w_t,
                       eps, pos, d, rope_dim, freqs, block, out, out_t);
}

cudaError_t launch_kv_rows_to_rings(const KvRingStages& stages, int n_stages, Elt x_t, Elt w_t, float eps,
                                    const int32_t* pos, const int32_t* row_slot, int64_t N, int64_t slots,
                                    int64_t W, int64_t d, int64_t rope_dim, const RopeFreqs& freqs,
                                    int64_t block, cudaStream_t s) {
  if (N <= 0 || d <= 0 || n_stages <= 0) return cudaSuccess;
  if (n_stages > kMaxKvRingStages || block < 1 || d % block != 0 || rope_dim < 0 || rope_dim > d ||
      rope_dim % 2 != 0 || kv_norm_rope_qdq_smem_bytes(d) > 48 * 1024 || W < 1)
    return cudaErrorInvalidValue;
  bool vec = x_t == Elt::bf16 && d % 8 == 0;
  for (int i = 0; i < n_stages; ++i) vec = vec && aligned16(stages.kv[i]);
  const dim3 grid(static_cast<unsigned>(N), static_cast<unsigned>(n_stages));
  return launch_kernel(vec ? kv_rows_to_rings_kernel<true> : kv_rows_to_rings_kernel<false>, grid, kThreads,
                       kv_norm_rope_qdq_smem_bytes(d), s, stages, x_t, w_t, eps, pos, row_slot, N, slots, W,
                       d, rope_dim, freqs, block);
}

cudaError_t launch_rms_norm(const void* x, Elt x_t, const void* w, Elt w_t, float eps, void* out, Elt out_t,
                            int64_t rows, int64_t n, cudaStream_t s, const QuantActOut& codes) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  if (codes.wanted() && (out_t != Elt::bf16 || !quant_act_out_fits(n, codes.block)))
    return cudaErrorInvalidValue;
  const bool vec = x_t == Elt::bf16 && n % 8 == 0 && aligned16(x);
  const dim3 grid(static_cast<unsigned>(rows), grid_for(n, kThreads));  // (row, 256 outputs)
  return launch_kernel(vec ? rms_norm_kernel<true> : rms_norm_kernel<false>, grid, kThreads, 0, s, x, x_t, w,
                       w_t, eps, out, out_t, n, codes);
}

cudaError_t launch_rope(void* x, Elt x_t, const int32_t* pos, int64_t T, int64_t heads, int64_t d,
                        int64_t rope_dim, const RopeFreqs& freqs, bool inverse, cudaStream_t s) {
  if (T <= 0 || heads <= 0 || rope_dim <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(T), grid_for(heads * (rope_dim / 2), kThreads));
  return launch_kernel(rope_kernel, grid, kThreads, 0, s, x, x_t, pos, heads, d, rope_dim, freqs, inverse);
}

cudaError_t launch_kv_qdq(void* x, Elt x_t, int64_t n, int64_t block, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  const int64_t nblocks = (n + block - 1) / block;
  return launch_kernel(kv_qdq_kernel, grid_for(nblocks, kWarps), kThreads, 0, s, x, x_t, n, block, nblocks);
}

}  // namespace dspark::cuda
