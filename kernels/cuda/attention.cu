// Attention of one stage: one block per (head, request). The keys of a request are its slot's live ring
// entries in ring-index order, then its k block rows (K = V). Each of the k queries walks the keys in blocks
// of 64 exactly as kernels/cpu/attention.cpp: fp32 scores (one warp per score), an online max per block, the
// probabilities computed in parallel and the denominator summed serially in key order from them (unrounded),
// bf16-rounded probabilities in the value sum (each thread owns channels and adds keys in order), the sink in
// the denominator only.
#include <cmath>

#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {
namespace {

constexpr int64_t kKeyBlock = 64;

struct KeyRef {
  const void* p;
  Elt t;
};

__device__ __forceinline__ KeyRef key_ref(const AttentionArgs& a, int64_t slot, int64_t b, int32_t idx) {
  if (idx < a.W)
    return {static_cast<const char*>(a.ring_kv) + (slot * a.W + idx) * a.d * elt_size(a.ring_kv_t),
            a.ring_kv_t};
  return {static_cast<const char*>(a.block_kv) + (b * a.k + (idx - a.W)) * a.d * elt_size(a.block_kv_t),
          a.block_kv_t};
}

// q (fp32, shared memory) . key row (bf16, 16-byte aligned), d % 8 == 0: lane l takes the 8-element chunks
// l, l + 32, ... in index order (fmaf), then a butterfly.
__device__ __forceinline__ float warp_dot_q_bf16(const float* q, const void* key, int64_t d, int lane) {
  float acc = 0.0f;
  for (int64_t c = lane; c < d / 8; c += 32) {
    const uint4 kq = static_cast<const uint4*>(key)[c];
    const float4 q0 = reinterpret_cast<const float4*>(q)[2 * c],
                 q1 = reinterpret_cast<const float4*>(q)[2 * c + 1];
    const float qa[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
    const uint32_t kw[4] = {kq.x, kq.y, kq.z, kq.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      acc = fmaf(qa[2 * k], __uint_as_float(kw[k] << 16), acc);
      acc = fmaf(qa[2 * k + 1], __uint_as_float(kw[k] & 0xffff0000u), acc);
    }
  }
  return warp_sum(acc);
}

// kVec: ring and block rows bf16, d % 8 == 0 (16-byte rows): each key block is first staged in shared memory
// by the whole block (every load in flight at once, instead of a chain of dependent L2 round trips per warp),
// then the scores read 128-bit chunks of it and each thread adds adjacent channel pairs in the value sum.
template <bool kVec>
__global__ void __launch_bounds__(kThreads, 3) attention_kernel(AttentionArgs a) {
  extern __shared__ uint4 smem[];
  const int64_t d = a.d;
  uint16_t* kbuf = reinterpret_cast<uint16_t*>(smem);  // [64, d] bf16: the current key block (kVec)
  float* sm = reinterpret_cast<float*>(kbuf + (kVec ? kKeyBlock * d : 0));
  float* qv = sm;                                        // [d] the query, fp32
  float* acc = qv + d;                                   // [d] the value accumulator
  float* score = acc + d;                                // [64] scores of the current key block
  float* p16 = score + kKeyBlock;                        // [64] bf16-rounded probabilities
  float* praw = p16 + kKeyBlock;                         // [64] the probabilities, unrounded
  float* scal = praw + kKeyBlock;                        // [0] rescale, [1] denominator, [2] block max
  int32_t* keys = reinterpret_cast<int32_t*>(scal + 4);  // [W + k] key list: ring entry, or W + block row
  int32_t* count = keys + a.W + a.k;

  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int32_t* req = a.requests + b * 4;
  const int64_t slot = req[0], low = req[1], P = req[2];

  if (warp == 0) {  // ordered compaction of the live ring entries
    int32_t cnt = 0;
    if (slot >= 0 && slot < a.slots) {
      for (int64_t e0 = 0; e0 < a.W; e0 += 32) {
        const int64_t e = e0 + lane;
        bool live = false;
        if (e < a.W) {
          const int64_t pp = a.ring_pos[slot * a.W + e];
          live = pp >= 0 && pp >= low && pp <= P - 1;
        }
        const unsigned mask = __ballot_sync(0xffffffffu, live);
        if (live) keys[cnt + __popc(mask & ((1u << lane) - 1u))] = static_cast<int32_t>(e);
        cnt += __popc(mask);
      }
    }
    for (int64_t j = lane; j < a.k; j += 32) keys[cnt + j] = static_cast<int32_t>(a.W + j);
    if (lane == 0) *count = cnt + static_cast<int32_t>(a.k);
  }
  __syncthreads();
  const int64_t n = *count;

  {  // one query (block row i) per block: the k queries of a request run in parallel
    const int64_t i = blockIdx.z;
    const int64_t t = b * a.k + i;
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
      qv[c] = ld(a.q, a.q_t, (t * a.heads + h) * d + c);
      acc[c] = 0.0f;
    }
    float m = -INFINITY, denom = 0.0f;  // thread 0's running max and denominator
    __syncthreads();
    for (int64_t k0 = 0; k0 < n; k0 += kKeyBlock) {
      const int64_t k1 = n < k0 + kKeyBlock ? n : k0 + kKeyBlock;
      if constexpr (kVec) {
        // 8 loads issued before their stores, so they are in flight together.
        constexpr int kBatch = 8;
        const int64_t chunks = d / 8, total = (k1 - k0) * chunks;  // 16-byte chunks per key row, in the block
        for (int64_t q0 = threadIdx.x; q0 < total; q0 += kBatch * kThreads) {
          uint4 v[kBatch];
#pragma unroll
          for (int u = 0; u < kBatch; ++u) {
            const int64_t q = q0 + u * kThreads;
            if (q < total)
              v[u] =
                  __ldg(static_cast<const uint4*>(key_ref(a, slot, b, keys[k0 + q / chunks]).p) + q % chunks);
          }
#pragma unroll
          for (int u = 0; u < kBatch; ++u)
            if (q0 + u * kThreads < total) smem[q0 + u * kThreads] = v[u];
        }
        __syncthreads();
      }
      for (int64_t key = k0 + warp; key < k1; key += kWarps) {
        float s;
        if constexpr (kVec) {
          s = warp_dot_q_bf16(qv, kbuf + (key - k0) * d, d, lane) * a.scale;
        } else {
          const KeyRef kr = key_ref(a, slot, b, keys[key]);
          s = warp_dot(qv, Elt::f32, kr.p, kr.t, d, lane) * a.scale;
        }
        if (lane == 0) score[key - k0] = s;
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        float block_max = m;
        for (int64_t key = k0; key < k1; ++key) block_max = std_max(block_max, score[key - k0]);
        scal[0] = exp_f(m - block_max);  // the rescale: 0 on the first block (m = -inf)
        scal[2] = block_max;
      }
      __syncthreads();
      // The exps in parallel (the slow part); thread 0 then adds them in key order, as the CPU does.
      for (int64_t key = k0 + threadIdx.x; key < k1; key += kThreads) {
        const float p = exp_f(score[key - k0] - scal[2]);
        praw[key - k0] = p;
        p16[key - k0] = round_bf16(p);
      }
      __syncthreads();
      if (threadIdx.x == 0) {
        denom *= scal[0];
        for (int64_t key = k0; key < k1; ++key) denom += praw[key - k0];
        m = scal[2];
      }
      const float rescale = scal[0];
      if constexpr (kVec) {
        for (int64_t c = 2 * threadIdx.x; c < d; c += 2 * kThreads) {
          float v0 = acc[c] * rescale, v1 = acc[c + 1] * rescale;
          for (int64_t key = k0; key < k1; ++key) {
            const uint32_t kv = reinterpret_cast<const uint32_t*>(kbuf + (key - k0) * d)[c / 2];
            v0 += p16[key - k0] * __uint_as_float(kv << 16);
            v1 += p16[key - k0] * __uint_as_float(kv & 0xffff0000u);
          }
          acc[c] = v0;
          acc[c + 1] = v1;
        }
      } else {
        for (int64_t c = threadIdx.x; c < d; c += kThreads) {
          float v = acc[c] * rescale;
          for (int64_t key = k0; key < k1; ++key) {
            const KeyRef kr = key_ref(a, slot, b, keys[key]);
            v += p16[key - k0] * ld(kr.p, kr.t, c);
          }
          acc[c] = v;
        }
      }
      __syncthreads();
    }
    if (threadIdx.x == 0) scal[1] = denom + exp_f(a.sink[h] - m);
    __syncthreads();
    const float total = scal[1];
    const int64_t o = (t * a.heads + h) * d, first = a.rope_pos ? d - a.rope_dim : d;
    for (int64_t c = threadIdx.x; c < first; c += kThreads) st(a.out, a.out_t, o + c, acc[c] / total);
    if (a.rope_pos) {  // rope_kernel's inverse rotation of the stored values, pair by pair
      const float p = static_cast<float>(a.rope_pos[t]);
      for (int64_t j = threadIdx.x; j < a.rope_dim / 2; j += kThreads) {
        const int64_t c = first + 2 * j;
        const float angle = p * a.freqs.f[j];
        const float cs = cos_f(angle), sn = -sin_f(angle);
        const float x0 = as_stored(a.out_t, acc[c] / total), x1 = as_stored(a.out_t, acc[c + 1] / total);
        st(a.out, a.out_t, o + c, x0 * cs - x1 * sn);
        st(a.out, a.out_t, o + c + 1, x0 * sn + x1 * cs);
      }
    }
    __syncthreads();
  }
}

}  // namespace

size_t attention_smem_bytes(int64_t d, int64_t W, int64_t k) {
  return static_cast<size_t>(kKeyBlock * d) * sizeof(uint16_t) +
         static_cast<size_t>(2 * d + 3 * kKeyBlock + 4) * sizeof(float) +
         static_cast<size_t>(W + k + 1) * sizeof(int32_t);
}

cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s) {
  if (a.B <= 0 || a.heads <= 0) return cudaSuccess;
  const size_t smem = attention_smem_bytes(a.d, a.W, a.k);
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = a.ring_kv_t == Elt::bf16 && a.block_kv_t == Elt::bf16 && a.d % 8 == 0 &&
                   aligned(a.ring_kv) && aligned(a.block_kv);
  const auto kernel = vec ? attention_kernel<true> : attention_kernel<false>;
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.B), static_cast<unsigned>(a.k));
  return launch_kernel(kernel, grid, kThreads, smem, s, a);
}

}  // namespace dspark::cuda
