// The Markov fix-up (per-position top-2 of logits + markov_head . markov_embed[prev]), its commit, and the
// confidence head.
//
// markov_top2 runs two kernels: blocks of kMarkovTile vocabulary columns (one warp per 32 contiguous columns,
// one fp32 dot per column) keep the CPU's running top-2 rule and merge their warps in column order; a second
// pass merges the tiles of each request in column order. The merge keeps the lower column on equal values and
// the multiset second largest, so the result is the CPU's sequential scan over the same values.
#include <cmath>

#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {
namespace {

static_assert(kMarkovTile == kWarps * 32, "one warp per 32 columns of a tile");

__device__ __forceinline__ Top2Dev top2_empty() {
  return Top2Dev{-INFINITY, -INFINITY, 0, 0};
}

// The top two of the union of two candidate sets (commutative and associative).
__device__ __forceinline__ Top2Dev top2_merge(const Top2Dev& lo, const Top2Dev& hi) {
  Top2Dev r;
  // Ties go to the lower vocabulary id whichever side holds it, so merges may run in any order.
  if (hi.best > lo.best || (hi.best == lo.best && hi.index < lo.index)) {
    r.best = hi.best;
    r.index = hi.index;
    r.second = std_max(hi.second, lo.best);
  } else {
    r.best = lo.best;
    r.index = lo.index;
    r.second = std_max(lo.second, hi.best);
  }
  r.pad = 0;
  return r;
}

__global__ void markov_tiles_kernel(const float* logits, int64_t Vr, const void* head, Elt head_t, int64_t R,
                                    const void* embed, Elt embed_t, int64_t V, const int32_t* prev,
                                    const int32_t* requests, int64_t j, int64_t k, int64_t vocab_offset,
                                    int64_t ntiles, Top2Dev* partial) {
  extern __shared__ float e[];  // [R] markov_embed[prev], fp32
  __shared__ Top2Dev wpart[kWarps];
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t tile = blockIdx.x, b = blockIdx.y;
  if (j >= requests[b * 4 + 3]) return;  // the finishing pass writes the empty answer
  const int64_t pv = prev[b];
  const bool valid = pv >= 0 && pv < V;
  for (int64_t i = threadIdx.x; i < R; i += kThreads) e[i] = valid ? ld(embed, embed_t, pv * R + i) : 0.0f;
  __syncthreads();
  const float* row = logits + (b * k + j) * Vr;
  Top2Dev best = top2_empty();
  const int64_t c0 = tile * kMarkovTile + warp * 32;
  for (int64_t v = c0; v < c0 + 32 && v < Vr; ++v) {
    const float bias =
        warp_dot(static_cast<const char*>(head) + v * R * elt_size(head_t), head_t, e, Elt::f32, R, lane);
    const float val = row[v] + bias;
    if (val > best.best) {  // strict: the first (lowest) column wins a tie
      best.second = best.best;
      best.best = val;
      best.index = static_cast<int32_t>(vocab_offset + v);
    } else if (val > best.second) {
      best.second = val;
    }
  }
  if (lane == 0) wpart[warp] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    Top2Dev m = wpart[0];
    for (int w = 1; w < kWarps; ++w) m = top2_merge(m, wpart[w]);
    partial[b * ntiles + tile] = m;
  }
}

// One block per request merges its tiles: top2_merge only compares (top-2 of a union), so a tree over the
// tiles gives exactly the sequential scan's answer, ties to the lowest id included.
constexpr int kFinishThreads = 256;
__global__ void markov_finish_kernel(const Top2Dev* partial, int64_t ntiles, const int32_t* requests,
                                     int64_t j, Top2Dev* cand) {
  __shared__ Top2Dev part[kFinishThreads];
  const int64_t b = blockIdx.x;
  Top2Dev m = top2_empty();
  if (j < requests[b * 4 + 3])
    for (int64_t tile = threadIdx.x; tile < ntiles; tile += kFinishThreads)
      m = top2_merge(m, partial[b * ntiles + tile]);
  part[threadIdx.x] = m;
  __syncthreads();
  for (int stride = kFinishThreads / 2; stride > 0; stride /= 2) {
    if (static_cast<int>(threadIdx.x) < stride)
      part[threadIdx.x] = top2_merge(part[threadIdx.x], part[threadIdx.x + stride]);
    __syncthreads();
  }
  if (threadIdx.x == 0) cand[b] = part[0];
}

__global__ void markov_commit_kernel(const Top2Dev* cand, const int32_t* requests, int64_t B, int64_t j,
                                     int64_t k, int32_t* prev, int32_t* ids, float* margin) {
  const int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (b >= B || j >= requests[b * 4 + 3]) return;
  ids[b * k + j] = cand[b].index;
  margin[b * k + j] = cand[b].best - cand[b].second;
  prev[b] = cand[b].index;
}

// One block per (position j, request b): proj . [h ; markov_embed[prev_j]] as one fp32 block reduction.
__global__ void confidence_kernel(const void* h, Elt h_t, int64_t H, const void* embed, Elt embed_t,
                                  int64_t V, int64_t R, const void* proj, Elt proj_t, const int32_t* anchor,
                                  const int32_t* ids, const int32_t* requests, int64_t k, float* conf,
                                  float* conf_logit) {
  __shared__ float red[kWarps];
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
  float acc = 0.0f;
  for (int64_t i = threadIdx.x; i < H + R; i += kThreads) {
    float f = 0.0f;
    if (i < H)
      f = ld(h, h_t, (b * k + j) * H + i);
    else if (valid)
      f = ld(embed, embed_t, pv * R + (i - H));
    acc = fmaf(ld(proj, proj_t, i), f, acc);
  }
  const float logit = block_sum(acc, red);
  if (threadIdx.x == 0) {
    conf_logit[b * k + j] = logit;
    conf[b * k + j] = sigmoid_f(logit);
  }
}

}  // namespace

cudaError_t launch_markov_top2(const float* logits, int64_t Vr, const void* markov_head, Elt head_t,
                               int64_t R, const void* markov_embed, Elt embed_t, int64_t V,
                               const int32_t* prev, const int32_t* requests, int64_t B, int64_t j, int64_t k,
                               int64_t vocab_offset, Top2Dev* partial, Top2Dev* cand, cudaStream_t s) {
  if (B <= 0) return cudaSuccess;
  const int64_t ntiles = (Vr + kMarkovTile - 1) / kMarkovTile;
  if (ntiles > 0) {
    const size_t smem = static_cast<size_t>(R) * sizeof(float);
    if (smem > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(
          markov_tiles_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
      if (err != cudaSuccess) return err;
    }
    markov_tiles_kernel<<<dim3(static_cast<unsigned>(ntiles), static_cast<unsigned>(B)), kThreads, smem, s>>>(
        logits, Vr, markov_head, head_t, R, markov_embed, embed_t, V, prev, requests, j, k, vocab_offset,
        ntiles, partial);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  markov_finish_kernel<<<static_cast<unsigned>(B), kFinishThreads, 0, s>>>(partial, ntiles, requests, j,
                                                                           cand);
  return cudaGetLastError();
}

cudaError_t launch_markov_commit(const Top2Dev* cand, const int32_t* requests, int64_t B, int64_t j,
                                 int64_t k, int32_t* prev, int32_t* ids, float* margin, cudaStream_t s) {
  if (B <= 0) return cudaSuccess;
  markov_commit_kernel<<<grid_for(B, 64), 64, 0, s>>>(cand, requests, B, j, k, prev, ids, margin);
  return cudaGetLastError();
}

cudaError_t launch_confidence(const void* h, Elt h_t, int64_t H, const void* markov_embed, Elt embed_t,
                              int64_t V, int64_t R, const void* proj, Elt proj_t, const int32_t* anchor,
                              const int32_t* ids, const int32_t* requests, int64_t B, int64_t k, float* conf,
                              float* conf_logit, cudaStream_t s) {
  if (B <= 0 || k <= 0) return cudaSuccess;
  confidence_kernel<<<dim3(static_cast<unsigned>(k), static_cast<unsigned>(B)), kThreads, 0, s>>>(
      h, h_t, H, markov_embed, embed_t, V, R, proj, proj_t, anchor, ids, requests, k, conf, conf_logit);
  return cudaGetLastError();
}

}  // namespace dspark::cuda
