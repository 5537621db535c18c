// Pieces both attention kernels share (attention.cu on CUDA cores, attention_mma.cu on the tensor cores): the
// key list of a request, the softmax step of one key block and the epilogue. They follow
// kernels/cpu/attention.cpp: keys in ring-index order then the block rows, blocks of 64 keys with a running
// max, the denominator summed in key order from the unrounded probabilities, the sink in the denominator
// only.
#pragma once

#include <cmath>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_tile.cuh"

namespace dspark::cuda {

// attention_mma.cu: whether a launch fits the tensor-core kernel (bf16 q and keys, d % 16 == 0, d <= 512,
// k <= 8, 16-byte aligned), and its launch (one block per (head, request), or a.splits of them when split).
bool attention_mma_fits(const AttentionArgs& a);
cudaError_t launch_attention_mma(const AttentionArgs& a, cudaStream_t s);
// attention_whole.cu: whether a request's keys (up to W + k) fit in one block's shared memory at once, on the
// tensor-core path, and that kernel's launch (one block per (head, request); the unsplit kernel's bits).
bool attention_whole_fits(const AttentionArgs& a);
cudaError_t launch_attention_whole(const AttentionArgs& a, cudaStream_t s);

}  // namespace dspark::cuda

namespace dspark::cuda::attn {

constexpr int kKeyBlock = 64;
// The tensor-core kernels' shapes: queries are the mma's N; d <= 512 gives each warp 4 channel tiles of the
// value product; each bf16 row in shared memory is padded so that an ldmatrix's 8 rows start in distinct bank
// groups.
constexpr int kMaxQueries = 8;
constexpr int kMaxD = 512;
constexpr int kTilesPerWarp = kMaxD / kMmaRows / kWarps;  // 4
constexpr int kRowPad = 8;

// Row `idx` of a request's key list (idx < W: ring entry; else block row idx - W) and its element type.
__device__ __forceinline__ const void* key_row(const AttentionArgs& a, int64_t slot, int64_t b, int32_t idx,
                                               Elt& t) {
  if (idx < a.W) {
    t = a.ring_kv_t;
    return static_cast<const char*>(a.ring_kv) + (slot * a.W + idx) * a.d * elt_size(a.ring_kv_t);
  }
  t = a.block_kv_t;
  return static_cast<const char*>(a.block_kv) + (b * a.k + (idx - a.W)) * a.d * elt_size(a.block_kv_t);
}

// The block's queries as qbuf's rows (rs bf16 apart, zeros past k), with cp.async: a warp per row
// (kMaxQueries rows, one per warp), its lanes over the 16-byte chunks.
__device__ __forceinline__ void stage_query_rows(const AttentionArgs& a, int64_t b, int64_t h, uint16_t* qbuf,
                                                 int rs, int warp, int lane) {
  static_assert(kMaxQueries == kWarps, "a warp per query row");
  const int chunks = static_cast<int>(a.d) / 8;
  uint4* dst = reinterpret_cast<uint4*>(qbuf + warp * rs);
  const uint4* src = static_cast<const uint4*>(a.q) + ((b * a.k + warp) * a.heads + h) * a.d / 8;
  for (int c = lane; c < chunks; c += 32) {
    if (warp < a.k)
      cp_async_16(dst + c, src + c);
    else
      dst[c] = make_uint4(0, 0, 0, 0);
  }
}

// Rows [0, rows) of kbuf (rs bf16 apart): key keys[row] for row < n, copied with cp.async (wait with
// cp_async_wait_all), zeros after. A warp per row, its lanes over the row's 16-byte chunks, so a row's
// address is computed once (per chunk, the index arithmetic took most of the staging's instructions). bf16
// keys, 16-byte aligned rows.
__device__ __forceinline__ void stage_key_rows(const AttentionArgs& a, int64_t slot, int64_t b,
                                               const int32_t* keys, int n, int rows, uint16_t* kbuf, int rs,
                                               int warp, int lane) {
  const int chunks = static_cast<int>(a.d) / 8;
  for (int row = warp; row < rows; row += kWarps) {
    uint4* dst = reinterpret_cast<uint4*>(kbuf + row * rs);
    if (row < n) {
      Elt t;
      const uint4* src = static_cast<const uint4*>(key_row(a, slot, b, keys[row], t));
      for (int c = lane; c < chunks; c += 32) cp_async_16(dst + c, src + c);
    } else {
      for (int c = lane; c < chunks; c += 32) dst[c] = make_uint4(0, 0, 0, 0);
    }
  }
}

// One warp: the live ring entries of the request's slot in ring-index order (ballot compaction), then W + j
// for its k block rows, into keys[]; *count = their number.
__device__ __forceinline__ void compact_keys(const AttentionArgs& a, int64_t slot, int64_t low, int64_t P,
                                             int32_t* keys, int32_t* count, int lane) {
  const int W = static_cast<int>(a.W);
  int32_t cnt = 0;
  if (slot >= 0 && slot < a.slots) {
    for (int e0 = 0; e0 < W; e0 += 32) {
      const int e = e0 + lane;
      bool live = false;
      if (e < W) {
        const int64_t pp = a.ring_pos[slot * W + e];
        live = pp >= 0 && pp >= low && pp <= P - 1;
      }
      const unsigned mask = __ballot_sync(0xffffffffu, live);
      if (live) keys[cnt + __popc(mask & ((1u << lane) - 1u))] = e;
      cnt += __popc(mask);
    }
  }
  for (int j = lane; j < a.k; j += 32) keys[cnt + j] = W + j;
  if (lane == 0) *count = cnt + static_cast<int>(a.k);
}

// One warp, one query: the softmax step of a key block of nb scores s[0, nb). The block max (order-free), the
// probabilities in parallel into praw (unrounded) and p16 (bf16-rounded, as floats) or p16_bits (as bf16
// bits; keys nb..63 get 0 there); then lane 0 rescales the denominator and adds the block's probabilities in
// key order, and records this block's rescale and the new running max.
__device__ __forceinline__ void softmax_step(const float* s, int nb, float* praw, float* p16,
                                             uint16_t* p16_bits, float& run_max, float& denom, float& rescale,
                                             int lane) {
  float bm = -INFINITY;
  for (int key = lane; key < nb; key += 32) bm = fmaxf(bm, s[key]);
  const float block_max = std_max(run_max, warp_max(bm));
  for (int key = lane; key < kKeyBlock; key += 32) {
    if (key < nb) {
      const float p = exp_f(s[key] - block_max);
      praw[key] = p;
      if (p16) p16[key] = round_bf16(p);
      if (p16_bits) p16_bits[key] = float_to_bf16_bits(p);
    } else if (p16_bits) {
      p16_bits[key] = 0;
    }
  }
  __syncwarp();
  if (lane == 0) {
    const float r = exp_f(run_max - block_max);  // 0 on the first block (max = -inf)
    float sum = denom * r;
#pragma unroll 8  // the loads run ahead; the adds stay in key order
    for (int key = 0; key < nb; ++key) sum += praw[key];
    denom = sum;
    rescale = r;
    run_max = block_max;
  }
  __syncwarp();
}

// The block's outputs: queries [q_first, q_first + k) of request b, head h, from acc [k, d] (fp32) divided by
// denom[i] (the sink term already added); optionally rope's inverse rotation of the last rope_dim channels on
// the values as stored (the same bits as launch_rope(inverse) afterwards).
__device__ __forceinline__ void store_outputs(const AttentionArgs& a, const float* acc, const float* denom,
                                              int k, int q_first, int64_t b, int64_t h, int tid) {
  const int d = static_cast<int>(a.d);
  const int first = a.rope_pos ? d - static_cast<int>(a.rope_dim) : d;
  if (a.out_t == Elt::bf16 && d % 8 == 0 && first % 8 == 0 && reinterpret_cast<uintptr_t>(a.out) % 16 == 0) {
    // A warp per query: 8 channels per 16-byte store, then a lane per rotated pair. The same values as the
    // element loop below, without its per-element index arithmetic.
    const int warp = tid / 32, lane = tid % 32;
    for (int i = warp; i < k; i += kWarps) {
      const int64_t t = b * a.k + q_first + i;
      uint16_t* out = static_cast<uint16_t*>(a.out) + (t * a.heads + h) * d;
      const float* row = acc + i * d;
      const float dn = denom[i];
      for (int c = 8 * lane; c < first; c += 8 * 32) {
        uint32_t w[4];
#pragma unroll
        for (int e = 0; e < 4; ++e)
          w[e] = static_cast<uint32_t>(float_to_bf16_bits(row[c + 2 * e] / dn)) |
                 static_cast<uint32_t>(float_to_bf16_bits(row[c + 2 * e + 1] / dn)) << 16;
        *reinterpret_cast<uint4*>(out + c) = make_uint4(w[0], w[1], w[2], w[3]);
      }
      if (!a.rope_pos) continue;
      const float p = static_cast<float>(a.rope_pos[t]);
      for (int j = lane; j < static_cast<int>(a.rope_dim) / 2; j += 32) {
        const int c = first + 2 * j;
        const float angle = p * a.freqs.f[j];
        const float cs = cos_f(angle), sn = -sin_f(angle);
        const float x0 = round_bf16(row[c] / dn), x1 = round_bf16(row[c + 1] / dn);
        *reinterpret_cast<uint32_t*>(out + c) = static_cast<uint32_t>(float_to_bf16_bits(x0 * cs - x1 * sn)) |
                                                static_cast<uint32_t>(float_to_bf16_bits(x0 * sn + x1 * cs))
                                                    << 16;
      }
    }
    return;
  }
  for (int idx = tid; idx < k * first; idx += kThreads) {
    const int i = idx / first, c = idx - i * first;
    st(a.out, a.out_t, ((b * a.k + q_first + i) * a.heads + h) * d + c, acc[i * d + c] / denom[i]);
  }
  if (a.rope_pos) {
    const int half = static_cast<int>(a.rope_dim) / 2;
    for (int idx = tid; idx < k * half; idx += kThreads) {
      const int i = idx / half, j = idx - i * half, c = first + 2 * j;
      const int64_t t = b * a.k + q_first + i, o = (t * a.heads + h) * d;
      const float angle = static_cast<float>(a.rope_pos[t]) * a.freqs.f[j];
      const float cs = cos_f(angle), sn = -sin_f(angle);
      const float x0 = as_stored(a.out_t, acc[i * d + c] / denom[i]);
      const float x1 = as_stored(a.out_t, acc[i * d + c + 1] / denom[i]);
      st(a.out, a.out_t, o + c, x0 * cs - x1 * sn);
      st(a.out, a.out_t, o + c + 1, x0 * sn + x1 * cs);
    }
  }
}

// The tensor-core kernels' value step, one warp: its kTilesPerWarp channel tiles of O^T (C fragments:
// acc[t][e] = O(query 2q (+ 1), channel 16 (warp + 8 t) + g (+ 8))) rescaled by r0 / r1 (queries 2q / 2q +
// 1), then
// += V^T P^T over `steps` 16-key steps from key0: the keys as kbuf rows (rs bf16 apart, through
// ldmatrix.trans), the bf16 probabilities as pbuf columns (rows ps apart).
__device__ __forceinline__ void mma_value_step(float (&acc)[kTilesPerWarp][4], float r0, float r1,
                                               const uint16_t* kbuf, int rs, const uint16_t* pbuf, int ps,
                                               int key0, int steps, int d, int warp, int lane) {
  const int mi = lane / 8, mr = lane % 8;
#pragma unroll
  for (int t = 0; t < kTilesPerWarp; ++t) {
    acc[t][0] *= r0;
    acc[t][1] *= r1;
    acc[t][2] *= r0;
    acc[t][3] *= r1;
  }
  for (int s = 0; s < steps; ++s) {
    uint32_t bf[2];
    ldmatrix_x2(bf, pbuf + mr * ps + key0 + s * kMmaRows + 8 * (mi % 2));
#pragma unroll
    for (int t = 0; t < kTilesPerWarp; ++t) {
      const int ch0 = (warp + t * kWarps) * kMmaRows;
      if (ch0 >= d) break;
      uint32_t af[4];
      ldmatrix_x4_trans(af, kbuf + (key0 + s * kMmaRows + mr + 8 * (mi / 2)) * rs + ch0 + 8 * (mi % 2));
      mma_bf16_16x8x16(acc[t], af[0], af[1], af[2], af[3], bf[0], bf[1]);
    }
  }
}

// The warp's accumulators (as above) into fp32 rows out_rows [k, d].
__device__ __forceinline__ void mma_store_rows(const float (&acc)[kTilesPerWarp][4], float* out_rows, int k,
                                               int d, int warp, int lane) {
  const int g = lane / 4, q = lane % 4;
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
}

}  // namespace dspark::cuda::attn
