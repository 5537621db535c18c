// The Markov fix-up (per-position top-2 of logits + markov_head . markov_embed[prev]), its commit, and the
// confidence head.
//
// markov_top2 runs two kernels: blocks of kMarkovTile vocabulary columns (one lane per column, every request
// of the batch, so markov_head is read once per position whatever B) reduce to a top-2 per (tile, request); a
// second pass merges the tiles of each request. The merge keeps the lower column on equal values and the
// multiset second largest, so any merge order gives the CPU's sequential scan over the same values.
//
// The Markov bias cache (SPEC §4): the same tile kernels with kBiasOut write a set of tokens' bias dots
// (markov_bias_rows) instead of top-2s; markov_top2 adds a request's cached row where its prev has one, and
// a pass (or a scalar kernel's request group) whose every live request is cached reads no markov_head.
#include <cmath>

#include "comm/peer_handshake.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/markov.hpp"
#include "kernels/cuda/mma_tile.cuh"
#include "lib/core/gumbel.hpp"

namespace dspark::cuda {
namespace {

static_assert(kMarkovTile == kWarps * 32, "one warp per 32 columns of a tile");

// Lane (lane ^ o)'s record; its draw only when `with_draw` (warp-uniform: some request of the lanes draws),
// else none (greedy requests carry no draw, and their shuffles stay as cheap as a top-2's).
__device__ __forceinline__ MarkovRecord shfl_xor_record(const MarkovRecord& t, int o, bool with_draw) {
  MarkovRecord other = markov_empty();
  other.best = __shfl_xor_sync(0xffffffffu, t.best, o);
  other.second = __shfl_xor_sync(0xffffffffu, t.second, o);
  other.index = __shfl_xor_sync(0xffffffffu, t.index, o);
  if (with_draw) {
    other.sample_index = __shfl_xor_sync(0xffffffffu, t.sample_index, o);
    other.score = __shfl_xor_sync(0xffffffffu, t.score, o);
    other.z = __shfl_xor_sync(0xffffffffu, t.z, o);
    other.z_max = __shfl_xor_sync(0xffffffffu, t.z_max, o);
    other.z_sum = __shfl_xor_sync(0xffffffffu, t.z_sum, o);
  }
  return other;
}

// Request b's draw at position j (sampling [B, 4]: temperature bits, seed words; requests' anchor position).
struct Draw {
  float tau;  // 0: greedy
  uint64_t seed;
  uint32_t pos;  // the noise position P + j
};
__device__ __forceinline__ Draw draw_of(const int32_t* requests, const int32_t* sampling, int64_t b,
                                        int64_t j) {
  const int32_t* f = sampling + b * 4;
  return {__int_as_float(f[0]),
          static_cast<uint64_t>(static_cast<uint32_t>(f[1])) |
              static_cast<uint64_t>(static_cast<uint32_t>(f[2])) << 32,
          static_cast<uint32_t>(requests[b * 4 + 2] + j)};
}

// The record of column id's biased logit for a request drawing with d.
__device__ __forceinline__ MarkovRecord record_of(float value, int32_t id, const Draw& d) {
  return markov_single(value, id, d.tau,
                       d.tau > 0.0f ? gumbel_noise(d.seed, d.pos, static_cast<uint32_t>(id)) : 0.0f);
}

// kDraw: some request of the batch may draw (merge_markov, records with draws); else every request is
// greedy and the kernels merge top-2s alone (merge_greedy: the same bits, without the draw's registers).
template <bool kDraw>
__device__ __forceinline__ MarkovRecord merge_records(const MarkovRecord& a, const MarkovRecord& b) {
  if constexpr (kDraw)
    return merge_markov(a, b);
  else
    return merge_greedy(a, b);
}

constexpr int kMarkovGroup = 8;  // requests whose bias dots a lane carries at once

__device__ __forceinline__ void ld8_f32(const float* p, float v[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// One block per tile of kMarkovTile columns, for every request at once: lane l of warp w owns column
// tile * 256 + 32 w + l, reads its markov_head row once (L1 serves the later request groups) and computes the
// bias dots of up to kMarkovGroup requests (fp32, index order) against markov_embed[prev] staged in shared
// memory; a butterfly of merge_markov then gives each warp's top-2 per request, and warp 0's threads merge
// the warps in order. kVec: bf16 head, R % 8 == 0, 16-byte aligned rows. A request's row in the cache, or -1
// (no cache, an invalid prev, a token without a row).
__device__ __forceinline__ int32_t cached_row(const MarkovCacheView& c, int64_t pv, int64_t V) {
  return c.rows != nullptr && pv >= 0 && pv < V ? c.slot[pv] : -1;
}

// The vocabulary tile of this block. `reversed`: the blocks take the tiles from the last one, so that a
// position reads first what the position before it read last, which is still in L2 (markov_head is larger
// than L2 at tp 1 and streams through it in tile order). Where a tile's top-2s land does not change.
__device__ __forceinline__ int64_t markov_tile_of_block(int64_t ntiles, bool reversed) {
  return reversed ? ntiles - 1 - static_cast<int64_t>(blockIdx.x) : static_cast<int64_t>(blockIdx.x);
}

// kBiasOut: prev holds B tokens, every one live (no logits, requests or cache), and bias_out [B, Vr] gets
// their bias dots.
template <bool kVec, bool kBiasOut, bool kDraw>
__global__ void markov_tiles_kernel(const float* logits, int64_t Vr, const void* head, Elt head_t, int64_t R,
                                    const void* embed, Elt embed_t, int64_t V, const int32_t* prev,
                                    const int32_t* requests, const int32_t* sampling, int64_t B, int64_t j,
                                    int64_t k, int64_t vocab_offset, int64_t ntiles, bool reversed,
                                    MarkovRecord* partial, MarkovCacheView cache, float* bias_out) {
  wait_for_previous_kernels();
  extern __shared__ float e[];                                       // [B, R] markov_embed[prev], fp32
  MarkovRecord* wpart = reinterpret_cast<MarkovRecord*>(e + B * R);  // [kWarps, B]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t tile = markov_tile_of_block(ntiles, reversed);
  for (int64_t i = threadIdx.x; i < B * R; i += kThreads) {
    const int64_t b = i / R, pv = prev[b];
    e[i] = pv >= 0 && pv < V ? ld(embed, embed_t, pv * R + i % R) : 0.0f;
  }
  __syncthreads();
  const int64_t v = tile * kMarkovTile + warp * 32 + lane;
  const bool in = v < Vr;
  const char* hrow = static_cast<const char*>(head) + (in ? v : 0) * R * elt_size(head_t);
  for (int64_t b0 = 0; b0 < B; b0 += kMarkovGroup) {
    const int nb = B - b0 < kMarkovGroup ? static_cast<int>(B - b0) : kMarkovGroup;
    float acc[kMarkovGroup];
#pragma unroll
    for (int r = 0; r < kMarkovGroup; ++r) acc[r] = 0.0f;
    bool computed = kBiasOut;  // a live request of the group without a cached row
    if constexpr (!kBiasOut)
      for (int r = 0; r < nb; ++r)
        computed = computed || (j < requests[(b0 + r) * 4 + 3] && cached_row(cache, prev[b0 + r], V) < 0);
    if (in && computed) {
      if constexpr (kVec) {
        for (int64_t i = 0; i < R; i += 8) {
          const uint4 q = __ldg(reinterpret_cast<const uint4*>(hrow) + i / 8);
          const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
          float w[8];
#pragma unroll
          for (int c = 0; c < 4; ++c) {
            w[2 * c] = __uint_as_float(wq[c] << 16);
            w[2 * c + 1] = __uint_as_float(wq[c] & 0xffff0000u);
          }
#pragma unroll
          for (int r = 0; r < kMarkovGroup; ++r) {
            if (r >= nb) break;
            float ev[8];
            ld8_f32(e + (b0 + r) * R + i, ev);
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[r] = fmaf(w[c], ev[c], acc[r]);
          }
        }
      } else {
        for (int64_t i = 0; i < R; ++i) {
          const float w = ld(hrow, head_t, i);
#pragma unroll
          for (int r = 0; r < kMarkovGroup; ++r) {
            if (r >= nb) break;
            acc[r] = fmaf(w, e[(b0 + r) * R + i], acc[r]);
          }
        }
      }
    }
    if constexpr (kBiasOut) {
#pragma unroll
      for (int r = 0; r < kMarkovGroup; ++r)
        if (r < nb && in) bias_out[(b0 + r) * Vr + v] = acc[r];
    } else {
#pragma unroll
      for (int r = 0; r < kMarkovGroup; ++r) {
        if (r >= nb) break;
        const int64_t b = b0 + r;
        // The same for every lane: one request.
        const Draw d = kDraw ? draw_of(requests, sampling, b, j) : Draw{0.0f, 0, 0};
        MarkovRecord t = markov_empty();
        if (in) {
          const int32_t slot = cached_row(cache, prev[b], V);
          const float bias = slot >= 0 ? cache.rows[slot * Vr + v] : acc[r];
          t = record_of(logits[(b * k + j) * Vr + v] + bias, static_cast<int32_t>(vocab_offset + v), d);
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          t = merge_records<kDraw>(t, shfl_xor_record(t, o, kDraw && d.tau > 0.0f));
        }
        if (lane == 0) wpart[warp * B + b] = t;
      }
    }
  }
  if constexpr (kBiasOut) return;
  __syncthreads();
  for (int64_t b = threadIdx.x; b < B; b += kThreads) {
    if (j >= requests[b * 4 + 3]) continue;  // the finishing pass writes the empty answer
    MarkovRecord m = wpart[b];
    for (int w = 1; w < kWarps; ++w) m = merge_records<kDraw>(m, wpart[w * B + b]);
    partial[b * ntiles + tile] = m;
  }
}

// Tensor-core tiles (bf16 head and embedding, R a multiple of 32): warp w of tile block t owns the 32 columns
// from t kMarkovTile + 32 w as two 16-row weight tiles and takes the requests 8 at a time as the product's
// columns (markov_embed[prev] rows; a zero row for an invalid prev). Thread (g, q) then holds, for requests
// 2q and 2q + 1 of the pass, the bias dots of columns g, g + 8, g + 16 and g + 24; it merges their top-2s, a
// butterfly over g merges the warp's, and the block merges its warps in order, as the scalar kernel does.
// kOrder: markov_head row-major, or in mma tiles (Vr % 16 == 0), whose warp loads are 512 contiguous bytes
// instead of 16 runs of 64 (the same products).
// kBiasOut as in markov_tiles_kernel.
template <WeightOrder kOrder, bool kBiasOut, bool kDraw>
__global__ void __launch_bounds__(kThreads)
    markov_tiles_mma_kernel(const float* logits, int64_t Vr, const uint16_t* head, int64_t R,
                            const uint16_t* embed, int64_t V, const int32_t* prev, const int32_t* requests,
                            const int32_t* sampling, int64_t B, int64_t j, int64_t k, int64_t vocab_offset,
                            int64_t ntiles, bool reversed, MarkovRecord* partial, MarkovCacheView cache,
                            float* bias_out) {
  wait_for_previous_kernels();
  extern __shared__ MarkovRecord wtop[];  // [kWarps, B]
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int gi = lane / 4, q = lane % 4;
  const int64_t tile = markov_tile_of_block(ntiles, reversed), v0 = tile * kMarkovTile + warp * 32;
  // Columns past Vr are read (the last row or tile again), not used.
  const auto row = [&](int64_t v) { return head + (v < Vr ? v : Vr - 1) * R; };
  const auto mma_tile = [&](int64_t v) {
    return head + (v < Vr ? v : Vr - kMmaRows) / kMmaRows * kMmaRows * R;
  };
  const bool tiled = kOrder == WeightOrder::tiles;
  const uint16_t* const w_lo[2] = {tiled ? mma_tile(v0) : row(v0 + gi),
                                   tiled ? mma_tile(v0 + 16) : row(v0 + 16 + gi)};
  const uint16_t* const w_hi[2] = {row(v0 + 8 + gi), row(v0 + 24 + gi)};  // rows only
  for (int64_t b0 = 0; b0 < B; b0 += kMmaCols) {
    const int64_t bx = b0 + gi;  // this thread's activation column
    const int32_t pv = bx < B ? prev[bx] : -1;
    const uint16_t* xr = pv >= 0 && pv < V ? embed + pv * R : nullptr;
    // Whether a live column of the pass has no cached row (every thread of the block agrees): if none has,
    // the pass reads no markov_head.
    bool computed = kBiasOut;
    if constexpr (!kBiasOut)
      for (int c = 0; c < kMmaCols && b0 + c < B; ++c)
        computed = computed || (j < requests[(b0 + c) * 4 + 3] && cached_row(cache, prev[b0 + c], V) < 0);
    // This thread's logits (requests 2q and 2q + 1 of the pass, columns g, g + 8, g + 16 and g + 24), loaded
    // before the weights so that both are in flight at once rather than one round trip after the other.
    bool live[2];
    float lg[2][2][2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      const int64_t b = b0 + 2 * q + c;
      live[c] = !kBiasOut && b < B && j < requests[b * 4 + 3];
#pragma unroll
      for (int m = 0; m < 2; ++m)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t v = v0 + 16 * m + gi + 8 * half;
          lg[c][m][half] = live[c] && v < Vr ? logits[(b * k + j) * Vr + v] : 0.0f;
        }
    }
    float acc[2][4] = {};
    if (computed)
      mma_tile_dots<2, 4, /*kStreamed=*/false, kOrder>(w_lo, w_hi, xr, 0, R / kMmaChunk, acc);  // k passes
    if constexpr (kBiasOut) {
#pragma unroll
      for (int c = 0; c < 2; ++c)
#pragma unroll
        for (int m = 0; m < 2; ++m)
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const int64_t b = b0 + 2 * q + c, v = v0 + 16 * m + gi + 8 * half;
            if (b < B && v < Vr) bias_out[b * Vr + v] = acc[m][2 * half + c];
          }
    } else {
      // Whether a request of the pass draws (every thread agrees): its lanes' shuffles then carry draws.
      bool pass_draws = false;
      if constexpr (kDraw)
        for (int c = 0; c < kMmaCols && b0 + c < B; ++c)
          pass_draws = pass_draws || (j < requests[(b0 + c) * 4 + 3] && sampling[(b0 + c) * 4] != 0);
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int64_t b = b0 + 2 * q + c;
        MarkovRecord t = markov_empty();
        if (live[c]) {
          const int32_t slot = cached_row(cache, prev[b], V);
          const Draw d = kDraw ? draw_of(requests, sampling, b, j) : Draw{0.0f, 0, 0};
#pragma unroll
          for (int m = 0; m < 2; ++m)
#pragma unroll
            for (int half = 0; half < 2; ++half) {
              const int64_t v = v0 + 16 * m + gi + 8 * half;
              if (v < Vr) {
                const float bias = slot >= 0 ? cache.rows[slot * Vr + v] : acc[m][2 * half + c];
                t = merge_records<kDraw>(
                    t, record_of(lg[c][m][half] + bias, static_cast<int32_t>(vocab_offset + v), d));
              }
            }
        }
#pragma unroll
        for (int o = 4; o < 32; o <<= 1) {  // lanes of other g, same q
          t = merge_records<kDraw>(t, shfl_xor_record(t, o, pass_draws));
        }
        if (gi == 0 && b < B) wtop[warp * B + b] = t;
      }
    }
  }
  if constexpr (kBiasOut) return;
  __syncthreads();
  for (int64_t b = threadIdx.x; b < B; b += kThreads) {
    if (j >= requests[b * 4 + 3]) continue;  // the finishing pass writes the empty answer
    MarkovRecord m = wtop[b];
    for (int w = 1; w < kWarps; ++w) m = merge_records<kDraw>(m, wtop[w * B + b]);
    partial[b * ntiles + tile] = m;
  }
}

// One block per request merges its tiles: merge_markov only compares (top-2 of a union), so a tree over the
// tiles gives exactly the sequential scan's answer, ties to the lowest id included.
constexpr int kFinishThreads = 256;
template <bool kDraw>
__global__ void markov_finish_kernel(const MarkovRecord* partial, int64_t ntiles, const int32_t* requests,
                                     int64_t j, MarkovRecord* cand) {
  wait_for_previous_kernels();
  __shared__ MarkovRecord part[kFinishThreads];
  const int64_t b = blockIdx.x;
  MarkovRecord m = markov_empty();
  if (j < requests[b * 4 + 3])
    for (int64_t tile = threadIdx.x; tile < ntiles; tile += kFinishThreads)
      m = merge_records<kDraw>(m, partial[b * ntiles + tile]);
  part[threadIdx.x] = m;
  __syncthreads();
  for (int stride = kFinishThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      part[threadIdx.x] = merge_records<kDraw>(part[threadIdx.x], part[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) cand[b] = part[0];
}

// The outputs of position j of request b from its merged record (Backend::markov_commit).
__device__ __forceinline__ void commit_record(const MarkovRecord& c, int64_t b, int64_t j, int64_t k,
                                              int32_t* prev, int32_t* ids, float* margin, float* q,
                                              float* norm) {
  const int32_t tok = drafted_token(c);
  const bool drawn = c.sample_index >= 0;
  ids[b * k + j] = tok;
  margin[b * k + j] = c.best - c.second;
  q[b * k + j] = drafted_probability(c);
  norm[(b * k + j) * 2] = drawn ? c.z_max : 0.0f;
  norm[(b * k + j) * 2 + 1] = drawn ? c.z_sum : 0.0f;
  prev[b] = tok;
}

__global__ void markov_commit_kernel(const MarkovRecord* cand, const int32_t* requests, int64_t B, int64_t j,
                                     int64_t k, int32_t* prev, int32_t* ids, float* margin, float* q,
                                     float* norm) {
  wait_for_previous_kernels();
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= B || j >= requests[b * 4 + 3]) return;
  commit_record(cand[b], b, j, k, prev, ids, margin, q, norm);
}

// markov_commit after the argmax exchange done in place: every peer's records read from peer memory (after
// the handshake of comm/peer_handshake.cuh) and merged in rank order, as argmax_exchange's merge does (ties
// to the lower id). Every thread reaches the handshake's barriers: no early return.
__global__ void markov_peer_commit_kernel(const __grid_constant__ PeerView peers, const int32_t* requests,
                                          int64_t B, int64_t j, int64_t k, int32_t* prev, int32_t* ids,
                                          float* margin, float* q, float* norm) {
  wait_for_previous_kernels(/*let_next_start=*/false);
  peer::peer_arrive(peers);
  let_next_kernel_start();
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b < B && j < requests[b * 4 + 3])
    commit_record(peer::rank_order_merge(peers, b), b, j, k, prev, ids, margin, q, norm);
  peer::peer_depart(peers);
}

// One thread per (column of the whole vocabulary, row): q of the rank's columns, 0 elsewhere
// (Backend::draft_distribution).
__global__ void draft_distribution_kernel(const float* logits, int64_t Vr, const float* bias,
                                          const int32_t* rows, const int32_t* sampling, const float* norm,
                                          int64_t k, int64_t vocab_offset, int64_t V, float* out) {
  wait_for_previous_kernels();
  const int64_t i = blockIdx.y, v = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (v >= V) return;
  const int64_t t = rows[i], c = v - vocab_offset;
  float qv = 0.0f;
  if (c >= 0 && c < Vr) {
    const float tau = __int_as_float(sampling[(t / k) * 4]);
    const float z = (logits[t * Vr + c] + bias[i * Vr + c]) / tau;
    qv = expf(z - norm[t * 2]) / norm[t * 2 + 1];
  }
  out[i * V + v] = qv;
}

// One block of kConfThreads per (position j, request b): proj . [h ; markov_embed[prev_j]] as one fp32 block
// reduction. A wide block: each thread's share of the H + R products is a few elements, loaded in one batch
// (with 256 threads it was three dependent batches of 8, and the block's 8 warps left the SM idle between
// them).
constexpr int kConfThreads = 1024;
constexpr int kConfWarps = kConfThreads / 32;
template <class L>  // AllBf16 (every checkpoint) or AnyElt
__global__ void __launch_bounds__(kConfThreads)
    confidence_kernel(const void* h, Elt h_t, int64_t H, const void* embed, Elt embed_t, int64_t V, int64_t R,
                      const void* proj, Elt proj_t, const int32_t* anchor, const int32_t* ids,
                      const int32_t* requests, int64_t k, float* conf, float* conf_logit) {
  wait_for_previous_kernels();
  __shared__ float red[kConfWarps];
  const int64_t j = blockIdx.x, b = blockIdx.y;
  if (j >= requests[b * 4 + 3]) {
    if (threadIdx.x == 0) {
      conf_logit[b * k + j] = 0.0f;
      conf[b * k + j] = 0.0f;
    }
    return;
  }
  const int64_t pv = j == 0 ? anchor[b] : ids[b * k + j - 1];
  const bool valid = pv >= 0 && pv < V;
  // Elements tid, tid + 1024, ... added in that order; each batch's loads are issued before its adds.
  constexpr int kBatch = 8;
  float acc = 0.0f;
  for (int64_t i0 = threadIdx.x; i0 < H + R; i0 += kBatch * kConfThreads) {
    float f[kBatch], w[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int64_t i = i0 + u * kConfThreads;
      f[u] = 0.0f;
      w[u] = 0.0f;
      if (i < H)
        f[u] = L::load(h, h_t, (b * k + j) * H + i);
      else if (valid && i < H + R)
        f[u] = L::load(embed, embed_t, pv * R + (i - H));
      if (i < H + R) w[u] = L::load(proj, proj_t, i);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u)
      if (i0 + u * kConfThreads < H + R) acc = fmaf(w[u], f[u], acc);
  }
  // The block sum in warp order (fixed: the same bits on every run and rank).
  acc = warp_sum(acc);
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  if (lane == 0) red[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    float logit = 0.0f;
    for (int w2 = 0; w2 < kConfWarps; ++w2) logit += red[w2];
    conf_logit[b * k + j] = logit;
    conf[b * k + j] = sigmoid_f(logit);
  }
}

}  // namespace

namespace {

// The tile kernel launch_markov_top2 and launch_markov_bias_rows use for these weights (one choice, so that
// both give the same bits), launched over the vocabulary's tiles.
template <bool kBiasOut, bool kDraw>
cudaError_t launch_tiles(const float* logits, int64_t Vr, const void* markov_head, Elt head_t,
                         const void* head_tiles, int64_t R, const void* markov_embed, Elt embed_t, int64_t V,
                         const int32_t* prev, const int32_t* requests, const int32_t* sampling, int64_t B,
                         int64_t j, int64_t k, int64_t vocab_offset, MarkovRecord* partial,
                         MarkovCacheView cache, float* bias_out, cudaStream_t s) {
  const int64_t ntiles = (Vr + kMarkovTile - 1) / kMarkovTile;
  if (ntiles == 0) return cudaSuccess;
  // The positions of a draft alternate the tiles' order (markov_tile_of_block).
  const bool reversed = j % 2 == 1;
  const auto set_smem = [](auto kernel, size_t smem) {
    return smem > 48 * 1024 ? cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   static_cast<int>(smem))
                            : cudaSuccess;
  };
  if (head_t == Elt::bf16 && embed_t == Elt::bf16 && R % kMmaChunk == 0 && aligned16(markov_head) &&
      aligned16(markov_embed)) {
    const bool tiled = head_tiles != nullptr && Vr % kMmaRows == 0 && aligned16(head_tiles);
    const auto kernel = tiled ? markov_tiles_mma_kernel<WeightOrder::tiles, kBiasOut, kDraw>
                              : markov_tiles_mma_kernel<WeightOrder::rows, kBiasOut, kDraw>;
    const size_t smem = kBiasOut ? 0 : static_cast<size_t>(kWarps * B) * sizeof(MarkovRecord);
    const cudaError_t err = set_smem(kernel, smem);
    if (err != cudaSuccess) return err;
    return launch_kernel(kernel, static_cast<unsigned>(ntiles), kThreads, smem, s, logits, Vr,
                         static_cast<const uint16_t*>(tiled ? head_tiles : markov_head), R,
                         static_cast<const uint16_t*>(markov_embed), V, prev, requests, sampling, B, j, k,
                         vocab_offset, ntiles, reversed, partial, cache, bias_out);
  }
  const size_t smem = markov_smem_bytes(B, R);
  const bool vec = head_t == Elt::bf16 && R % 8 == 0 && aligned16(markov_head);
  const auto kernel =
      vec ? markov_tiles_kernel<true, kBiasOut, kDraw> : markov_tiles_kernel<false, kBiasOut, kDraw>;
  const cudaError_t err = set_smem(kernel, smem);
  if (err != cudaSuccess) return err;
  return launch_kernel(kernel, static_cast<unsigned>(ntiles), kThreads, smem, s, logits, Vr, markov_head,
                       head_t, R, markov_embed, embed_t, V, prev, requests, sampling, B, j, k, vocab_offset,
                       ntiles, reversed, partial, cache, bias_out);
}

}  // namespace

cudaError_t launch_markov_top2(const float* logits, int64_t Vr, const void* markov_head, Elt head_t,
                               const void* head_tiles, int64_t R, const void* markov_embed, Elt embed_t,
                               int64_t V, const int32_t* prev, const int32_t* requests,
                               const int32_t* sampling, int64_t B, int64_t j, int64_t k, int64_t vocab_offset,
                               MarkovCacheView cache, bool draws, MarkovRecord* partial, MarkovRecord* cand,
                               cudaStream_t s) {
  if (B <= 0) return cudaSuccess;
  const int64_t ntiles = (Vr + kMarkovTile - 1) / kMarkovTile;
  const auto tiles = draws ? launch_tiles<false, true> : launch_tiles<false, false>;
  const cudaError_t err = tiles(logits, Vr, markov_head, head_t, head_tiles, R, markov_embed, embed_t, V,
                                prev, requests, sampling, B, j, k, vocab_offset, partial, cache, nullptr, s);
  if (err != cudaSuccess) return err;
  return launch_kernel(draws ? markov_finish_kernel<true> : markov_finish_kernel<false>,
                       static_cast<unsigned>(B), kFinishThreads, 0, s, partial, ntiles, requests, j, cand);
}

cudaError_t launch_markov_bias_rows(int64_t Vr, const void* markov_head, Elt head_t, const void* head_tiles,
                                    int64_t R, const void* markov_embed, Elt embed_t, int64_t V,
                                    const int32_t* tokens, int64_t n, float* out, cudaStream_t s) {
  if (n <= 0) return cudaSuccess;
  if (n > kMarkovBiasRowsPerLaunch || out == nullptr) return cudaErrorInvalidValue;
  return launch_tiles<true, false>(nullptr, Vr, markov_head, head_t, head_tiles, R, markov_embed, embed_t, V,
                                   tokens, nullptr, nullptr, n, 0, 1, 0, nullptr,
                                   MarkovCacheView{nullptr, nullptr}, out, s);
}

cudaError_t launch_markov_commit(const MarkovRecord* cand, const int32_t* requests, int64_t B, int64_t j,
                                 int64_t k, const MarkovOutputPtrs& out, cudaStream_t s) {
  if (B <= 0) return cudaSuccess;
  return launch_kernel(markov_commit_kernel, grid_for(B, 64), 64, 0, s, cand, requests, B, j, k, out.prev,
                       out.ids, out.margin, out.q, out.norm);
}

cudaError_t launch_markov_peer_commit(const PeerView& peers, const int32_t* requests, int64_t B, int64_t j,
                                      int64_t k, const MarkovOutputPtrs& out, cudaStream_t s) {
  if (B <= 0) return cudaSuccess;  // no block: no rank signals, none waits
  return launch_kernel(markov_peer_commit_kernel, grid_for(B, 64), 64, 0, s, peers, requests, B, j, k,
                       out.prev, out.ids, out.margin, out.q, out.norm);
}

cudaError_t launch_draft_distribution(const float* logits, int64_t Vr, const float* bias, const int32_t* rows,
                                      int64_t n, const int32_t* sampling, const float* norm, int64_t k,
                                      int64_t vocab_offset, int64_t V, float* out, cudaStream_t s) {
  if (n <= 0 || V <= 0) return cudaSuccess;
  constexpr int kColumns = 256;
  return launch_kernel(draft_distribution_kernel, dim3(grid_for(V, kColumns), static_cast<unsigned>(n)),
                       kColumns, 0, s, logits, Vr, bias, rows, sampling, norm, k, vocab_offset, V, out);
}

cudaError_t launch_confidence(const void* h, Elt h_t, int64_t H, const void* markov_embed, Elt embed_t,
                              int64_t V, int64_t R, const void* proj, Elt proj_t, const int32_t* anchor,
                              const int32_t* ids, const int32_t* requests, int64_t B, int64_t k, float* conf,
                              float* conf_logit, cudaStream_t s) {
  if (B <= 0 || k <= 0) return cudaSuccess;
  const bool bf16 = h_t == Elt::bf16 && embed_t == Elt::bf16 && proj_t == Elt::bf16;
  return launch_kernel(bf16 ? confidence_kernel<AllBf16> : confidence_kernel<AnyElt>,
                       dim3(static_cast<unsigned>(k), static_cast<unsigned>(B)), kConfThreads, 0, s, h, h_t,
                       H, markov_embed, embed_t, V, R, proj, proj_t, anchor, ids, requests, k, conf,
                       conf_logit);
}

}  // namespace dspark::cuda
