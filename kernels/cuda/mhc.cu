// Manifold hyper-connections: replicate, the mix coefficients (dot products + Sinkhorn), collapse, expand.
#include "kernels/cuda/device_common.cuh"

namespace dspark::cuda {
namespace {

__global__ void hc_replicate_kernel(const void* x, Elt x_t, void* X, Elt X_t, int64_t hc, int64_t H) {
  const int64_t t = blockIdx.x;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    const float v = ld(x, x_t, t * H + i);
    for (int64_t j = 0; j < hc; ++j) st(X, X_t, (t * hc + j) * H + i, v);
  }
}

// Block (t, i): m_i = (fn_i . X_t) * rsqrt(mean(X_t^2) + eps), written to the slot the coefficient ends in
// (pre, post or comb) for the finishing pass. Every block of a row computes the same r bit for bit.
__global__ void hc_mix_dots_kernel(const void* X, Elt X_t, int64_t hc, int64_t n, const float* fn,
                                   float norm_eps, float* pre, float* post, float* comb) {
  __shared__ float red[kWarps];
  const int64_t t = blockIdx.x, i = blockIdx.y;
  const float* f = fn + i * n;
  float dot = 0.0f, ss = 0.0f;
  for (int64_t c = threadIdx.x; c < n; c += kThreads) {
    const float v = ld(X, X_t, t * n + c);
    dot = fmaf(f[c], v, dot);
    ss = fmaf(v, v, ss);
  }
  dot = block_sum(dot, red);
  ss = block_sum(ss, red);
  if (threadIdx.x == 0) {
    const float r = 1.0f / sqrtf(ss / static_cast<float>(n) + norm_eps);
    const float m = dot * r;
    if (i < hc)
      pre[t * hc + i] = m;
    else if (i < 2 * hc)
      post[t * hc + i - hc] = m;
    else
      comb[t * hc * hc + i - 2 * hc] = m;
  }
}

// One thread per row: sigmoids, row softmax and the Sinkhorn rounds, in the CPU reference's order.
__global__ void hc_mix_finish_kernel(int64_t T, int64_t hc, const float* base, const float* scale,
                                     float hc_eps, int64_t iters, float* pre, float* post, float* comb) {
  const int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (t >= T) return;
  float* pr = pre + t * hc;
  float* po = post + t * hc;
  // The Sinkhorn rounds work on a private copy (registers / local memory): 20 rounds of dependent global
  // loads and stores were latency-bound (~80 us per call at V4.1 sizes). Same operations, same order.
  float c[kMaxHc * kMaxHc];
  float* cg = comb + t * hc * hc;
  for (int64_t i = 0; i < hc * hc; ++i) c[i] = cg[i];
  for (int64_t j = 0; j < hc; ++j) {
    pr[j] = sigmoid_f(pr[j] * scale[0] + base[j]) + hc_eps;
    po[j] = 2.0f * sigmoid_f(po[j] * scale[1] + base[hc + j]);
  }
  for (int64_t j = 0; j < hc; ++j) {
    float* row = c + j * hc;
    for (int64_t l = 0; l < hc; ++l) row[l] = row[l] * scale[2] + base[2 * hc + j * hc + l];
    float mx = row[0];
    for (int64_t l = 1; l < hc; ++l)
      if (mx < row[l]) mx = row[l];  // std::max_element: the first largest
    float sum = 0.0f;
    for (int64_t l = 0; l < hc; ++l) sum += (row[l] = exp_f(row[l] - mx));
    for (int64_t l = 0; l < hc; ++l) row[l] = row[l] / sum + hc_eps;
  }
  auto normalise_columns = [&] {
    for (int64_t l = 0; l < hc; ++l) {
      float sum = 0.0f;
      for (int64_t j = 0; j < hc; ++j) sum += c[j * hc + l];
      for (int64_t j = 0; j < hc; ++j) c[j * hc + l] /= sum + hc_eps;
    }
  };
  auto normalise_rows = [&] {
    for (int64_t j = 0; j < hc; ++j) {
      float sum = 0.0f;
      for (int64_t l = 0; l < hc; ++l) sum += c[j * hc + l];
      for (int64_t l = 0; l < hc; ++l) c[j * hc + l] /= sum + hc_eps;
    }
  };
  normalise_columns();
  for (int64_t it = 1; it < iters; ++it) {
    normalise_rows();
    normalise_columns();
  }
  for (int64_t i = 0; i < hc * hc; ++i) cg[i] = c[i];
}

// out[t, i] = sum_j pre[t, j] X[t, j, i] (j ascending, from 0.0f).
__global__ void hc_collapse_kernel(const void* X, Elt X_t, const float* pre, void* out, Elt out_t, int64_t hc,
                                   int64_t H) {
  const int64_t t = blockIdx.x;
  const float* pr = pre + t * hc;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < hc; ++j) acc += pr[j] * ld(X, X_t, (t * hc + j) * H + i);
    st(out, out_t, t * H + i, acc);
  }
}

// X[t, l, i] <- post[t, l] y[t, i] + sum_j comb[t, j, l] X[t, j, i]; each thread owns one (t, i) column.
__global__ void hc_expand_kernel(const void* y, Elt y_t, void* X, Elt X_t, const float* post,
                                 const float* comb, int64_t hc, int64_t H) {
  const int64_t t = blockIdx.x;
  const float* po = post + t * hc;
  const float* c = comb + t * hc * hc;
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
    float old[kMaxHc];
    for (int64_t j = 0; j < hc; ++j) old[j] = ld(X, X_t, (t * hc + j) * H + i);
    const float yi = ld(y, y_t, t * H + i);
    for (int64_t l = 0; l < hc; ++l) {
      float mixed = 0.0f;
      for (int64_t j = 0; j < hc; ++j) mixed += c[j * hc + l] * old[j];
      st(X, X_t, (t * hc + l) * H + i, po[l] * yi + mixed);
    }
  }
}

}  // namespace

cudaError_t launch_hc_replicate(const void* x, Elt x_t, void* X, Elt X_t, int64_t T, int64_t hc, int64_t H,
                                cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  hc_replicate_kernel<<<static_cast<unsigned>(T), kThreads, 0, s>>>(x, x_t, X, X_t, hc, H);
  return cudaGetLastError();
}

cudaError_t launch_hc_mixes(const void* X, Elt X_t, int64_t T, int64_t hc, int64_t H, const float* fn,
                            const float* base, const float* scale, float norm_eps, float hc_eps,
                            int64_t sinkhorn_iters, float* pre, float* post, float* comb, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  const int64_t nmix = (2 + hc) * hc;
  hc_mix_dots_kernel<<<dim3(static_cast<unsigned>(T), static_cast<unsigned>(nmix)), kThreads, 0, s>>>(
      X, X_t, hc, hc * H, fn, norm_eps, pre, post, comb);
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  hc_mix_finish_kernel<<<grid_for(T, 64), 64, 0, s>>>(T, hc, base, scale, hc_eps, sinkhorn_iters, pre, post,
                                                      comb);
  return cudaGetLastError();
}

cudaError_t launch_hc_collapse(const void* X, Elt X_t, const float* pre, void* out, Elt out_t, int64_t T,
                               int64_t hc, int64_t H, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  hc_collapse_kernel<<<static_cast<unsigned>(T), kThreads, 0, s>>>(X, X_t, pre, out, out_t, hc, H);
  return cudaGetLastError();
}

cudaError_t launch_hc_expand(const void* y, Elt y_t, void* X, Elt X_t, const float* post, const float* comb,
                             int64_t T, int64_t hc, int64_t H, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  hc_expand_kernel<<<static_cast<unsigned>(T), kThreads, 0, s>>>(y, y_t, X, X_t, post, comb, hc, H);
  return cudaGetLastError();
}

}  // namespace dspark::cuda
