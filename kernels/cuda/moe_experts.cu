// The mixture-of-experts experts of this rank's intermediate channels, grouped: each selected expert's
// weights are streamed once per step, whatever the number of rows that chose it. moe_group lists the units
// (selected routed experts in ascending id, then the shared expert) and each unit's (row, choice) pairs;
// gate_up and down run one warp per (unit, channel) and (unit, output) and dot the weight row against every
// pair's activations (read through L1: the rows of a unit are shared by the block's warps). Each pair's dot
// product has the same lane order and butterfly whatever else the unit holds, so the result does not depend
// on the grouping.
#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {
namespace {

constexpr int kPassRows = 8;         // pairs a warp dots against the weight rows it streams in one pass
constexpr int kDownOutsPerWarp = 4;  // outputs of w2 one warp computes in the down pass

// Eight bf16 values (one 16-byte load) as floats.
__device__ __forceinline__ void unpack_bf16x8(uint4 q, float v[8]) {
  const uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    v[2 * k] = __uint_as_float(w[k] << 16);
    v[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
  }
}

// Eight activations (bf16 or f32) from index i (a multiple of 8; 16-byte aligned rows). Weights stream past
// L1
// (__ldcs in lane_dots: read once per step); activations are cached there (__ldg: the block's warps share
// them).
__device__ __forceinline__ void ld8_act(const void* p, Elt t, int64_t i, float v[8]) {
  if (t == Elt::bf16) {
    unpack_bf16x8(__ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(p) + i)), v);
  } else {
    const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + i);
    const float4 a = __ldg(q), b = __ldg(q + 1);
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
}

// acc[m][r] = this lane's share of w_m . a_r over n elements, for NW weight rows and n_rows (<= kPassRows)
// activation rows. kVec: bf16 weights, 16-byte aligned rows and n % 8 == 0, lane l takes the 8-element
// chunks l, l + 32, ...; otherwise elements l, l + 32, ... one at a time.
template <int NW, bool kVec>
__device__ __forceinline__ void lane_dots(const void* const (&w)[NW], Elt w_t, const void* const* a, Elt a_t,
                                          int n_rows, int64_t n, int lane, float (&acc)[NW][kPassRows]) {
#pragma unroll
  for (int m = 0; m < NW; ++m)
#pragma unroll
    for (int r = 0; r < kPassRows; ++r) acc[m][r] = 0.0f;
  if constexpr (kVec) {
    // kLoadBatch chunks' weights are loaded before any is used: more bytes in flight per warp.
    constexpr int kLoadBatch = NW <= 2 ? 4 : 2;
    const int64_t nc = n / 8;
    for (int64_t c0 = lane; c0 < nc; c0 += 32 * kLoadBatch) {
      uint4 wq[NW][kLoadBatch];
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u)
        if (c0 + 32 * u < nc)
#pragma unroll
          for (int m = 0; m < NW; ++m)
            wq[m][u] = __ldcs(
                reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(w[m]) + 8 * (c0 + 32 * u)));
#pragma unroll
      for (int u = 0; u < kLoadBatch; ++u) {
        const int64_t c = c0 + 32 * u;
        if (c >= nc) break;
        float wv[NW][8];
#pragma unroll
        for (int m = 0; m < NW; ++m) unpack_bf16x8(wq[m][u], wv[m]);
#pragma unroll
        for (int r = 0; r < kPassRows; ++r) {
          if (r >= n_rows) break;
          float av[8];
          ld8_act(a[r], a_t, 8 * c, av);
#pragma unroll
          for (int m = 0; m < NW; ++m)
#pragma unroll
            for (int k = 0; k < 8; ++k) acc[m][r] = fmaf(wv[m][k], av[k], acc[m][r]);
        }
      }
    }
  } else {
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
}

// The units of one step (device scratch, int32): [0] unit count, then unit_expert[U] (-1 = shared),
// unit_begin[U + 1] and pairs[T (top_k + 1)] (pair p = t (top_k + 1) + c; c = top_k is the shared expert).
struct MoeGroups {
  int32_t* base;
  int64_t U;
  __device__ int32_t* count() const { return base; }
  __device__ int32_t* expert() const { return base + 1; }
  __device__ int32_t* begin() const { return base + 1 + U; }
  __device__ int32_t* pairs() const { return base + 2 + 2 * U; }
};

// One thread: counting sort of the (row, choice) pairs by expert (rows ascending within an expert).
__global__ void moe_group_kernel(const int32_t* ids, int64_t T, int64_t top_k, int64_t E, MoeGroups g) {
  __shared__ int32_t next[kMaxExperts];
  if (threadIdx.x != 0) return;
  for (int64_t e = 0; e < E; ++e) next[e] = 0;
  for (int64_t i = 0; i < T * top_k; ++i) {
    const int32_t e = ids[i];
    if (e >= 0 && e < E) ++next[e];
  }
  int32_t n = 0, pos = 0;
  for (int64_t e = 0; e < E; ++e) {
    if (next[e] == 0) continue;
    g.expert()[n] = static_cast<int32_t>(e);
    g.begin()[n] = pos;
    const int32_t c = next[e];
    next[e] = pos;
    pos += c;
    ++n;
  }
  g.expert()[n] = -1;
  g.begin()[n] = pos;
  ++n;
  g.begin()[n] = pos + static_cast<int32_t>(T);
  *g.count() = n;
  const int64_t C = top_k + 1;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t c = 0; c < top_k; ++c) {
      const int32_t e = ids[t * top_k + c];
      if (e >= 0 && e < E) g.pairs()[next[e]++] = static_cast<int32_t>(t * C + c);
    }
    g.pairs()[pos + t] = static_cast<int32_t>(t * C + top_k);
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
template <bool kVec>
__global__ void moe_gate_up_kernel(const void* x, Elt x_t, const float* weights, int64_t H, int64_t top_k,
                                   int64_t I_max, MoeGroups g, const __grid_constant__ ExpertSet es,
                                   float limit, uint16_t* hbuf) {
  const int64_t u = blockIdx.y;
  if (u >= *g.count()) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kWarps) + warp;
  const int32_t e = g.expert()[u];
  const UnitWeights uw = unit_weights(es, e);
  if (ch >= uw.I) return;
  const void* const w[2] = {row_ptr(uw.w1, uw.w1_t, ch, H), row_ptr(uw.w3, uw.w1_t, ch, H)};
  const int64_t C = top_k + 1;
  const int32_t end = g.begin()[u + 1];
  for (int32_t p0 = g.begin()[u]; p0 < end; p0 += kPassRows) {
    const int n_rows = end - p0 < kPassRows ? end - p0 : kPassRows;
    const void* a[kPassRows];
    for (int r = 0; r < n_rows; ++r) a[r] = row_ptr(x, x_t, g.pairs()[p0 + r] / C, H);
    float acc[2][kPassRows];
    lane_dots<2, kVec>(w, uw.w1_t, a, x_t, n_rows, H, lane, acc);
#pragma unroll
    for (int r = 0; r < kPassRows; ++r) {
      if (r >= n_rows) break;
      const float gv = round_bf16(warp_sum(acc[0][r])), uv = round_bf16(warp_sum(acc[1][r]));
      const int32_t p = g.pairs()[p0 + r];
      const float gc = std_min(gv, limit), uc = std_clamp(uv, -limit, limit);
      float v = gc / (1.0f + exp_f(-gc)) * uc;
      if (e >= 0) v *= weights[(p / C) * top_k + p % C];
      if (lane == 0) hbuf[p * I_max + ch] = float_to_bf16_bits(v);  // h is bf16: stored exactly
    }
  }
}

// Block (output tile, unit): y[p, o] = bf16(w2[o] . h[p]) for every pair p of the unit.
template <bool kVec>
__global__ void __launch_bounds__(kThreads, 2)
    moe_down_kernel(int64_t H, int64_t I_max, MoeGroups g, const __grid_constant__ ExpertSet es,
                    const uint16_t* hbuf, float* ybuf) {
  const int64_t u = blockIdx.y;
  if (u >= *g.count()) return;
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const UnitWeights uw = unit_weights(es, g.expert()[u]);
  const int32_t begin = g.begin()[u], end = g.begin()[u + 1];
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
    for (int r = 0; r < n_rows; ++r) a[r] = hbuf + g.pairs()[p0 + r] * I_max;
    float acc[kDownOutsPerWarp][kPassRows];
    lane_dots<kDownOutsPerWarp, kVec>(w, uw.w2_t, a, Elt::bf16, n_rows, uw.I, lane, acc);
#pragma unroll
    for (int m = 0; m < kDownOutsPerWarp; ++m)
#pragma unroll
      for (int r = 0; r < kPassRows; ++r) {
        if (r >= n_rows) break;
        const float y = round_bf16(warp_sum(acc[m][r]));
        if (lane == 0 && o0 + m < H) ybuf[g.pairs()[p0 + r] * H + o0 + m] = y;
      }
  }
}

// out[t, o] = the row's routed y in ascending expert id (equal ids keep their choice order), then the
// shared expert's, added in fp32 from 0 as the CPU reference does.
__global__ void moe_combine_kernel(const int32_t* ids, int64_t T, int64_t H, int64_t top_k, int64_t E,
                                   const float* ybuf, float* out) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= T * H) return;
  const int64_t t = i / H, o = i % H, C = top_k + 1;
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
    acc += ybuf[(t * C + c) * H + o];
  }
  out[i] = acc + ybuf[(t * C + top_k) * H + o];
}

}  // namespace

size_t moe_experts_scratch_bytes(int64_t T, int64_t H, int64_t top_k, int64_t E, int64_t I_max) {
  const int64_t U = moe_max_units(T, top_k, E), C = top_k + 1;
  const auto align = [](int64_t b) { return (b + 255) / 256 * 256; };
  return static_cast<size_t>(align((2 + 2 * U + T * C) * 4) + align(T * C * I_max * 2) + T * C * H * 4);
}

cudaError_t launch_moe_experts(const void* x, Elt x_t, const int32_t* ids, const float* weights, int64_t T,
                               int64_t H, int64_t top_k, const ExpertSet& es, float swiglu_limit,
                               void* scratch, float* out, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  const int64_t I_max = es.I > es.I_shared ? es.I : es.I_shared, C = top_k + 1;
  const int64_t U = moe_max_units(T, top_k, es.E);
  const auto align = [](int64_t b) { return (b + 255) / 256 * 256; };
  char* p = static_cast<char*>(scratch);
  const MoeGroups g{reinterpret_cast<int32_t*>(p), U};
  uint16_t* hbuf = reinterpret_cast<uint16_t*>(p + align((2 + 2 * U + T * C) * 4));
  float* ybuf = reinterpret_cast<float*>(p + align((2 + 2 * U + T * C) * 4) + align(T * C * I_max * 2));

  // The 8-element path needs bf16 weights and activations and 16-byte aligned rows everywhere.
  const auto aligned = [](const void* q) { return reinterpret_cast<uintptr_t>(q) % 16 == 0; };
  bool vec = x_t == Elt::bf16 && aligned(x) && H % 8 == 0 && es.I % 8 == 0 && es.I_shared % 8 == 0 &&
             es.w1_t == Elt::bf16 && es.w3_t == Elt::bf16 && es.w2_t == Elt::bf16 &&
             es.shared_w1_t == Elt::bf16 && es.shared_w3_t == Elt::bf16 && es.shared_w2_t == Elt::bf16 &&
             aligned(es.shared_w1) && aligned(es.shared_w3) && aligned(es.shared_w2);
  for (int64_t e = 0; vec && e < es.E; ++e) vec = aligned(es.w1[e]) && aligned(es.w3[e]) && aligned(es.w2[e]);
  // w1 and w3 of a unit are read with one element type: the set must agree (it does for every checkpoint).
  if (es.w1_t != es.w3_t || es.shared_w1_t != es.shared_w3_t) return cudaErrorInvalidValue;

  moe_group_kernel<<<1, 32, 0, s>>>(ids, T, top_k, es.E, g);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  if (I_max > 0) {
    const dim3 grid(grid_for(I_max, kWarps), static_cast<unsigned>(U));
    if (vec)
      moe_gate_up_kernel<true>
          <<<grid, kThreads, 0, s>>>(x, x_t, weights, H, top_k, I_max, g, es, swiglu_limit, hbuf);
    else
      moe_gate_up_kernel<false>
          <<<grid, kThreads, 0, s>>>(x, x_t, weights, H, top_k, I_max, g, es, swiglu_limit, hbuf);
    err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  const dim3 grid(grid_for(H, kWarps * kDownOutsPerWarp), static_cast<unsigned>(U));
  if (vec)
    moe_down_kernel<true><<<grid, kThreads, 0, s>>>(H, I_max, g, es, hbuf, ybuf);
  else
    moe_down_kernel<false><<<grid, kThreads, 0, s>>>(H, I_max, g, es, hbuf, ybuf);
  err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  moe_combine_kernel<<<grid_for(T * H, kThreads), kThreads, 0, s>>>(ids, T, H, top_k, es.E, ybuf, out);
  return cudaGetLastError();
}

}  // namespace dspark::cuda
