// The mixture-of-experts experts of this rank's intermediate channels, grouped: each selected expert's
// weights are streamed once per step, whatever the number of rows that chose it. moe_group lists the units
// (selected routed experts in ascending id) and each unit's (row, choice) pairs; the shared expert is a
// launch of its own (one unit, every row), so that it can run beside the routing. gate_up and down then
// multiply each unit's weight tiles by its pairs' activations, 8 pairs per pass. With
// bf16 weights and activations and dimensions that are multiples of 32 (every DeepSeek checkpoint) that runs
// on the tensor cores (mma_tile.cuh): a block per (16-channel tile, unit), its 8 warps splitting the input
// dimension and adding their partials in warp order; the weights row-major or, prepared by the backend, in
// mma tiles (mma_tile.cuh: the same products, read faster). Otherwise a scalar path: a warp per (unit,
// channel) or (unit, 4 outputs), fmaf in lane order. A pair's result never depends on which other pairs share
// its unit.
#include <cub/block/block_scan.cuh>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mma_tile.cuh"
#include "kernels/cuda/moe.hpp"
#include "kernels/cuda/moe_units.cuh"
#include "kernels/cuda/quant_linear.hpp"

namespace dspark::cuda {
namespace {

constexpr int kPassRows = 8;         // pairs a warp dots against the weight rows it streams in one pass
constexpr int kDownOutsPerWarp = 4;  // outputs of w2 one warp computes in the down pass

// acc[m][r] = this lane's share of w_m . a_r over n elements (elements lane, lane + 32, ...), for NW weight
// rows and n_rows (<= kPassRows) activation rows.
template <int NW>
__device__ __forceinline__ void lane_dots(const void* const (&w)[NW], Elt w_t, const void* const* a, Elt a_t,
                                          int n_rows, int64_t n, int lane, float (&acc)[NW][kPassRows]) {
#pragma unroll
  for (int m = 0; m < NW; ++m)
#pragma unroll
    for (int r = 0; r < kPassRows; ++r) acc[m][r] = 0.0f;
  for (int64_t i = lane; i < n; i += 32) {
    float wv[NW];
#pragma unroll
    for (int m = 0; m < NW; ++m) wv[m] = ld(w[m], w_t, i);
#pragma unroll
    for (int r = 0; r < kPassRows; ++r) {
      if (r >= n_rows) break;
      const float av = ld(a[r], a_t, i);
#pragma unroll
      for (int m = 0; m < NW; ++m) acc[m][r] = fmaf(wv[m], av, acc[m][r]);
    }
  }
}

// Counting sort of the (row, choice) pairs by expert (rows ascending within an expert), a thread per expert:
// each counts its pairs, a block scan gives its unit index and first slot, then it writes its pairs in row
// order. Launched with kMaxExperts threads.
__global__ void __launch_bounds__(kMaxExperts)
    moe_group_kernel(const int32_t* ids, int64_t T, int64_t top_k, int64_t E, MoeGroups g) {
  wait_for_previous_kernels();
  using Scan = cub::BlockScan<int32_t, kMaxExperts>;
  __shared__ typename Scan::TempStorage scan_tmp;
  const int32_t e = static_cast<int32_t>(threadIdx.x);
  const int64_t n_ids = T * top_k;
  int32_t count = 0;
  if (e < E)
    for (int64_t i = 0; i < n_ids; ++i) count += ids[i] == e;
  int32_t unit = 0, pos = 0;
  Scan(scan_tmp).ExclusiveSum(count > 0 ? 1 : 0, unit);
  __syncthreads();  // scan_tmp is reused
  Scan(scan_tmp).ExclusiveSum(count, pos);
  if (e == kMaxExperts - 1) {  // the totals: units, and the end of the last unit's pairs
    *g.count_at() = unit + (count > 0 ? 1 : 0);
    g.begin_at()[unit + (count > 0 ? 1 : 0)] = pos + count;
  }
  if (count > 0) {
    g.expert_at()[unit] = e;
    g.begin_at()[unit] = pos;
    for (int64_t i = 0; i < n_ids; ++i)
      if (ids[i] == e) g.pairs_at()[pos++] = static_cast<int32_t>(i);
  }
}

struct UnitWeights {
  const void *w1, *w3, *w2;
  Elt w1_t, w2_t;
  int64_t I;
};
__device__ __forceinline__ UnitWeights unit_weights(const ExpertSet& es, int32_t e) {
  if (e < 0) return {es.shared_w1, es.shared_w3, es.shared_w2, es.shared_w1_t, es.shared_w2_t, es.I_shared};
  return {es.w1[e], es.w3[e], es.w2[e], es.w1_t, es.w2_t, es.I};
}

// Block (channel tile, unit): h[p, ch] = bf16(route weight * silu(min(g, L)) * clamp(u, +-L)) with
// g = bf16(w1[ch] . x[t]), u = bf16(w3[ch] . x[t]) for every pair p = (t, c) of the unit.
__global__ void moe_gate_up_kernel(const void* x, Elt x_t, const float* weights, int64_t H, int64_t C,
                                   int64_t h_stride, MoeGroups g, const __grid_constant__ ExpertSet es,
                                   float limit, uint16_t* hbuf) {
  wait_for_previous_kernels();
  const int64_t u = blockIdx.y;
  if (u >= g.count()) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  const int32_t e = g.expert(u);
  const UnitWeights uw = unit_weights(es, e);
  if (ch >= uw.I) return;
  const void* const w[2] = {row_ptr(uw.w1, uw.w1_t, ch, H), row_ptr(uw.w3, uw.w1_t, ch, H)};
  const int32_t end = g.begin(u + 1);
  for (int32_t p0 = g.begin(u); p0 < end; p0 += kPassRows) {
    const int n_rows = end - p0 < kPassRows ? end - p0 : kPassRows;
    const void* a[kPassRows];
    for (int r = 0; r < n_rows; ++r) a[r] = row_ptr(x, x_t, g.pair(p0 + r) / C, H);
    float acc[2][kPassRows];
    lane_dots<2>(w, uw.w1_t, a, x_t, n_rows, H, lane, acc);
#pragma unroll
    for (int r = 0; r < kPassRows; ++r) {
      if (r >= n_rows) break;
      const float gs = warp_sum(acc[0][r]), us = warp_sum(acc[1][r]);
      const int32_t p = g.pair(p0 + r);
      const float rw = e >= 0 ? weights[p] : 1.0f;
      if (lane == 0)
        hbuf[p * h_stride + ch] = swiglu_h(gs, us, limit, e >= 0, rw);  // h is bf16: stored exactly
    }
  }
}

// Block (output tile, unit): y[p, o] = bf16(w2[o] . h[p]) for every pair p of the unit.
__global__ void __launch_bounds__(kThreads, 2)
    moe_down_kernel(int64_t H, int64_t h_stride, MoeGroups g, const __grid_constant__ ExpertSet es,
                    const uint16_t* hbuf, float* ybuf) {
  wait_for_previous_kernels();
  const int64_t u = blockIdx.y;
  if (u >= g.count()) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const UnitWeights uw = unit_weights(es, g.expert(u));
  const int32_t begin = g.begin(u), end = g.begin(u + 1);
  const int64_t o0 = (blockIdx.x * static_cast<int64_t>(kWarps) + warp) * kDownOutsPerWarp;
  if (o0 >= H) return;
  // The warp's outputs together: each h chunk is loaded once for all of them (past H: row H - 1, unused).
  const void* w[kDownOutsPerWarp];
#pragma unroll
  for (int m = 0; m < kDownOutsPerWarp; ++m)
    w[m] = row_ptr(uw.w2, uw.w2_t, o0 + m < H ? o0 + m : H - 1, uw.I);
  for (int32_t p0 = begin; p0 < end; p0 += kPassRows) {
    const int n_rows = end - p0 < kPassRows ? end - p0 : kPassRows;
    const void* a[kPassRows];
    for (int r = 0; r < n_rows; ++r) a[r] = hbuf + g.pair(p0 + r) * h_stride;
    float acc[kDownOutsPerWarp][kPassRows];
    lane_dots<kDownOutsPerWarp>(w, uw.w2_t, a, Elt::bf16, n_rows, uw.I, lane, acc);
#pragma unroll
    for (int m = 0; m < kDownOutsPerWarp; ++m)
#pragma unroll
      for (int r = 0; r < kPassRows; ++r) {
        if (r >= n_rows) break;
        const float y = round_bf16(warp_sum(acc[m][r]));
        if (lane == 0 && o0 + m < H) ybuf[g.pair(p0 + r) * H + o0 + m] = y;
      }
  }
}

// Tensor-core gate_up. Block (16-channel tile, unit); thread g, q of warp w holds channels ch0 + g, + 8 and
// pairs 2q, 2q + 1 of the pass for its k share; channels past I read row I - 1 and are not stored (row-major
// weights; in mma tiles I % 16 == 0, every tile whole).
template <WeightOrder kOrder>
__global__ void __launch_bounds__(kThreads)
    moe_gate_up_mma_kernel(const uint16_t* x, const float* weights, int64_t H, int64_t C, int64_t h_stride,
                           MoeGroups g, const __grid_constant__ ExpertSet es, float limit, uint16_t* hbuf) {
  wait_for_previous_kernels();
  __shared__ float part[kWarps][2][kMmaRows * kMmaCols];
  const int64_t u = blockIdx.y;
  if (u >= g.count()) return;
  const int32_t e = g.expert(u);
  const UnitWeights uw = unit_weights(es, e);
  const int64_t ch0 = blockIdx.x * static_cast<int64_t>(kMmaRows);
  if (ch0 >= uw.I) return;  // the whole block: a unit with fewer channels than the largest
  const int gi = static_cast<int>(threadIdx.x) % 32 / 4;
  const int64_t lo = ch0 + gi < uw.I ? ch0 + gi : uw.I - 1,
                hi = ch0 + gi + 8 < uw.I ? ch0 + gi + 8 : uw.I - 1;
  const auto* w1 = static_cast<const uint16_t*>(uw.w1);
  const auto* w3 = static_cast<const uint16_t*>(uw.w3);
  constexpr bool kTiles = kOrder == WeightOrder::tiles;
  const uint16_t* const w_lo[2] = {w1 + (kTiles ? ch0 : lo) * H, w3 + (kTiles ? ch0 : lo) * H};
  const uint16_t* const w_hi[2] = {w1 + hi * H, w3 + hi * H};
  int64_t c0, c1;
  warp_chunks(H, &c0, &c1);
  const int32_t end = g.begin(u + 1);
  for (int32_t p0 = g.begin(u); p0 < end; p0 += kMmaCols) {
    const int np = end - p0 < kMmaCols ? end - p0 : kMmaCols;
    const uint16_t* xr = x + (g.pair(p0 + (gi < np ? gi : 0)) / C) * H;  // column gi's activation row
    float acc[2][4] = {};
    mma_tile_dots<2, 4, true, kOrder>(w_lo, w_hi, xr, c0, c1, acc);
    gate_up_pass_out(acc, part, g, p0, np, e, ch0, uw.I, weights, h_stride, limit, hbuf);
  }
}

// Tensor-core down. Block (kDownTiles 16-output tiles, unit): y[p, o] = bf16(w2[o] . h[p]) for the unit's
// pairs. Several tiles per block: the unit's index lookups (count, expert, pairs: a chain of dependent loads)
// are paid once for all of them, and their weight loads are in flight together.
constexpr int kDownTiles = 2;
template <WeightOrder kOrder>
__global__ void __launch_bounds__(kThreads)
    moe_down_mma_kernel(int64_t H, int64_t h_stride, MoeGroups g, const __grid_constant__ ExpertSet es,
                        const uint16_t* hbuf, float* ybuf) {
  wait_for_previous_kernels();
  __shared__ float part[kWarps][kDownTiles][kMmaRows * kMmaCols];
  const int64_t u = blockIdx.y;
  if (u >= g.count()) return;
  const UnitWeights uw = unit_weights(es, g.expert(u));
  const int64_t o0 = blockIdx.x * static_cast<int64_t>(kMmaRows * kDownTiles);
  const int gi = static_cast<int>(threadIdx.x) % 32 / 4;
  const auto* w2 = static_cast<const uint16_t*>(uw.w2);
  const auto row = [&](int64_t o) { return w2 + (o < H ? o : H - 1) * uw.I; };  // past H: read, not stored
  // In mma tiles (H % 16 == 0): a tile starting past H is replaced by the last one (read, not stored).
  const auto tile = [&](int64_t o) { return w2 + (o < H ? o : H - kMmaRows) * uw.I; };
  constexpr bool kTiles = kOrder == WeightOrder::tiles;
  const uint16_t* const w_lo[kDownTiles] = {kTiles ? tile(o0) : row(o0 + gi),
                                            kTiles ? tile(o0 + 16) : row(o0 + 16 + gi)};
  const uint16_t* const w_hi[kDownTiles] = {row(o0 + 8 + gi), row(o0 + 24 + gi)};
  static_assert(kDownTiles == 2, "the row lists above");
  int64_t c0, c1;
  warp_chunks(uw.I, &c0, &c1);
  const int32_t end = g.begin(u + 1);
  for (int32_t p0 = g.begin(u); p0 < end; p0 += kMmaCols) {
    const int np = end - p0 < kMmaCols ? end - p0 : kMmaCols;
    const uint16_t* hr = hbuf + g.pair(p0 + (gi < np ? gi : 0)) * h_stride;
    float acc[kDownTiles][4] = {};
    mma_tile_dots<kDownTiles, 4, true, kOrder>(w_lo, w_hi, hr, c0, c1, acc);
    down_pass_out<kDownTiles>(acc, part, g, p0, np, o0, H, ybuf);
  }
}

// out[t, o] = the row's routed y in ascending expert id (equal ids keep their choice order), then the
// shared expert's, added in fp32 from 0 as the CPU reference does.
__global__ void moe_combine_kernel(const int32_t* ids, int64_t T, int64_t H, int64_t top_k, int64_t E,
                                   const float* y, const float* shared, float* out) {
  wait_for_previous_kernels();
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * H) return;
  const int64_t t = i / H, o = i % H;
  const int32_t* row = ids + t * top_k;
  int32_t order[kMaxTopK];
  for (int64_t c = 0; c < top_k; ++c) {
    int64_t q = c;
    while (q > 0 && row[order[q - 1]] > row[c]) {
      order[q] = order[q - 1];
      --q;
    }
    order[q] = static_cast<int32_t>(c);
  }
  float acc = 0.0f;
  for (int64_t r = 0; r < top_k; ++r) {
    const int64_t c = order[r];
    if (row[c] < 0 || row[c] >= E) continue;
    acc += y[(t * top_k + c) * H + o];
  }
  out[i] = acc + shared[i];
}

// Whether gate_up and down can take the tensor-core path: bf16 weights and activations, 16-byte aligned rows
// and 32-element chunks.
bool mma_shapes(const void* x, Elt x_t, int64_t H, int64_t I, Elt w1_t, Elt w3_t, Elt w2_t) {
  return x_t == Elt::bf16 && aligned16(x) && H % kMmaChunk == 0 && I % kMmaChunk == 0 && w1_t == Elt::bf16 &&
         w3_t == Elt::bf16 && w2_t == Elt::bf16;
}

// gate_up then down of the units listed in g (its table written by the kernel before them on s, if any):
// y[p] for every pair p of U units whose largest channel count is I. Weights in mma tiles need the
// tensor-core path.
cudaError_t launch_units(const void* x, Elt x_t, const float* weights, int64_t H, int64_t C, int64_t I,
                         int64_t U, bool mma, bool tiles, MoeGroups g, const ExpertSet& es, float limit,
                         uint16_t* hbuf, float* y, cudaStream_t s) {
  if (tiles && (!mma || H % kMmaRows != 0 || I % kMmaRows != 0)) return cudaErrorInvalidValue;
  const auto* xb = static_cast<const uint16_t*>(x);
  const unsigned units = static_cast<unsigned>(U);
  const auto gate_up_mma =
      tiles ? moe_gate_up_mma_kernel<WeightOrder::tiles> : moe_gate_up_mma_kernel<WeightOrder::rows>;
  const auto down_mma =
      tiles ? moe_down_mma_kernel<WeightOrder::tiles> : moe_down_mma_kernel<WeightOrder::rows>;
  if (I > 0) {
    const cudaError_t err = mma ? launch_kernel(gate_up_mma, dim3(grid_for(I, kMmaRows), units), kThreads, 0,
                                                s, xb, weights, H, C, I, g, es, limit, hbuf)
                                : launch_kernel(moe_gate_up_kernel, dim3(grid_for(I, kWarps), units),
                                                kThreads, 0, s, x, x_t, weights, H, C, I, g, es, limit, hbuf);
    if (err != cudaSuccess) return err;
  }
  return mma ? launch_kernel(down_mma, dim3(grid_for(H, kMmaRows * kDownTiles), units), kThreads, 0, s, H, I,
                             g, es, hbuf, y)
             : launch_kernel(moe_down_kernel, dim3(grid_for(H, kWarps * kDownOutsPerWarp), units), kThreads,
                             0, s, H, I, g, es, hbuf, y);
}

}  // namespace

cudaError_t launch_moe_group(const int32_t* ids, int64_t T, int64_t top_k, int64_t E, MoeGroups g,
                             cudaStream_t s) {
  return launch_kernel(moe_group_kernel, 1, kMaxExperts, 0, s, ids, T, top_k, E, g);
}

size_t moe_routed_scratch_bytes(int64_t T, int64_t top_k, int64_t E, int64_t I, int64_t H, bool quantised) {
  const int64_t U = moe_max_units(T, top_k, E), P = T * top_k;
  const size_t base = align256((2 + 2 * U + P) * 4) + align256(P * I * 2);
  return quantised ? base + quant_act_bytes(T, H) + 256 + quant_act_bytes(P, I) : base;
}

size_t moe_shared_scratch_bytes(int64_t T, int64_t I_shared, int64_t H, bool quantised) {
  const size_t base = align256(T * I_shared * 2);
  return quantised ? base + quant_act_bytes(T, H) + 256 + quant_act_bytes(T, I_shared) : base;
}

cudaError_t launch_moe_routed(const void* x, Elt x_t, const QuantAct* x_codes, const int32_t* ids,
                              const float* weights, int64_t T, int64_t H, int64_t top_k, const ExpertSet& es,
                              float swiglu_limit, void* scratch, float* y, cudaStream_t s) {
  if (T <= 0 || H <= 0 || es.E <= 0) return cudaSuccess;
  if (es.w1_t != es.w3_t) return cudaErrorInvalidValue;  // a unit's w1 and w3 are read with one type
  const int64_t U = moe_max_units(T, top_k, es.E);
  char* p = static_cast<char*>(scratch);
  const MoeGroups g{reinterpret_cast<int32_t*>(p), U, 0};
  auto* hbuf = reinterpret_cast<uint16_t*>(p + align256((2 + 2 * U + T * top_k) * 4));
  if (es.kind != ExpertKind::bf16) {
    const cudaError_t err = launch_kernel(moe_group_kernel, 1, kMaxExperts, 0, s, ids, T, top_k, es.E, g);
    if (err != cudaSuccess) return err;
    char* q = reinterpret_cast<char*>(hbuf) + align256(T * top_k * es.I * 2);
    return launch_quant_units(x, x_codes, T, weights, H, top_k, es.I, U, false, g, es, swiglu_limit, hbuf, q,
                              y, s);
  }
  bool mma = mma_shapes(x, x_t, H, es.I, es.w1_t, es.w3_t, es.w2_t);
  for (int64_t e = 0; mma && e < es.E; ++e)
    mma = aligned16(es.w1[e]) && aligned16(es.w3[e]) && aligned16(es.w2[e]);
  const cudaError_t err = launch_kernel(moe_group_kernel, 1, kMaxExperts, 0, s, ids, T, top_k, es.E, g);
  if (err != cudaSuccess) return err;
  return launch_units(x, x_t, weights, H, top_k, es.I, U, mma, es.tiles, g, es, swiglu_limit, hbuf, y, s);
}

cudaError_t launch_moe_shared(const void* x, Elt x_t, const QuantAct* x_codes, int64_t T, int64_t H,
                              const ExpertSet& es, float swiglu_limit, void* scratch, float* out,
                              cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  if (es.shared_w1_t != es.shared_w3_t) return cudaErrorInvalidValue;
  const MoeGroups g{nullptr, 0, static_cast<int32_t>(T)};
  auto* hbuf = static_cast<uint16_t*>(scratch);
  if (es.shared_kind != ExpertKind::bf16) {
    char* q = static_cast<char*>(scratch) + align256(T * es.I_shared * 2);
    return launch_quant_units(x, x_codes, T, nullptr, H, 1, es.I_shared, 1, true, g, es, swiglu_limit, hbuf,
                              q, out, s);
  }
  const bool mma = mma_shapes(x, x_t, H, es.I_shared, es.shared_w1_t, es.shared_w3_t, es.shared_w2_t) &&
                   aligned16(es.shared_w1) && aligned16(es.shared_w3) && aligned16(es.shared_w2);
  return launch_units(x, x_t, nullptr, H, 1, es.I_shared, 1, mma, es.shared_tiles, g, es, swiglu_limit, hbuf,
                      out, s);
}

cudaError_t launch_moe_combine(const int32_t* ids, int64_t T, int64_t H, int64_t top_k, int64_t E,
                               const float* y, const float* shared, float* out, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  return launch_kernel(moe_combine_kernel, grid_for(T * H, kThreads), kThreads, 0, s, ids, T, H, top_k, E, y,
                       shared, out);
}

}  // namespace dspark::cuda
