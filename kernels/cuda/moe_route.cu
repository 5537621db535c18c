// Mixture-of-experts routing: the gate scores (a block per (expert, row)) and the top-k selection (a warp per
// row, each choice a warp argmax).
#include <cmath>

#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/moe.hpp"

namespace dspark::cuda {
namespace {

__device__ __forceinline__ float softplus(float v) {
  return v > 20.0f ? v : log1p_f(exp_f(v));  // torch's threshold
}

// Gate scores: one block per (expert, row), its threads splitting the row (8-element chunks for bf16), then a
// block sum: a row of 5120 is then a few loads per thread, all in flight, instead of a warp's chain of 20.
__global__ void moe_score_kernel(const void* x, Elt x_t, const void* gate, Elt gate_t, int64_t E, int64_t H,
                                 float gate_temp, bool vec, float* score) {
  wait_for_previous_kernels();
  __shared__ float red[kWarps];
  const int64_t e = blockIdx.x, t = blockIdx.y;
  const void *xr = row_ptr(x, x_t, t, H), *gr = row_ptr(gate, gate_t, e, H);
  float acc = 0.0f;
  if (vec) {
    for (int64_t c = threadIdx.x; c < H / 8; c += kThreads) {
      float xv[8], gv[8];
      unpack_bf16x8(__ldg(static_cast<const uint4*>(xr) + c), xv);
      unpack_bf16x8(__ldg(static_cast<const uint4*>(gr) + c), gv);
#pragma unroll
      for (int u = 0; u < 8; ++u) acc = fmaf(xv[u], gv[u], acc);
    }
  } else {
    for (int64_t i = threadIdx.x; i < H; i += kThreads) acc = fmaf(ld(xr, x_t, i), ld(gr, gate_t, i), acc);
  }
  const float logit = block_sum(acc, red) / gate_temp;
  if (threadIdx.x == 0) score[t * E + e] = sqrtf(softplus(logit));
}

// Top-k of score + bias per row by repeated selection (ties to the lower expert id, as a stable sort),
// weights from the raw scores. One warp per row: lane l holds experts l, l + 32, ...; each choice is a warp
// argmax.
constexpr int kSelectPerLane = kMaxExperts / 32;
__global__ void moe_select_kernel(const float* score_all, const float* bias, int64_t T, int64_t E,
                                  int64_t top_k, float route_scale, bool normalize, int32_t* ids,
                                  float* weights) {
  wait_for_previous_kernels();
  const int lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x / 32) + threadIdx.x / 32;
  if (t >= T) return;
  const float* score = score_all + t * E;
  float key[kSelectPerLane];
#pragma unroll
  for (int q = 0; q < kSelectPerLane; ++q) {
    const int64_t e = lane + 32 * q;
    key[q] = e < E ? score[e] + bias[e] : -INFINITY;
  }
  unsigned taken = 0;  // bit q: expert lane + 32 q already chosen
  int32_t chosen[kMaxTopK];
  for (int64_t c = 0; c < top_k; ++c) {
    float bv = 0.0f;
    int32_t bi = -1;  // this lane's best untaken expert, lowest id first on ties
#pragma unroll
    for (int q = 0; q < kSelectPerLane; ++q) {
      const int32_t e = lane + 32 * q;
      if (e >= E || (taken >> q & 1u)) continue;
      if (bi < 0 || key[q] > bv) bv = key[q], bi = e;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ov = __shfl_xor_sync(0xffffffffu, bv, o);
      const int32_t oi = __shfl_xor_sync(0xffffffffu, bi, o);
      const bool better = oi >= 0 && (bi < 0 || ov > bv || (!(bv > ov) && oi < bi));
      if (better) bv = ov, bi = oi;
    }
    chosen[c] = bi;
    if (bi >= 0 && bi % 32 == lane) taken |= 1u << (bi / 32);
  }
  if (lane != 0) return;
  float sum = 0.0f;
  for (int64_t c = 0; c < top_k; ++c) sum += score[chosen[c]];
  for (int64_t c = 0; c < top_k; ++c) {
    float w = score[chosen[c]];
    if (normalize) w /= sum + 1e-20f;
    ids[t * top_k + c] = chosen[c];
    weights[t * top_k + c] = w * route_scale;
  }
}

}  // namespace

cudaError_t launch_moe_route(const void* x, Elt x_t, const void* gate, Elt gate_t, const float* bias,
                             int64_t T, int64_t E, int64_t H, int64_t top_k, float route_scale,
                             float gate_temp, bool normalize, float* score_scratch, int32_t* ids,
                             float* weights, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  const bool vec = x_t == Elt::bf16 && gate_t == Elt::bf16 && H % 8 == 0 && aligned16(x) && aligned16(gate);
  const cudaError_t err =
      launch_kernel(moe_score_kernel, dim3(static_cast<unsigned>(E), static_cast<unsigned>(T)), kThreads, 0,
                    s, x, x_t, gate, gate_t, E, H, gate_temp, vec, score_scratch);
  if (err != cudaSuccess) return err;
  return launch_kernel(moe_select_kernel, grid_for(T, kWarps), kThreads, 0, s, score_scratch, bias, T, E,
                       top_k, route_scale, normalize, ids, weights);
}

}  // namespace dspark::cuda
