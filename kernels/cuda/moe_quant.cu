// The grouped experts with quantised weights (fp4 routed experts, fp8 block shared expert: SPEC §3) on the
// tensor cores, from their mma tiles (quant_tile.cuh): x quantised per block, gate_up of every unit's
// 16-channel tiles writing h in bf16 as the bf16 path does, h quantised per block, then down. Block layout
// and order of sums as moe_experts.cu's tensor-core kernels: a pair's result never depends on which other
// pairs share its unit.
#include "kernels/cuda/moe_units.cuh"
#include "kernels/cuda/quant_linear.hpp"
#include "kernels/cuda/quant_tile.cuh"

namespace dspark::cuda {
namespace {

// Chunks whose loads a warp has in flight (2 KiB of fp4 weights for the two matrices of a pass).
constexpr int kAhead = 4;

struct QuantUnit {
  const uint8_t *w1, *w3, *w2;
  const uint8_t *s1, *s3, *s2;
  int64_t I, block;
};
__device__ __forceinline__ QuantUnit quant_unit(const ExpertSet& es, int32_t e) {
  if (e < 0)
    return {static_cast<const uint8_t*>(es.shared_w1),
            static_cast<const uint8_t*>(es.shared_w3),
            static_cast<const uint8_t*>(es.shared_w2),
            static_cast<const uint8_t*>(es.shared_w1_scale),
            static_cast<const uint8_t*>(es.shared_w3_scale),
            static_cast<const uint8_t*>(es.shared_w2_scale),
            es.I_shared,
            es.shared_block};
  return {static_cast<const uint8_t*>(es.w1[e]),
          static_cast<const uint8_t*>(es.w3[e]),
          static_cast<const uint8_t*>(es.w2[e]),
          static_cast<const uint8_t*>(es.w1_scale[e]),
          static_cast<const uint8_t*>(es.w3_scale[e]),
          static_cast<const uint8_t*>(es.w2_scale[e]),
          es.I,
          es.block};
}

// Tile `row0` of a [rows, cols] matrix in its quantised tile layout, and where its scales start.
template <QuantKind kKind>
__device__ __forceinline__ const uint8_t* tile_at(const uint8_t* w, int64_t row0, int64_t cols) {
  return w + row0 * (kKind == QuantKind::fp8 ? cols : cols / 2);
}
template <QuantKind kKind>
__device__ __forceinline__ const uint8_t* tile_scales_at(const uint8_t* s, int64_t row0, int64_t cols,
                                                         int64_t block) {
  return kKind == QuantKind::fp8 ? s + row0 / block * (cols / block) : s + row0 * (cols / kMmaChunk);
}

// Block (16-channel tile, unit): h[p, ch] = bf16(route weight * silu(min(g, L)) * clamp(u, +-L)) from the
// quantised products g = bf16(w1[ch] . x[t]), u = bf16(w3[ch] . x[t]) for every pair p = (t, c).
template <QuantKind kKind>
__global__ void __launch_bounds__(kThreads, kKind == QuantKind::fp4 ? 3 : 2)
    moe_gate_up_quant_kernel(QuantAct xq, const float* weights, int64_t H, int64_t C, int64_t h_stride,
                             MoeGroups g, const __grid_constant__ ExpertSet es, float limit, uint16_t* hbuf) {
  wait_for_previous_kernels();
  __shared__ float part[kWarps][2][kMmaRows * kMmaCols];
  const int64_t u = blockIdx.y;
  if (u >= g.count()) return;
  const int32_t e = g.expert(u);
  const QuantUnit qu = quant_unit(es, e);
  const int64_t ch0 = blockIdx.x * static_cast<int64_t>(kMmaRows);
  if (ch0 >= qu.I) return;  // the whole block: a unit with fewer channels than the largest
  const int gi = static_cast<int>(threadIdx.x) % 32 / 4;
  const uint8_t* const w[2] = {tile_at<kKind>(qu.w1, ch0, H), tile_at<kKind>(qu.w3, ch0, H)};
  const uint8_t* const ws[2] = {tile_scales_at<kKind>(qu.s1, ch0, H, qu.block),
                                tile_scales_at<kKind>(qu.s3, ch0, H, qu.block)};
  const int shift = kKind == QuantKind::fp8 ? fp8_block_shift(qu.block) : 0;
  int c0, c1;
  warp_chunks(H, &c0, &c1);
  const int64_t C32 = H / kMmaChunk;
  const int32_t end = g.begin(u + 1);
  for (int32_t p0 = g.begin(u); p0 < end; p0 += kMmaCols) {
    const int np = end - p0 < kMmaCols ? end - p0 : kMmaCols;
    const int64_t t = g.pair(p0 + (gi < np ? gi : 0)) / C;  // column gi's activation row
    const uint8_t* const xr[1] = {gi < np ? xq.codes + t * H : nullptr};
    const float* const xs[1] = {xq.scales + t * C32};
    float acc[2][1][4] = {};
    quant_tile_dots<kKind, 2, 1, kAhead>(w, ws, shift, xr, xs, c0, c1, acc);
    const float flat[2][4] = {{acc[0][0][0], acc[0][0][1], acc[0][0][2], acc[0][0][3]},
                              {acc[1][0][0], acc[1][0][1], acc[1][0][2], acc[1][0][3]}};
    gate_up_pass_out(flat, part, g, p0, np, e, ch0, qu.I, weights, h_stride, limit, hbuf);
  }
}

// Block (two 16-output tiles, unit): y[p, o] = bf16(w2[o] . h[p]) from h quantised, for the unit's pairs.
constexpr int kDownTiles = 2;
template <QuantKind kKind>
__global__ void __launch_bounds__(kThreads, kKind == QuantKind::fp4 ? 3 : 2)
    moe_down_quant_kernel(int64_t H, QuantAct hq, int64_t h_stride, MoeGroups g,
                          const __grid_constant__ ExpertSet es, float* ybuf) {
  wait_for_previous_kernels();
  __shared__ float part[kWarps][kDownTiles][kMmaRows * kMmaCols];
  const int64_t u = blockIdx.y;
  if (u >= g.count()) return;
  const QuantUnit qu = quant_unit(es, g.expert(u));
  const int64_t o0 = blockIdx.x * static_cast<int64_t>(kMmaRows * kDownTiles);
  const int gi = static_cast<int>(threadIdx.x) % 32 / 4;
  // A tile starting past H is replaced by the last one (read, not stored).
  const auto tile_row = [&](int64_t o) { return o < H ? o : H - kMmaRows; };
  const uint8_t* const w[kDownTiles] = {tile_at<kKind>(qu.w2, tile_row(o0), qu.I),
                                        tile_at<kKind>(qu.w2, tile_row(o0 + kMmaRows), qu.I)};
  const uint8_t* const ws[kDownTiles] = {
      tile_scales_at<kKind>(qu.s2, tile_row(o0), qu.I, qu.block),
      tile_scales_at<kKind>(qu.s2, tile_row(o0 + kMmaRows), qu.I, qu.block)};
  static_assert(kDownTiles == 2, "the tile lists above");
  const int shift = kKind == QuantKind::fp8 ? fp8_block_shift(qu.block) : 0;
  int c0, c1;
  warp_chunks(qu.I, &c0, &c1);
  const int64_t C32 = h_stride / kMmaChunk;
  const int32_t end = g.begin(u + 1);
  for (int32_t p0 = g.begin(u); p0 < end; p0 += kMmaCols) {
    const int np = end - p0 < kMmaCols ? end - p0 : kMmaCols;
    const int64_t p = g.pair(p0 + (gi < np ? gi : 0));
    const uint8_t* const hr[1] = {gi < np ? hq.codes + p * h_stride : nullptr};
    const float* const hs[1] = {hq.scales + p * C32};
    float acc[kDownTiles][1][4] = {};
    quant_tile_dots<kKind, kDownTiles, 1, kAhead>(w, ws, shift, hr, hs, c0, c1, acc);
    const float flat[kDownTiles][4] = {{acc[0][0][0], acc[0][0][1], acc[0][0][2], acc[0][0][3]},
                                       {acc[1][0][0], acc[1][0][1], acc[1][0][2], acc[1][0][3]}};
    down_pass_out<kDownTiles>(flat, part, g, p0, np, o0, H, ybuf);
  }
}

template <QuantKind kKind>
cudaError_t launch_kind(const void* x, const QuantAct* x_codes, int64_t T, const float* weights, int64_t H,
                        int64_t C, int64_t I, int64_t U, int64_t act_block, MoeGroups g, const ExpertSet& es,
                        float limit, uint16_t* hbuf, char* q, float* y, cudaStream_t s) {
  const QuantAct xq = x_codes != nullptr ? *x_codes : quant_act_at(q, T, H);
  const QuantAct hq = quant_act_at(q + align256(static_cast<int64_t>(quant_act_bytes(T, H))), T * C, I);
  cudaError_t err = x_codes != nullptr ? cudaSuccess : launch_quantize_act(x, T, H, H, act_block, xq, s);
  if (err != cudaSuccess) return err;
  const unsigned units = static_cast<unsigned>(U);
  err = launch_kernel(moe_gate_up_quant_kernel<kKind>, dim3(grid_for(I, kMmaRows), units), kThreads, 0, s, xq,
                      weights, H, C, I, g, es, limit, hbuf);
  if (err != cudaSuccess) return err;
  err = launch_quantize_act(hbuf, T * C, I, I, act_block, hq, s);
  if (err != cudaSuccess) return err;
  return launch_kernel(moe_down_quant_kernel<kKind>, dim3(grid_for(H, kMmaRows * kDownTiles), units),
                       kThreads, 0, s, H, hq, I, g, es, y);
}

}  // namespace

cudaError_t launch_quant_units(const void* x, const QuantAct* x_codes, int64_t T, const float* weights,
                               int64_t H, int64_t C, int64_t I, int64_t U, bool shared, MoeGroups g,
                               const ExpertSet& es, float limit, uint16_t* hbuf, char* q, float* y,
                               cudaStream_t s) {
  const ExpertKind kind = shared ? es.shared_kind : es.kind;
  const int64_t act_block = shared ? es.shared_act_block : es.act_block;
  if (!aligned16(x) || H % kMmaChunk != 0 || H % kMmaRows != 0 || I % kMmaChunk != 0 || I % kMmaRows != 0 ||
      act_block <= 0 || act_block % kMmaChunk != 0 || H % act_block != 0 || I % act_block != 0)
    return cudaErrorInvalidValue;
  const int64_t block = shared ? es.shared_block : es.block, per = block / kMmaChunk;
  if (kind == ExpertKind::fp8 && (block % kMmaChunk != 0 || per < 1 || (per & (per - 1)) != 0))
    return cudaErrorInvalidValue;  // a chunk's block column is chunk >> log2(B / 32)
  if (kind == ExpertKind::fp8)
    return launch_kind<QuantKind::fp8>(x, x_codes, T, weights, H, C, I, U, act_block, g, es, limit, hbuf, q,
                                       y, s);
  if (kind == ExpertKind::fp4)
    return launch_kind<QuantKind::fp4>(x, x_codes, T, weights, H, C, I, U, act_block, g, es, limit, hbuf, q,
                                       y, s);
  return cudaErrorInvalidValue;
}

}  // namespace dspark::cuda
