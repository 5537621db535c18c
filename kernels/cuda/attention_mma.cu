// Attention of one stage on the tensor cores (bf16 q and keys, d a multiple of 16 up to 512, k <= 8): one
// block per (head, request), all k queries together. Per block of 64 keys, staged in shared memory once:
//   scores:  S^T [16 keys x 8 queries] tiles by mma.sync m16n8k16 (keys as A, the queries as B, fp32
//            accumulation over d), a warp per 16-key tile;
//   softmax: as the CUDA-core kernel (attention_common.cuh), the bf16-rounded probabilities kept as bf16
//   bits,
//            which they are exactly;
//   values:  O^T [16 channels x 8 queries] += V^T P^T per 16 keys (V through ldmatrix.trans, P as B), each
//   warp
//            owning d / 128 channel tiles whose accumulators stay in registers, rescaled per key block.
// The products of the value sum are exact in fp32 (bf16 x bf16); only the order of their fp32 sum differs
// from the CPU's key order (and the scores' from its dot order), inside the attention tests' tolerance.
//
// Split (flash-decoding) when (head, request) blocks alone leave the GPU mostly idle: block (h, b, s) takes a
// contiguous run of the request's 64-key blocks (the same blocks as unsplit), publishes its partial (running
// max, denominator, fp32 accumulators) to scratch, and the last of the S blocks to finish merges the S
// partials in split order 0..S-1 and runs the epilogue. Only fp32 summation order changes (and the max each
// probability is rounded against, which the CPU also varies block to block); S = 1 is the unsplit kernel.
#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace dspark::cuda {
namespace {

using attn::kKeyBlock;
using attn::kMaxD;
using attn::kMaxQueries;
using attn::kRowPad;
using attn::kTilesPerWarp;
constexpr int kScoreWarps = kKeyBlock / kMmaRows;  // a warp per 16-key tile
constexpr int kPStride = kKeyBlock + kRowPad;
// Splits aim at about this many blocks: one per SM of an H100 / H200 (132). A constant rather than the GPU's
// SM count, so the summation order (and the bits) never depend on the GPU.
constexpr int64_t kSplitTargetBlocks = 128;
constexpr int kStatFloats = 2 * kMaxQueries;  // a partial's running max [8] and denominator [8]
static_assert(kMaxAttentionSplits * kMaxQueries <= 2 * kMaxQueries * kKeyBlock,
              "the merge's split weights live in the score and praw area");

struct MmaSmem {
  int d, k_all, W;
  __host__ __device__ int row() const { return d + kRowPad; }  // bf16 per key / query row
  __host__ __device__ size_t bf16s() const {
    return static_cast<size_t>(kKeyBlock + kMaxQueries) * row() + static_cast<size_t>(kMaxQueries) * kPStride;
  }
  // after the bf16 rows: score and praw [8, 64], run_max / denom / rescale [8] (floats), the key list (ints)
  __host__ __device__ size_t bytes() const {
    return bf16s() * sizeof(uint16_t) + (2 * kMaxQueries * kKeyBlock + 3 * kMaxQueries) * sizeof(float) +
           (static_cast<size_t>(W) + k_all + 1) * sizeof(int32_t);
  }
};

// Split epilogue of block (h, b, blockIdx.z): publish the block's partial (run_max, denom without the sink,
// the accumulators as out_rows [k, d]); the last of the (h, b)'s a.splits blocks to arrive merges them all
// in split order into out_rows and denom (the sink added) and returns true; the others return false.
// scratch: [heads B S, kStatFloats] statistics, then [heads B S, k, d] accumulators. One counter per (h, b);
// a backend keeps one counter array per stream, and a launch runs alone on its stream, so no other launch
// touches them meanwhile.
__device__ __forceinline__ bool merge_splits(const AttentionArgs& a, float* out_rows, const float* run_max,
                                             float* denom, float* weights, int k, int64_t h, int64_t b,
                                             int tid) {
  __shared__ bool last;
  const int d = static_cast<int>(a.d), S = static_cast<int>(a.splits), s = static_cast<int>(blockIdx.z);
  const int64_t pair = h * a.B + b;
  float* stats = a.split_partials + pair * S * kStatFloats;
  float* accs = a.split_partials + a.heads * a.B * S * kStatFloats + pair * S * k * d;
  const int n4 = k * d / 4;  // d % 16 == 0: a float4 never straddles two rows
  float4* mine = reinterpret_cast<float4*>(accs + static_cast<int64_t>(s) * k * d);
  for (int idx = tid; idx < n4; idx += kThreads)
    __stcg(mine + idx, reinterpret_cast<const float4*>(out_rows)[idx]);
  if (tid < k) {  // an empty split publishes max -inf, denominator 0 and zero accumulators
    __stcg(stats + s * kStatFloats + tid, run_max[tid]);
    __stcg(stats + s * kStatFloats + kMaxQueries + tid, denom[tid]);
  }
  __threadfence();  // this thread's partial is visible device-wide before the block is counted
  __syncthreads();
  if (tid == 0) {
    last = atomicAdd(a.split_counters + pair, 1u) == static_cast<uint32_t>(S - 1);
    if (last) {
      a.split_counters[pair] = 0;  // every block has counted: the next launch or graph replay starts at 0
      __threadfence();             // the others' partials, read below, after their count
    }
  }
  __syncthreads();
  if (!last) return false;

  if (tid < k) {  // the merged max, each split's weight exp(m_s - max), the denominator in split order
    float m = -INFINITY;
    for (int j = 0; j < S; ++j) m = std_max(m, __ldcg(stats + j * kStatFloats + tid));
    float sum = 0.0f;
    for (int j = 0; j < S; ++j) {
      const float mj = __ldcg(stats + j * kStatFloats + tid);
      const float w = mj == -INFINITY ? 0.0f : exp_f(mj - m);  // empty split: 0, never -inf - -inf
      weights[j * kMaxQueries + tid] = w;
      sum += __ldcg(stats + j * kStatFloats + kMaxQueries + tid) * w;
    }
    denom[tid] = sum + exp_f(a.sink[h] - m);
  }
  __syncthreads();
  for (int idx = tid; idx < n4; idx += kThreads) {
    const int i = idx * 4 / d;
    float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int j = 0; j < S; ++j) {
      const float4 v = __ldcg(reinterpret_cast<const float4*>(accs + static_cast<int64_t>(j) * k * d) + idx);
      const float w = weights[j * kMaxQueries + i];
      o.x += v.x * w;
      o.y += v.y * w;
      o.z += v.z * w;
      o.w += v.w * w;
    }
    reinterpret_cast<float4*>(out_rows)[idx] = o;
  }
  __syncthreads();
  return true;
}

// kSplit: block (h, b, s) of a.splits; otherwise one block per (h, b) (the code path before splits).
template <bool kSplit>
__global__ void __launch_bounds__(kThreads) attention_mma_kernel(AttentionArgs a) {
  wait_for_previous_kernels();
  extern __shared__ uint4 smem[];
  const int d = static_cast<int>(a.d), W = static_cast<int>(a.W), k = static_cast<int>(a.k);
  const MmaSmem layout{d, k, W};
  const int rs = layout.row();
  uint16_t* kbuf = reinterpret_cast<uint16_t*>(smem);  // [64, rs] the current key block (+ zero rows)
  uint16_t* qbuf = kbuf + kKeyBlock * rs;              // [8, rs] the queries, rows >= k zero
  uint16_t* pbuf = qbuf + kMaxQueries * rs;            // [8, kPStride] the block's bf16 probabilities
  float* score = reinterpret_cast<float*>(kbuf + layout.bf16s());     // [8, 64]
  float* praw = score + kMaxQueries * kKeyBlock;                      // [8, 64]
  float* run_max = praw + kMaxQueries * kKeyBlock;                    // [8]
  float* denom = run_max + kMaxQueries;                               // [8]
  float* rescale = denom + kMaxQueries;                               // [8]
  int32_t* keys = reinterpret_cast<int32_t*>(rescale + kMaxQueries);  // [W + k]
  int32_t* count = keys + W + k;

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, q = lane % 4;    // mma fragment coordinates
  const int mi = lane / 8, mr = lane % 8;  // ldmatrix: which matrix this lane addresses, and which row
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int32_t* req = a.requests + b * 4;
  const int64_t slot = req[0], low = req[1], P = req[2];

  if (warp == 0) attn::compact_keys(a, slot, low, P, keys, count, lane);
  attn::stage_query_rows(a, b, h, qbuf, rs, warp, lane);
  for (int idx = tid; idx < kMaxQueries * kPStride / 2; idx += kThreads)
    reinterpret_cast<uint32_t*>(pbuf)[idx] = 0;
  if (tid < kMaxQueries) {
    run_max[tid] = -INFINITY;
    denom[tid] = 0.0f;
  }
  float acc[kTilesPerWarp][4] = {};
  cp_async_wait_all();  // the queries
  __syncthreads();
  const int n = *count;
  // This block's keys [k_begin, k_end): split s takes ceil(blocks / S) whole key blocks from block s times
  // that (the last splits may get none), so the 64-key blocks are the unsplit kernel's.
  int k_begin = 0, k_end = n;
  if constexpr (kSplit) {
    const int S = static_cast<int>(a.splits), per = ((n + kKeyBlock - 1) / kKeyBlock + S - 1) / S * kKeyBlock;
    k_begin = static_cast<int>(blockIdx.z) * per;
    k_end = k_begin + per < n ? k_begin + per : n;
  }

  for (int k0 = k_begin; k0 < k_end; k0 += kKeyBlock) {
    const int nb = k_end - k0 < kKeyBlock ? k_end - k0 : kKeyBlock;
    const int steps = (nb + kMmaRows - 1) / kMmaRows;  // 16-key steps of the value product
    // rows [0, nb) of the block and zero rows [nb, 16 steps), every copy in flight at once
    attn::stage_key_rows(a, slot, b, keys + k0, nb, steps * kMmaRows, kbuf, rs, warp, lane);
    cp_async_wait_all();
    __syncthreads();

    if (warp < kScoreWarps && warp * kMmaRows < nb) {  // scores of keys [16 warp, 16 warp + 16)
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const uint16_t* arow = kbuf + (warp * kMmaRows + mr + 8 * (mi % 2)) * rs + 8 * (mi / 2);
      const uint16_t* brow = qbuf + mr * rs + 8 * (mi % 2);
      for (int kk = 0; kk < d; kk += 16) {
        uint32_t af[4], bf[2];
        ldmatrix_x4(af, arow + kk);
        ldmatrix_x2(bf, brow + kk);
        mma_bf16_16x8x16(c, af[0], af[1], af[2], af[3], bf[0], bf[1]);
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // c[e] = S(key 16 warp + g (+ 8), query 2q (+ 1))
        const int key = warp * kMmaRows + g + (e >= 2 ? 8 : 0), query = 2 * q + (e & 1);
        if (query < k && key < nb) score[query * kKeyBlock + key] = c[e] * a.scale;
      }
    }
    __syncthreads();

    for (int i = warp; i < k; i += kWarps)
      attn::softmax_step(score + i * kKeyBlock, nb, praw + i * kKeyBlock, nullptr, pbuf + i * kPStride,
                         run_max[i], denom[i], rescale[i], lane);
    __syncthreads();

    // values: rescale each query's accumulators, then add this block's keys 16 at a time
    attn::mma_value_step(acc, 2 * q < k ? rescale[2 * q] : 0.0f, 2 * q + 1 < k ? rescale[2 * q + 1] : 0.0f,
                         kbuf, rs, pbuf, kPStride, 0, steps, d, warp, lane);
    __syncthreads();  // before the next block's staging overwrites kbuf and pbuf
  }

  // Epilogue: the sink term into each denominator (split: after the merge); the accumulators (acc[t][e] =
  // O(query 2q (+ 1), channel ch0 + g (+ 8))) to fp32 rows over the key area, then the shared epilogue.
  if constexpr (!kSplit) {
    if (tid < k) denom[tid] += exp_f(a.sink[h] - run_max[tid]);
  }
  float* out_rows = reinterpret_cast<float*>(smem);  // [k, d]: 4 d floats fit in the 64 key rows
  attn::mma_store_rows(acc, out_rows, k, d, warp, lane);
  __syncthreads();
  if constexpr (kSplit) {
    if (!merge_splits(a, out_rows, run_max, denom, score, k, h, b, tid)) return;
  }
  attn::store_outputs(a, out_rows, denom, k, 0, b, h, tid);
}

int forced_splits = 0;  // set_attention_splits_for_testing

}  // namespace

bool attention_mma_fits(const AttentionArgs& a) {
  return a.q_t == Elt::bf16 && a.ring_kv_t == Elt::bf16 && a.block_kv_t == Elt::bf16 && a.d % kMmaRows == 0 &&
         a.d <= kMaxD && a.k <= kMaxQueries && aligned16(a.q) && aligned16(a.ring_kv) &&
         aligned16(a.block_kv);
}

int64_t attention_splits(const AttentionArgs& a) {
  const int64_t pairs = a.heads * a.B;
  if (pairs <= 0 || pairs > kAttentionSplitPairs || !attention_mma_fits(a)) return 1;
  if (forced_splits > 0) return forced_splits;
  if (pairs >= kSplitTargetBlocks || attention_whole_fits(a)) return 1;  // the latter: launch_attention_whole
  // No more splits than key blocks a request can have (n <= W + k); enough for about kSplitTargetBlocks.
  const int64_t blocks = (a.W + a.k + kKeyBlock - 1) / kKeyBlock;
  const int64_t want = (kSplitTargetBlocks + pairs - 1) / pairs;
  const int64_t splits = blocks < want ? blocks : want;
  return splits < kMaxAttentionSplits ? splits : kMaxAttentionSplits;
}

size_t attention_split_scratch_bytes(const AttentionArgs& a, int64_t splits) {
  return static_cast<size_t>(a.heads * a.B * splits * (kStatFloats + a.k * a.d)) * sizeof(float);
}

void set_attention_splits_for_testing(int splits) {
  forced_splits =
      splits <= 0 ? 0 : static_cast<int>(splits < kMaxAttentionSplits ? splits : kMaxAttentionSplits);
}

cudaError_t launch_attention_mma(const AttentionArgs& a, cudaStream_t s) {
  const bool split = a.splits > 1;
  // A small grid whose keys fit in shared memory at once: one block per (head, request), no partials.
  if (!split && forced_splits == 0 && a.heads * a.B < kSplitTargetBlocks && attention_whole_fits(a))
    return launch_attention_whole(a, s);
  if (split && (a.splits > kMaxAttentionSplits || a.heads * a.B > kAttentionSplitPairs || !a.split_partials ||
                !a.split_counters))
    return cudaErrorInvalidValue;
  const auto kernel = split ? attention_mma_kernel<true> : attention_mma_kernel<false>;
  const size_t smem = MmaSmem{static_cast<int>(a.d), static_cast<int>(a.k), static_cast<int>(a.W)}.bytes();
  if (smem > 48 * 1024) {
    const cudaError_t err =
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.B),
                  static_cast<unsigned>(split ? a.splits : 1));
  return launch_kernel(kernel, grid, kThreads, smem, s, a);
}

}  // namespace dspark::cuda
