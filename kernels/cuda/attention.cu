// Attention of one stage: one block per (head, request, group of queries); the host picks the groups so the
// grid fills the GPU (all k queries of a request in one block when there are enough (head, request) pairs,
// each key row then read once per head). The keys of a request are its slot's live ring entries in ring-index
// order, then its k block rows (K = V). Keys are taken in blocks of 64 exactly as kernels/cpu/attention.cpp
// does: each block is staged in shared memory by the whole thread block (every load in flight at once), then
//   scores: a warp per key, its lanes over the key's 8-element chunks, all queries at once (fp32, fmaf);
//   softmax: a warp per query, the block max (order-free), the probabilities in parallel, the denominator
//            added by one lane in key order from the unrounded probabilities, as the CPU does;
//   values:  a thread per channel pair, every query's accumulator rescaled then added in key order with the
//            bf16-rounded probabilities (two roundings per add, as the CPU).
// The sink enters the denominator only. Optionally the epilogue applies rope's inverse rotation to the stored
// outputs (the same bits as launch_rope(inverse) afterwards).
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/norm_rope.hpp"

namespace dspark::cuda {
namespace {

using attn::key_row;
using attn::kKeyBlock;

// The shared-memory layout of one block; sizes in elements.
struct AttnSmem {
  int d, k, k_all, W;  // k: queries of one block (the group size); k_all: block rows of a request
  bool vec;            // keys staged as bf16 (vector path) or fp32
  __host__ __device__ size_t key_bytes() const {
    return static_cast<size_t>(kKeyBlock) * d * (vec ? sizeof(uint16_t) : sizeof(float));
  }
  // floats after the keys: q [k, d], acc [k, d], score / praw / p16 [k, 64], m / denom / rescale [k]
  __host__ __device__ size_t floats() const {
    return 2 * static_cast<size_t>(k) * d + 3 * static_cast<size_t>(k) * kKeyBlock +
           3 * static_cast<size_t>(k);
  }
  __host__ __device__ size_t bytes() const {
    return key_bytes() + floats() * sizeof(float) + (static_cast<size_t>(W) + k_all + 1) * sizeof(int32_t);
  }
};

// kVec: ring and block rows bf16, d % 8 == 0, 16-byte aligned: staged as bf16 with 16-byte copies.
// Otherwise staged as fp32 element by element. NQ: queries whose partial sums a thread keeps in registers at
// a time (the group size rounded up to a power of two, so one query per block runs no dead slots).
template <bool kVec, int NQ>
__global__ void __launch_bounds__(kThreads) attention_kernel(AttentionArgs a) {
  wait_for_previous_kernels();
  using KeyT = std::conditional_t<kVec, uint16_t, float>;
  extern __shared__ uint4 smem[];
  const int d = static_cast<int>(a.d), W = static_cast<int>(a.W), group = static_cast<int>(a.query_group);
  const int q_first = static_cast<int>(blockIdx.z) * group;  // this block's queries: [q_first, q_first + k)
  const int k = static_cast<int>(a.k) - q_first < group ? static_cast<int>(a.k) - q_first : group;
  const AttnSmem layout{d, group, static_cast<int>(a.k), W, kVec};
  KeyT* kbuf = reinterpret_cast<KeyT*>(smem);  // [64, d] the current key block
  float* qv = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + layout.key_bytes());  // [group, d]
  float* acc = qv + group * d;                                                               // [group, d]
  float* score = acc + group * d;                                                            // [group, 64]
  float* praw = score + group * kKeyBlock;                      // [group, 64] probabilities, unrounded
  float* p16 = praw + group * kKeyBlock;                        // [group, 64] probabilities, bf16-rounded
  float* run_max = p16 + group * kKeyBlock;                     // [group]
  float* denom = run_max + group;                               // [group]
  float* rescale = denom + group;                               // [group] this key block's rescale
  int32_t* keys = reinterpret_cast<int32_t*>(rescale + group);  // [W + k_all] ring entry, or W + block row
  int32_t* count = keys + W + a.k;

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int32_t* req = a.requests + b * 4;
  const int64_t slot = req[0], low = req[1], P = req[2];

  if (warp == 0) attn::compact_keys(a, slot, low, P, keys, count, lane);
  for (int idx = tid; idx < k * d; idx += kThreads) {
    const int i = idx / d, c = idx - i * d;
    qv[idx] = ld(a.q, a.q_t, ((b * a.k + q_first + i) * a.heads + h) * d + c);
    acc[idx] = 0.0f;
  }
  for (int i = tid; i < k; i += kThreads) {
    run_max[i] = -INFINITY;
    denom[i] = 0.0f;
  }
  __syncthreads();
  const int n = *count;

  for (int k0 = 0; k0 < n; k0 += kKeyBlock) {
    const int nb = n - k0 < kKeyBlock ? n - k0 : kKeyBlock;
    {  // stage the block: 8 loads issued before their stores, so they are in flight together
      constexpr int kBatch = 8;
      const int chunks = kVec ? d / 8 : d, total = nb * chunks;
      for (int q0 = tid; q0 < total; q0 += kBatch * kThreads) {
        std::conditional_t<kVec, uint4, float> v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int q = q0 + u * kThreads;
          if (q < total) {
            const int row = q / chunks, col = q - row * chunks;
            Elt t;
            const void* p = key_row(a, slot, b, keys[k0 + row], t);
            if constexpr (kVec)
              v[u] = __ldg(static_cast<const uint4*>(p) + col);
            else
              v[u] = ld(p, t, col);
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u)
          if (q0 + u * kThreads < total) {
            if constexpr (kVec)
              smem[q0 + u * kThreads] = v[u];
            else
              kbuf[q0 + u * kThreads] = v[u];
          }
      }
    }
    __syncthreads();

    // Scores: a warp per key, every query (in chunks of NQ) against it.
    for (int key = warp; key < nb; key += kWarps) {
      const KeyT* kr = kbuf + key * d;
      for (int i0 = 0; i0 < k; i0 += NQ) {
        float part[NQ];
#pragma unroll
        for (int u = 0; u < NQ; ++u) part[u] = 0.0f;
        if constexpr (kVec) {
          for (int c = lane; c < d / 8; c += 32) {
            float kv[8];
            unpack_bf16x8(reinterpret_cast<const uint4*>(kr)[c], kv);
#pragma unroll
            for (int u = 0; u < NQ; ++u) {
              if (i0 + u >= k) break;
              const float4* qr = reinterpret_cast<const float4*>(qv + (i0 + u) * d) + 2 * c;
              const float4 q0 = qr[0], q1 = qr[1];
              const float qa[8] = {q0.x, q0.y, q0.z, q0.w, q1.x, q1.y, q1.z, q1.w};
#pragma unroll
              for (int e = 0; e < 8; ++e) part[u] = fmaf(qa[e], kv[e], part[u]);
            }
          }
        } else {
          for (int c = lane; c < d; c += 32)
#pragma unroll
            for (int u = 0; u < NQ; ++u) {
              if (i0 + u >= k) break;
              part[u] = fmaf(qv[(i0 + u) * d + c], kr[c], part[u]);
            }
        }
#pragma unroll
        for (int u = 0; u < NQ; ++u) {
          if (i0 + u >= k) break;
          const float s = warp_sum(part[u]) * a.scale;
          if (lane == 0) score[(i0 + u) * kKeyBlock + key] = s;
        }
      }
    }
    __syncthreads();

    // Softmax step: a warp per query.
    for (int i = warp; i < k; i += kWarps)
      attn::softmax_step(score + i * kKeyBlock, nb, praw + i * kKeyBlock, p16 + i * kKeyBlock, nullptr,
                         run_max[i], denom[i], rescale[i], lane);
    __syncthreads();

    // Values: a thread per channel pair, each query's accumulator rescaled, then the keys in order.
    for (int c = 2 * tid; c < d; c += 2 * kThreads) {
      const bool pair = c + 1 < d;
      for (int i0 = 0; i0 < k; i0 += NQ) {
        float v0[NQ], v1[NQ];
#pragma unroll
        for (int u = 0; u < NQ; ++u) {
          if (i0 + u >= k) break;
          v0[u] = acc[(i0 + u) * d + c] * rescale[i0 + u];
          v1[u] = pair ? acc[(i0 + u) * d + c + 1] * rescale[i0 + u] : 0.0f;
        }
#pragma unroll 4
        for (int key = 0; key < nb; ++key) {
          float x0, x1;
          if constexpr (kVec) {  // d even here
            const uint32_t kv = reinterpret_cast<const uint32_t*>(kbuf + key * d)[c / 2];
            x0 = __uint_as_float(kv << 16);
            x1 = __uint_as_float(kv & 0xffff0000u);
          } else {
            x0 = kbuf[key * d + c];
            x1 = pair ? kbuf[key * d + c + 1] : 0.0f;
          }
#pragma unroll
          for (int u = 0; u < NQ; ++u) {
            if (i0 + u >= k) break;
            const float p = p16[(i0 + u) * kKeyBlock + key];
            v0[u] += p * x0;
            v1[u] += p * x1;
          }
        }
#pragma unroll
        for (int u = 0; u < NQ; ++u) {
          if (i0 + u >= k) break;
          acc[(i0 + u) * d + c] = v0[u];
          if (pair) acc[(i0 + u) * d + c + 1] = v1[u];
        }
      }
    }
    __syncthreads();
  }

  // Epilogue: the sink term into each denominator, then the outputs.
  if (tid < k) denom[tid] += exp_f(a.sink[h] - run_max[tid]);
  __syncthreads();
  attn::store_outputs(a, acc, denom, k, q_first, b, h, tid);
}

bool vector_path(const AttentionArgs& a) {
  return a.ring_kv_t == Elt::bf16 && a.block_kv_t == Elt::bf16 && a.d % 8 == 0 && aligned16(a.ring_kv) &&
         aligned16(a.block_kv);
}

}  // namespace

size_t attention_smem_bytes(int64_t d, int64_t W, int64_t k) {
  // The larger (fp32-staged) layout: the host checks a shape once, whatever path its dtypes take.
  return AttnSmem{static_cast<int>(d), static_cast<int>(k), static_cast<int>(k), static_cast<int>(W), false}
      .bytes();
}

cudaError_t launch_attention(const AttentionArgs& args, cudaStream_t s) {
  if (args.B <= 0 || args.heads <= 0) return cudaSuccess;
  if (attention_mma_fits(args)) return launch_attention_mma(args, s);
  AttentionArgs a = args;
  // Queries per block: all k while (head, request) blocks alone give two per SM; fewer (down to one) for
  // small batches, where a block's serial key walk would otherwise set the time.
  static const int sms = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
      return 0;
    return n;
  }();
  const int64_t pairs = a.heads * a.B, want = 2 * static_cast<int64_t>(sms);
  const int64_t splits = pairs >= want ? 1 : std::min<int64_t>(a.k, (want + pairs - 1) / pairs);
  a.query_group = (a.k + splits - 1) / splits;
  const bool vec = vector_path(a);
  const size_t smem = AttnSmem{static_cast<int>(a.d), static_cast<int>(a.query_group), static_cast<int>(a.k),
                               static_cast<int>(a.W), vec}
                          .bytes();
  const int64_t g = a.query_group;
  const auto pick = [&](auto vec_tag) {
    constexpr bool V = decltype(vec_tag)::value;
    return g <= 1   ? attention_kernel<V, 1>
           : g <= 2 ? attention_kernel<V, 2>
           : g <= 4 ? attention_kernel<V, 4>
                    : attention_kernel<V, 8>;
  };
  const auto kernel = vec ? pick(std::true_type{}) : pick(std::false_type{});
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.B),
                  static_cast<unsigned>((a.k + a.query_group - 1) / a.query_group));
  return launch_kernel(kernel, grid, kThreads, smem, s, a);
}

}  // namespace dspark::cuda
