// Mixture of experts: routing (one block per row) and the experts of this rank's intermediate channels.
//
// moe_experts runs two kernels. gate_up: one warp per (row, choice, channel) computes g = w1 x and u = w3 x
// (fp32 dots, rounded to bf16), the clamped SwiGLU, the routing weight, and stores h rounded to bf16 in the
// scratch. down: one warp per (row, output) adds bf16(w2 . h) over the row's routed choices in ascending
// expert id and then the shared expert, in fp32 from 0, as the CPU reference does.
#include <cmath>

#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {
namespace {

__device__ __forceinline__ float softplus(float v) {
  return v > 20.0f ? v : log1p_f(exp_f(v));  // torch's threshold
}

__device__ __forceinline__ const void* row_ptr(const void* base, Elt t, int64_t row, int64_t n) {
  return static_cast<const char*>(base) + row * n * elt_size(t);
}

// One block per row: E gate dots (one warp each), then thread 0 selects top_k of score + bias (ties to the
// lower id, as a stable sort) and normalises the raw scores of the chosen experts.
// Gate scores: one warp per (expert, row), so the E dot products of a row run in parallel (E = 128 at V4.1).
__global__ void moe_score_kernel(const void* x, Elt x_t, const void* gate, Elt gate_t, int64_t E, int64_t H,
                                 float gate_temp, float* score) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t e = blockIdx.x * static_cast<int64_t>(kWarps) + warp, t = blockIdx.y;
  if (e >= E) return;
  const float logit =
      warp_dot(row_ptr(x, x_t, t, H), x_t, row_ptr(gate, gate_t, e, H), gate_t, H, lane) / gate_temp;
  if (lane == 0) score[t * E + e] = sqrtf(softplus(logit));
}

// Top-k of score + bias per row (ties to the lower expert id), weights from the raw scores.
__global__ void moe_select_kernel(const float* score_all, const float* bias, int64_t E, int64_t top_k,
                                  float route_scale, bool normalize, int32_t* ids, float* weights) {
  const int64_t t = blockIdx.x;
  if (threadIdx.x != 0) return;
  const float* score = score_all + t * E;
  int32_t chosen[kMaxTopK];
  for (int64_t c = 0; c < top_k; ++c) {
    int32_t best = -1;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int64_t q = 0; q < c; ++q) taken = taken || chosen[q] == e;
      if (taken) continue;
      if (best < 0 || score[e] + bias[e] > score[best] + bias[best]) best = static_cast<int32_t>(e);
    }
    chosen[c] = best;
  }
  float sum = 0.0f;
  for (int64_t c = 0; c < top_k; ++c) sum += score[chosen[c]];
  for (int64_t c = 0; c < top_k; ++c) {
    float w = score[chosen[c]];
    if (normalize) w /= sum + 1e-20f;
    ids[t * top_k + c] = chosen[c];
    weights[t * top_k + c] = w * route_scale;
  }
}

__global__ void moe_gate_up_kernel(const void* x, Elt x_t, const int32_t* ids, const float* weights,
                                   int64_t H, int64_t top_k, int64_t I_max,
                                   const __grid_constant__ ExpertSet es, float limit, float* hbuf) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t ch = blockIdx.x * static_cast<int64_t>(kWarps) + warp, c = blockIdx.y, t = blockIdx.z;
  const void *w1, *w3;
  Elt w1_t, w3_t;
  int64_t I;
  bool scaled;
  float scale = 1.0f;
  if (c < top_k) {
    const int32_t e = ids[t * top_k + c];
    if (e < 0 || e >= es.E) return;  // skipped by the down pass too
    w1 = es.w1[e];
    w3 = es.w3[e];
    w1_t = es.w1_t;
    w3_t = es.w3_t;
    I = es.I;
    scaled = true;
    scale = weights[t * top_k + c];
  } else {
    w1 = es.shared_w1;
    w3 = es.shared_w3;
    w1_t = es.shared_w1_t;
    w3_t = es.shared_w3_t;
    I = es.I_shared;
    scaled = false;
  }
  if (ch >= I) return;
  const void* xr = row_ptr(x, x_t, t, H);
  const float g = round_bf16(warp_dot(xr, x_t, row_ptr(w1, w1_t, ch, H), w1_t, H, lane));
  const float u = round_bf16(warp_dot(xr, x_t, row_ptr(w3, w3_t, ch, H), w3_t, H, lane));
  const float gc = std_min(g, limit), uc = std_clamp(u, -limit, limit);
  float v = gc / (1.0f + exp_f(-gc)) * uc;
  if (scaled) v *= scale;
  if (lane == 0) hbuf[(t * (top_k + 1) + c) * I_max + ch] = round_bf16(v);
}

__global__ void moe_down_kernel(const int32_t* ids, int64_t H, int64_t top_k, int64_t I_max,
                                const __grid_constant__ ExpertSet es, const float* hbuf, float* out) {
  const int warp = static_cast<int>(threadIdx.x) / 32, lane = static_cast<int>(threadIdx.x) % 32;
  const int64_t o = blockIdx.x * static_cast<int64_t>(kWarps) + warp, t = blockIdx.y;
  if (o >= H) return;
  // The row's choices in ascending expert id (insertion sort; equal ids keep their choice order).
  int32_t order[kMaxTopK];
  for (int64_t c = 0; c < top_k; ++c) {
    const int32_t e = ids[t * top_k + c];
    int64_t q = c;
    while (q > 0 && ids[t * top_k + order[q - 1]] > e) {
      order[q] = order[q - 1];
      --q;
    }
    order[q] = static_cast<int32_t>(c);
  }
  const int64_t C = top_k + 1;
  float acc = 0.0f;
  for (int64_t r = 0; r < top_k; ++r) {
    const int64_t c = order[r];
    const int32_t e = ids[t * top_k + c];
    if (e < 0 || e >= es.E) continue;
    const float y = warp_dot(hbuf + (t * C + c) * I_max, Elt::f32, row_ptr(es.w2[e], es.w2_t, o, es.I),
                             es.w2_t, es.I, lane);
    acc += round_bf16(y);
  }
  const float y =
      warp_dot(hbuf + (t * C + top_k) * I_max, Elt::f32,
               row_ptr(es.shared_w2, es.shared_w2_t, o, es.I_shared), es.shared_w2_t, es.I_shared, lane);
  acc += round_bf16(y);
  if (lane == 0) out[t * H + o] = acc;
}

}  // namespace

cudaError_t launch_moe_route(const void* x, Elt x_t, const void* gate, Elt gate_t, const float* bias,
                             int64_t T, int64_t E, int64_t H, int64_t top_k, float route_scale,
                             float gate_temp, bool normalize, float* score_scratch, int32_t* ids,
                             float* weights, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  moe_score_kernel<<<dim3(grid_for(E, kWarps), static_cast<unsigned>(T)), kThreads, 0, s>>>(
      x, x_t, gate, gate_t, E, H, gate_temp, score_scratch);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  moe_select_kernel<<<static_cast<unsigned>(T), 32, 0, s>>>(score_scratch, bias, E, top_k, route_scale,
                                                            normalize, ids, weights);
  return cudaGetLastError();
}

cudaError_t launch_moe_experts(const void* x, Elt x_t, const int32_t* ids, const float* weights, int64_t T,
                               int64_t H, int64_t top_k, const ExpertSet& experts, float swiglu_limit,
                               float* h_scratch, float* out, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  const int64_t I_max = experts.I > experts.I_shared ? experts.I : experts.I_shared;
  if (I_max > 0) {
    const dim3 grid(grid_for(I_max, kWarps), static_cast<unsigned>(top_k + 1), static_cast<unsigned>(T));
    moe_gate_up_kernel<<<grid, kThreads, 0, s>>>(x, x_t, ids, weights, H, top_k, I_max, experts, swiglu_limit,
                                                 h_scratch);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
  moe_down_kernel<<<dim3(grid_for(H, kWarps), static_cast<unsigned>(T)), kThreads, 0, s>>>(
      ids, H, top_k, I_max, experts, h_scratch, out);
  return cudaGetLastError();
}

}  // namespace dspark::cuda
