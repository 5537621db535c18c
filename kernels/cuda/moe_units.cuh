// What the grouped experts' launches share (moe_experts.cu: bf16 weights; moe_quant.cu: fp8 / fp4): the unit
// table, the SwiGLU of a pair's channel, the warps' split of a k dimension and the ordered sum of their
// partial tiles. Device code (nvcc only).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/moe.hpp"

namespace dspark::cuda {

// The units of one launch. The routed launch's live in device scratch (int32, written by moe_group): [0]
// unit count, then unit_expert[U], unit_begin[U + 1] and pairs[T top_k], pair p = t top_k + c being row t's
// choice c. The shared launch needs no table: one unit (expert -1 = shared) whose pairs are the rows, p = t.
// Pair p's activation row is p / C (C = top_k, or 1 for the shared launch), its h and y rows are p.
struct MoeGroups {
  int32_t* base;        // the routed table; null for the shared launch
  int64_t U;            // the routed table's capacity in units
  int32_t shared_rows;  // the shared launch's rows
  __device__ int32_t count() const { return base ? base[0] : 1; }
  __device__ int32_t expert(int64_t u) const { return base ? base[1 + u] : -1; }
  __device__ int32_t begin(int64_t u) const { return base ? base[1 + U + u] : (u == 0 ? 0 : shared_rows); }
  __device__ int32_t pair(int64_t i) const { return base ? base[2 + 2 * U + i] : static_cast<int32_t>(i); }
  // The table's parts, for moe_group to write.
  __device__ int32_t* count_at() const { return base; }
  __device__ int32_t* expert_at() const { return base + 1; }
  __device__ int32_t* begin_at() const { return base + 1 + U; }
  __device__ int32_t* pairs_at() const { return base + 2 + 2 * U; }
};

// h of one (pair, channel) from the unrounded w1 and w3 dots: bf16(route weight * silu(min(g, L)) * clamp(u,
// +-L)) with g, u rounded to bf16 first (the shared expert has no route weight).
__device__ __forceinline__ uint16_t swiglu_h(float g_dot, float u_dot, float limit, bool routed,
                                             float weight) {
  const float gv = round_bf16(g_dot), uv = round_bf16(u_dot);
  const float gc = std_min(gv, limit), uc = std_clamp(uv, -limit, limit);
  float v = gc / (1.0f + exp_f(-gc)) * uc;
  if (routed) v *= weight;
  return float_to_bf16_bits(v);
}

// This warp's share [c0, c1) of the n / 32 chunks of a k dimension split kWarps ways.
__device__ __forceinline__ void warp_chunks(int64_t n, int64_t* c0, int64_t* c1) {
  const int64_t nc = n / kMmaChunk, per = (nc + kWarps - 1) / kWarps, w = threadIdx.x / 32;
  *c0 = w * per < nc ? w * per : nc;
  *c1 = *c0 + per < nc ? *c0 + per : nc;
}
__device__ __forceinline__ void warp_chunks(int64_t n, int* c0, int* c1) {
  int64_t a = 0, b = 0;
  warp_chunks(n, &a, &b);
  *c0 = static_cast<int>(a);
  *c1 = static_cast<int>(b);
}

// Adds the kWarps partial tiles in warp order; thread i < kMmaRows * kMmaCols gets element i (row-major).
template <int NM>
__device__ __forceinline__ void stash_partials(const float (&acc)[NM][4],
                                               float (*part)[NM][kMmaRows * kMmaCols]) {
  const int warp = static_cast<int>(threadIdx.x) / 32;
#pragma unroll
  for (int m = 0; m < NM; ++m)
#pragma unroll
    for (int i = 0; i < 4; ++i) part[warp][m][mma_c_index(i)] = acc[m][i];
}

// The gate_up epilogue of one pass (pairs [p0, p0 + np) of unit u, expert e; -1 = shared): the w1 and w3
// partials of every warp (acc, this thread's C fragments) added in warp order, h = SwiGLU into hbuf.
__device__ __forceinline__ void gate_up_pass_out(const float (&acc)[2][4],
                                                 float (*part)[2][kMmaRows * kMmaCols], const MoeGroups& g,
                                                 int32_t p0, int np, int32_t e, int64_t ch0, int64_t I,
                                                 const float* weights, int64_t h_stride, float limit,
                                                 uint16_t* hbuf) {
  stash_partials<2>(acc, part);
  __syncthreads();
  const int i = static_cast<int>(threadIdx.x);
  if (i < kMmaRows * kMmaCols) {
    const int r = i / kMmaCols, n = i % kMmaCols;
    float gs = 0.0f, us = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) gs += part[w][0][i], us += part[w][1][i];
    const int64_t ch = ch0 + r;
    if (n < np && ch < I) {
      const int32_t p = g.pair(p0 + n);
      const float rw = e >= 0 ? weights[p] : 1.0f;
      hbuf[p * h_stride + ch] = swiglu_h(gs, us, limit, e >= 0, rw);  // h is bf16: stored exactly
    }
  }
  __syncthreads();  // part is rewritten by the next pass
}

// The down epilogue of one pass: NT output tiles from o0, every warp's partials added in warp order,
// y = bf16(sum) for the pass's pairs.
template <int NT>
__device__ __forceinline__ void down_pass_out(const float (&acc)[NT][4],
                                              float (*part)[NT][kMmaRows * kMmaCols], const MoeGroups& g,
                                              int32_t p0, int np, int64_t o0, int64_t H, float* ybuf) {
  stash_partials<NT>(acc, part);
  __syncthreads();
  for (int i = static_cast<int>(threadIdx.x); i < NT * kMmaRows * kMmaCols; i += kThreads) {
    const int m = i / (kMmaRows * kMmaCols), e = i % (kMmaRows * kMmaCols), r = e / kMmaCols,
              n = e % kMmaCols;
    float y = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) y += part[w][m][e];
    const int64_t o = o0 + m * kMmaRows + r;
    if (n < np && o < H) ybuf[g.pair(p0 + n) * H + o] = round_bf16(y);
  }
  __syncthreads();
}

// moe_group's unit table of the (row, choice) pairs of ids [T, top_k] into g (moe_experts.cu).
cudaError_t launch_moe_group(const int32_t* ids, int64_t T, int64_t top_k, int64_t E, MoeGroups g,
                             cudaStream_t s);

inline size_t align256(int64_t bytes) {
  return static_cast<size_t>((bytes + 255) / 256 * 256);
}

// gate_up then down of quantised experts (ExpertSet::kind or shared_kind, `shared` picks which) for the units
// of g, as launch_units does for bf16 ones: x quantised into q first (unless x_codes holds its codes), h
// after gate_up. q: scratch of quant_act_bytes(T, H) + 256 + quant_act_bytes(T C, I).
cudaError_t launch_quant_units(const void* x, const QuantAct* x_codes, int64_t T, const float* weights,
                               int64_t H, int64_t C, int64_t I, int64_t U, bool shared, MoeGroups g,
                               const ExpertSet& es, float limit, uint16_t* hbuf, char* q, float* y,
                               cudaStream_t s);

}  // namespace dspark::cuda
