// Attention of one stage on the tensor cores with every key of a request in shared memory at once, for small
// grids (fewer than 128 (head, request) blocks) whose keys fit: one block per (head, request), and instead of
// the unsplit kernel's walk (stage, scores, softmax, values per block of 64 keys, a global round trip each)
// or the split kernel's partials and merge, each phase once over all the keys:
//   staging: every key row (and the queries) copied in one batch of cp.async, all in flight together;
//   scores:  S^T tiles of 16 keys x 8 queries by mma.sync, a warp per tile (two independent chains when
//            there are more tiles than warps);
//   softmax: per query, the 64-key blocks in order, exactly the unsplit kernel's steps (attention_common);
//   values:  per 64-key block, the accumulators rescaled, then its keys 16 at a time.
// The same products, sums and roundings in the same order as the unsplit kernel: the same bits.
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
constexpr int kWholeMaxKeys = 3 * kKeyBlock;  // W + k up to 192 (V4.1: 133)

struct WholeSmem {
  int d, k_all, W;
  __host__ __device__ int row() const { return d + kRowPad; }                      // bf16 per key / query row
  __host__ __device__ int key_rows() const { return (W + k_all + 15) / 16 * 16; }  // whole 16-key steps
  __host__ __device__ int blocks() const { return (W + k_all + kKeyBlock - 1) / kKeyBlock; }
  __host__ __device__ int ks() const { return blocks() * kKeyBlock; }  // score / praw row length
  __host__ __device__ int pstride() const { return ks() + kRowPad; }   // bf16 probabilities' row
  __host__ __device__ size_t bf16s() const {
    return static_cast<size_t>(key_rows() + kMaxQueries) * row() +
           static_cast<size_t>(kMaxQueries) * pstride();
  }
  // after the bf16 rows: score and praw [8, ks], run_max / denom [8], rescale [8, blocks] (floats), key list
  __host__ __device__ size_t bytes() const {
    return bf16s() * sizeof(uint16_t) +
           (2 * static_cast<size_t>(kMaxQueries) * ks() + 2 * kMaxQueries + kMaxQueries * blocks()) *
               sizeof(float) +
           (static_cast<size_t>(W) + k_all + 1) * sizeof(int32_t);
  }
};

__global__ void __launch_bounds__(kThreads) attention_whole_kernel(AttentionArgs a) {
  wait_for_previous_kernels();
  extern __shared__ uint4 smem[];
  const int d = static_cast<int>(a.d), W = static_cast<int>(a.W), k = static_cast<int>(a.k);
  const WholeSmem L{d, k, W};
  const int rs = L.row(), ks = L.ks(), ps = L.pstride(), nblk = L.blocks();
  uint16_t* kbuf = reinterpret_cast<uint16_t*>(smem);         // [key_rows, rs] every key (+ zero rows)
  uint16_t* qbuf = kbuf + L.key_rows() * rs;                  // [8, rs] the queries, rows >= k zero
  uint16_t* pbuf = qbuf + kMaxQueries * rs;                   // [8, ps] bf16 probabilities of every key
  float* score = reinterpret_cast<float*>(kbuf + L.bf16s());  // [8, ks]
  float* praw = score + kMaxQueries * ks;                     // [8, ks]
  float* run_max = praw + kMaxQueries * ks;                   // [8]
  float* denom = run_max + kMaxQueries;                       // [8]
  float* rescale = denom + kMaxQueries;                       // [8, nblk]
  int32_t* keys = reinterpret_cast<int32_t*>(rescale + kMaxQueries * nblk);  // [W + k]
  int32_t* count = keys + W + k;

  const int tid = static_cast<int>(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, q = lane % 4, mi = lane / 8, mr = lane % 8;
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int32_t* req = a.requests + b * 4;
  const int64_t slot = req[0], low = req[1], P = req[2];

  if (warp == 0) attn::compact_keys(a, slot, low, P, keys, count, lane);
  attn::stage_query_rows(a, b, h, qbuf, rs, warp, lane);
  for (int idx = tid; idx < kMaxQueries * ps / 2; idx += kThreads) reinterpret_cast<uint32_t*>(pbuf)[idx] = 0;
  if (tid < kMaxQueries) {
    run_max[tid] = -INFINITY;
    denom[tid] = 0.0f;
  }
  __syncthreads();  // the key list
  const int n = *count, rows = (n + 15) / 16 * 16;
  attn::stage_key_rows(a, slot, b, keys, n, rows, kbuf, rs, warp, lane);
  cp_async_wait_all();
  __syncthreads();

  {  // scores: warp w takes 16-key tiles w and w + 8 (two independent mma chains)
    const int tiles = rows / 16, t0 = warp, t1 = warp + kWarps;
    if (t0 < tiles) {
      float c0[4] = {0.0f, 0.0f, 0.0f, 0.0f}, c1[4] = {0.0f, 0.0f, 0.0f, 0.0f};
      const bool two = t1 < tiles;
      const uint16_t* a0 = kbuf + (t0 * 16 + mr + 8 * (mi % 2)) * rs + 8 * (mi / 2);
      const uint16_t* a1 = kbuf + ((two ? t1 : t0) * 16 + mr + 8 * (mi % 2)) * rs + 8 * (mi / 2);
      const uint16_t* brow = qbuf + mr * rs + 8 * (mi % 2);
      for (int kk = 0; kk < d; kk += 16) {
        uint32_t af[4], bf[2];
        ldmatrix_x2(bf, brow + kk);
        ldmatrix_x4(af, a0 + kk);
        mma_bf16_16x8x16(c0, af[0], af[1], af[2], af[3], bf[0], bf[1]);
        if (two) {
          ldmatrix_x4(af, a1 + kk);
          mma_bf16_16x8x16(c1, af[0], af[1], af[2], af[3], bf[0], bf[1]);
        }
      }
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // c[e] = S(key 16 t + g (+ 8), query 2q (+ 1))
        const int kr = g + (e >= 2 ? 8 : 0), query = 2 * q + (e & 1);
        if (query < k) {
          if (t0 * 16 + kr < n) score[query * ks + t0 * 16 + kr] = c0[e] * a.scale;
          if (two && t1 * 16 + kr < n) score[query * ks + t1 * 16 + kr] = c1[e] * a.scale;
        }
      }
    }
  }
  __syncthreads();

  for (int i = warp; i < k; i += kWarps)  // softmax: each query's key blocks in order
    for (int blk = 0; blk * kKeyBlock < n; ++blk) {
      const int k0 = blk * kKeyBlock, nb = n - k0 < kKeyBlock ? n - k0 : kKeyBlock;
      attn::softmax_step(score + i * ks + k0, nb, praw + i * ks + k0, nullptr, pbuf + i * ps + k0, run_max[i],
                         denom[i], rescale[i * nblk + blk], lane);
    }
  __syncthreads();

  float acc[kTilesPerWarp][4] = {};
  for (int blk = 0; blk * kKeyBlock < n; ++blk) {  // values: rescale, then the block's keys 16 at a time
    const int k0 = blk * kKeyBlock, nb = n - k0 < kKeyBlock ? n - k0 : kKeyBlock, steps = (nb + 15) / 16;
    attn::mma_value_step(acc, 2 * q < k ? rescale[(2 * q) * nblk + blk] : 0.0f,
                         2 * q + 1 < k ? rescale[(2 * q + 1) * nblk + blk] : 0.0f, kbuf, rs, pbuf, ps, k0,
                         steps, d, warp, lane);
  }
  if (tid < k) denom[tid] += exp_f(a.sink[h] - run_max[tid]);
  __syncthreads();  // every warp is past the keys: their rows take the fp32 outputs
  float* out_rows = reinterpret_cast<float*>(smem);  // [k, d]
  attn::mma_store_rows(acc, out_rows, k, d, warp, lane);
  __syncthreads();
  attn::store_outputs(a, out_rows, denom, k, 0, b, h, tid);
}

}  // namespace

bool attention_whole_fits(const AttentionArgs& a) {
  return attention_mma_fits(a) && a.W + a.k <= kWholeMaxKeys && a.d <= kMaxD &&
         WholeSmem{static_cast<int>(a.d), static_cast<int>(a.k), static_cast<int>(a.W)}.bytes() <= 200 * 1024;
}

cudaError_t launch_attention_whole(const AttentionArgs& a, cudaStream_t s) {
  const size_t smem = WholeSmem{static_cast<int>(a.d), static_cast<int>(a.k), static_cast<int>(a.W)}.bytes();
  if (smem > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(
        attention_whole_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.B));
  return launch_kernel(attention_whole_kernel, grid, kThreads, smem, s, a);
}

}  // namespace dspark::cuda
