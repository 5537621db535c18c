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
#include "kernels/cuda/attention_common.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace dspark::cuda {
namespace {

using attn::kKeyBlock;
constexpr int kMaxQueries = kMmaCols;                     // the mma's N: queries of a block
constexpr int kMaxD = 512;                                // channel tiles per warp below
constexpr int kTilesPerWarp = kMaxD / kMmaRows / kWarps;  // 4 at d 512
constexpr int kScoreWarps = kKeyBlock / kMmaRows;         // a warp per 16-key tile
constexpr int kRowPad = 8;  // bf16 per shared row: an ldmatrix's 8 rows then start in distinct bank groups
constexpr int kPStride = kKeyBlock + kRowPad;

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

__global__ void __launch_bounds__(kThreads) attention_mma_kernel(AttentionArgs a) {
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
  const int chunks = d / 8;  // 16-byte chunks per row
  for (int idx = tid; idx < kMaxQueries * chunks; idx += kThreads) {
    const int i = idx / chunks, c = idx - i * chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (i < k) v = __ldg(static_cast<const uint4*>(a.q) + (((b * k + i) * a.heads + h) * d) / 8 + c);
    *reinterpret_cast<uint4*>(qbuf + i * rs + 8 * c) = v;
  }
  for (int idx = tid; idx < kMaxQueries * kPStride / 2; idx += kThreads)
    reinterpret_cast<uint32_t*>(pbuf)[idx] = 0;
  if (tid < kMaxQueries) {
    run_max[tid] = -INFINITY;
    denom[tid] = 0.0f;
  }
  float acc[kTilesPerWarp][4] = {};
  __syncthreads();
  const int n = *count;

  for (int k0 = 0; k0 < n; k0 += kKeyBlock) {
    const int nb = n - k0 < kKeyBlock ? n - k0 : kKeyBlock;
    const int steps = (nb + kMmaRows - 1) / kMmaRows;  // 16-key steps of the value product
    {  // stage rows [0, nb) of the block and zero rows [nb, 16 steps): 8 loads in flight per thread
      constexpr int kBatch = 8;
      const int total = steps * kMmaRows * chunks;
      for (int c0 = tid; c0 < total; c0 += kBatch * kThreads) {
        uint4 v[kBatch];
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int c = c0 + u * kThreads, row = c / chunks;
          v[u] = make_uint4(0, 0, 0, 0);
          if (c < total && row < nb) {
            Elt t;
            v[u] = __ldg(static_cast<const uint4*>(attn::key_row(a, slot, b, keys[k0 + row], t)) +
                         (c - row * chunks));
          }
        }
#pragma unroll
        for (int u = 0; u < kBatch; ++u) {
          const int c = c0 + u * kThreads, row = c / chunks;
          if (c < total) *reinterpret_cast<uint4*>(kbuf + row * rs + 8 * (c - row * chunks)) = v[u];
        }
      }
    }
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

    {  // values: rescale each query's accumulators, then add this block's keys 16 at a time
      const float r0 = 2 * q < k ? rescale[2 * q] : 0.0f, r1 = 2 * q + 1 < k ? rescale[2 * q + 1] : 0.0f;
#pragma unroll
      for (int t = 0; t < kTilesPerWarp; ++t) {
        acc[t][0] *= r0;
        acc[t][1] *= r1;
        acc[t][2] *= r0;
        acc[t][3] *= r1;
      }
      for (int s = 0; s < steps; ++s) {
        uint32_t bf[2];
        ldmatrix_x2(bf, pbuf + mr * kPStride + s * kMmaRows + 8 * (mi % 2));
#pragma unroll
        for (int t = 0; t < kTilesPerWarp; ++t) {
          const int ch0 = (warp + t * kWarps) * kMmaRows;
          if (ch0 >= d) break;
          uint32_t af[4];
          ldmatrix_x4_trans(af, kbuf + (s * kMmaRows + mr + 8 * (mi / 2)) * rs + ch0 + 8 * (mi % 2));
          mma_bf16_16x8x16(acc[t], af[0], af[1], af[2], af[3], bf[0], bf[1]);
        }
      }
    }
    __syncthreads();  // before the next block's staging overwrites kbuf and pbuf
  }

  // Epilogue: the sink term into each denominator; the accumulators (acc[t][e] = O(query 2q (+ 1), channel
  // ch0 + g (+ 8))) to fp32 rows over the key area, then the shared epilogue.
  if (tid < k) denom[tid] += exp_f(a.sink[h] - run_max[tid]);
  float* out_rows = reinterpret_cast<float*>(smem);  // [k, d]: 4 d floats fit in the 64 key rows
#pragma unroll
  for (int t = 0; t < kTilesPerWarp; ++t) {
    const int ch0 = (warp + t * kWarps) * kMmaRows;
    if (ch0 >= d) break;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int ch = ch0 + g + (e >= 2 ? 8 : 0), query = 2 * q + (e & 1);
      if (query < k) out_rows[query * d + ch] = acc[t][e];
    }
  }
  __syncthreads();
  attn::store_outputs(a, out_rows, denom, k, 0, b, h, tid);
}

}  // namespace

bool attention_mma_fits(const AttentionArgs& a) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.q_t == Elt::bf16 && a.ring_kv_t == Elt::bf16 && a.block_kv_t == Elt::bf16 && a.d % kMmaRows == 0 &&
         a.d <= kMaxD && a.k <= kMaxQueries && aligned(a.q) && aligned(a.ring_kv) && aligned(a.block_kv);
}

cudaError_t launch_attention_mma(const AttentionArgs& a, cudaStream_t s) {
  const size_t smem = MmaSmem{static_cast<int>(a.d), static_cast<int>(a.k), static_cast<int>(a.W)}.bytes();
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        attention_mma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  return launch_kernel(attention_mma_kernel, dim3(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.B)),
                       kThreads, smem, s, a);
}

}  // namespace dspark::cuda
