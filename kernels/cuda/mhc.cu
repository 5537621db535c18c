// Manifold hyper-connections: replicate, the mix coefficients (dot products + Sinkhorn), collapse, expand.
#include <initializer_list>

#include "comm/peer_handshake.cuh"
#include "kernels/cuda/act_quant.cuh"
#include "kernels/cuda/device_common.cuh"
#include "kernels/cuda/mhc.hpp"
#include "kernels/cuda/norm_rope.hpp"

namespace dspark::cuda {
namespace {

// The element-wise kernels run a block per (token, 256 channels): a few rows of 5120 channels would
// otherwise leave most of the GPU idle and each thread walking 20 channels in a row.
__global__ void hc_replicate_kernel(const void* x, Elt x_t, void* X, Elt X_t, int64_t hc, int64_t H) {
  wait_for_previous_kernels();
  const int64_t t = blockIdx.x, i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= H) return;
  const float v = ld(x, x_t, t * H + i);
  for (int64_t j = 0; j < hc; ++j) st(X, X_t, (t * hc + j) * H + i, v);
}

// Block (t, i): m_i = (fn_i . X_t) * rsqrt(mean(X_t^2) + eps), written to the slot the coefficient ends in
// (pre, post or comb) for the finishing pass. Every block of a row computes the same r bit for bit. kVec:
// bf16 X, n % 8 == 0, aligned rows: 8 elements per load.
// kVec: the first kMixPreload chunks of this thread's fn row are loaded before the kernel waits for the
// previous one (fn is a weight: nothing earlier in the step writes it), so their fetch overlaps that kernel.
constexpr int kMixPreload = 8;
template <bool kVec>
__global__ void hc_mix_dots_kernel(const void* X, Elt X_t, int64_t hc, int64_t n, const float* fn,
                                   float norm_eps, float* pre, float* post, float* comb) {
  const int64_t t = blockIdx.x, i = blockIdx.y;
  const float* f = fn + i * n;
  const auto* f4 = reinterpret_cast<const float4*>(f);
  [[maybe_unused]] float4 fpre[kMixPreload][2] = {};
  if constexpr (kVec) {
#pragma unroll
    for (int u = 0; u < kMixPreload; ++u) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kThreads;
      if (c < n / 8) fpre[u][0] = __ldg(f4 + 2 * c), fpre[u][1] = __ldg(f4 + 2 * c + 1);
    }
  }
  wait_for_previous_kernels();  // only fn was read so far
  __shared__ float red[kWarps];
  float dot = 0.0f, ss = 0.0f;
  if constexpr (kVec) {
    const uint4* xr = static_cast<const uint4*>(X) + t * n / 8;
    const auto add_chunk = [&](uint4 q, float4 f0, float4 f1) {  // chunks in index order
      const float fv[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
      const uint32_t wq[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float a = __uint_as_float(wq[k] << 16), b = __uint_as_float(wq[k] & 0xffff0000u);
        dot = fmaf(fv[2 * k], a, dot);
        ss = fmaf(a, a, ss);
        dot = fmaf(fv[2 * k + 1], b, dot);
        ss = fmaf(b, b, ss);
      }
    };
#pragma unroll
    for (int u = 0; u < kMixPreload; ++u) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(u) * kThreads;
      if (c < n / 8) add_chunk(__ldg(xr + c), fpre[u][0], fpre[u][1]);
    }
    for (int64_t c = threadIdx.x + static_cast<int64_t>(kMixPreload) * kThreads; c < n / 8; c += kThreads)
      add_chunk(__ldg(xr + c), __ldg(f4 + 2 * c), __ldg(f4 + 2 * c + 1));
  } else {
    for (int64_t c = threadIdx.x; c < n; c += kThreads) {
      const float v = ld(X, X_t, t * n + c);
      dot = fmaf(f[c], v, dot);
      ss = fmaf(v, v, ss);
    }
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

// One block per row, one thread per comb entry (j, l) (hc^2 threads): the sigmoids, the row softmax and the
// Sinkhorn rounds with the CPU reference's operations in its order. Every sum is still one thread adding in
// index order (threads that need the same sum compute it redundantly), so the bits are the serial loop's;
// only independent operations (the exps, the divisions of a normalisation) run side by side. kOneWarp (hc^2
// <= 32): the entries stay in registers and are read across lanes with shuffles; otherwise through shared
// memory. kHc > 0: hc known at compile time (V4.1's 4), so the sums' loops unroll and their shuffles are
// issued together (the same operations in the same order).
template <bool kOneWarp, int kHc>
__global__ void hc_mix_finish_kernel(int64_t hc_run, const float* base, const float* scale, float hc_eps,
                                     int64_t iters, float* pre, float* post, float* comb) {
  wait_for_previous_kernels();
  __shared__ float c[kMaxHc * kMaxHc];
  const int64_t hc = kHc > 0 ? kHc : hc_run;
  const int64_t t = blockIdx.x, n = hc * hc;
  const int me = static_cast<int>(threadIdx.x), j = me / static_cast<int>(hc), l = me % static_cast<int>(hc);
  const unsigned lanes = n >= 32 ? 0xffffffffu : (1u << n) - 1u;
  float* pr = pre + t * hc;
  float* po = post + t * hc;
  float* cg = comb + t * n;
  if (me < hc) {
    pr[me] = sigmoid_f(pr[me] * scale[0] + base[me]) + hc_eps;
    po[me] = 2.0f * sigmoid_f(po[me] * scale[1] + base[hc + me]);
  }
  float mine = cg[me] * scale[2] + base[2 * hc + me];
  // Makes every thread's `mine` readable through get() (and waits until the previous values were read).
  const auto publish = [&] {
    if constexpr (!kOneWarp) {
      __syncthreads();
      c[me] = mine;
      __syncthreads();
    }
  };
  const auto get = [&](int64_t idx) {
    if constexpr (kOneWarp)
      return __shfl_sync(lanes, mine, static_cast<int>(idx));
    else
      return c[idx];
  };
  const auto row_sum = [&] {
    float sum = 0.0f;
    for (int64_t q = 0; q < hc; ++q) sum += get(j * hc + q);
    return sum;
  };
  const auto column_sum = [&] {
    float sum = 0.0f;
    for (int64_t q = 0; q < hc; ++q) sum += get(q * hc + l);
    return sum;
  };
  publish();
  // Row softmax: the first largest of the row, exp, the sum in column order.
  float mx = get(j * hc);
  for (int64_t q = 1; q < hc; ++q) {
    const float v = get(j * hc + q);
    if (mx < v) mx = v;
  }
  mine = exp_f(mine - mx);
  publish();
  mine = mine / row_sum() + hc_eps;
  publish();
  mine /= column_sum() + hc_eps;
  publish();
  for (int64_t it = 1; it < iters; ++it) {
    mine /= row_sum() + hc_eps;
    publish();
    mine /= column_sum() + hc_eps;
    publish();
  }
  cg[me] = mine;
}

// The mHC kernels below come in two instantiations: kHc = 4 with AllBf16 (V4.1's draft step: the hc loops
// unrolled and their loads issued together) and kHc = 0 (hc at run time) with AnyElt.
template <int kHc>
__device__ __forceinline__ int64_t copies(int64_t hc) {
  return kHc > 0 ? kHc : hc;
}

// out[t, i] = sum_j pre[t, j] X[t, j, i] (j ascending, from 0.0f).
template <int kHc, class L>
__global__ void hc_collapse_kernel(const void* X, Elt X_t, const float* pre, void* out, Elt out_t,
                                   int64_t hc_rt, int64_t H) {
  wait_for_previous_kernels();
  const int64_t hc = copies<kHc>(hc_rt);
  const int64_t t = blockIdx.x, i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= H) return;
  const float* pr = pre + t * hc;
  float acc = 0.0f;
#pragma unroll
  for (int64_t j = 0; j < hc; ++j) acc += pr[j] * L::load(X, X_t, (t * hc + j) * H + i);
  L::store(out, out_t, t * H + i, acc);
}

// Collapse then RMSNorm for bf16 X and collapsed rows (H % 8 == 0, 16-byte aligned), block (token, 256
// outputs). Every block computes its token's whole collapsed row for the sum of squares, in rms_norm_kernel's
// vector order (thread i: the 8-element chunks i, i + 256, ..., elements in order), each value as
// hc_collapse_kernel computes and stores it; the hc 16-byte loads of up to kChunks chunks are issued before
// any of them is used. Then the block writes its 256 collapsed and normed outputs. The same bits as
// hc_collapse_kernel then rms_norm_kernel. kHc: the number of copies (compile-time, so the loaded chunks
// stay in registers).
// codes: also normed's activation quantisation (normed bf16; store_act_code's shape).
template <int kHc>
__global__ void hc_collapse_norm_kernel(const uint16_t* X, const float* pre, const void* w, Elt w_t,
                                        float eps, uint16_t* collapsed, void* normed, Elt n_t, int64_t H,
                                        QuantActOut codes) {
  wait_for_previous_kernels();
  constexpr int kChunks = 4;
  __shared__ float red[kWarps];
  const int64_t t = blockIdx.x;
  float pr[kHc];
  for (int j = 0; j < kHc; ++j) pr[j] = pre[t * kHc + j];
  const auto collapse = [&](const float(&x)[kHc]) {  // hc_collapse_kernel's value, stored
    float acc = 0.0f;
    for (int j = 0; j < kHc; ++j) acc += pr[j] * x[j];
    return round_bf16(acc);
  };
  const int64_t chunks = H / 8;
  float ss = 0.0f;
  for (int64_t c0 = threadIdx.x; c0 < chunks; c0 += kChunks * kThreads) {
    uint4 v[kChunks][kHc];
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      const int64_t c = c0 + u * kThreads;
      if (c >= chunks) break;
      for (int j = 0; j < kHc; ++j)
        v[u][j] = __ldg(reinterpret_cast<const uint4*>(X + (t * kHc + j) * H) + c);
    }
#pragma unroll
    for (int u = 0; u < kChunks; ++u) {
      if (c0 + u * kThreads >= chunks) break;
#pragma unroll
      for (int e = 0; e < 8; ++e) {
        float x[kHc];
        for (int j = 0; j < kHc; ++j) {
          const uint32_t word = (&v[u][j].x)[e / 2];
          x[j] = __uint_as_float(e % 2 ? word & 0xffff0000u : word << 16);
        }
        const float a = collapse(x);
        ss = fmaf(a, a, ss);
      }
    }
  }
  const float r = 1.0f / sqrtf(block_sum(ss, red) / static_cast<float>(H) + eps);
  const int64_t i = blockIdx.y * static_cast<int64_t>(kThreads) + threadIdx.x;
  const bool valid = i < H;
  float v = 0.0f;
  if (valid) {
    float x[kHc];
    for (int j = 0; j < kHc; ++j) x[j] = bf16_bits_to_float(X[(t * kHc + j) * H + i]);
    const float c = collapse(x);
    collapsed[t * H + i] = float_to_bf16_bits(c);
    v = ld(w, w_t, i) * (c * r);
    st(normed, n_t, t * H + i, v);
  }
  if (codes.wanted()) store_act_code(round_bf16(v), valid, t, i, H, codes, red);
}

// X[t, l, i] <- post[t, l] yi + sum_j comb[t, j, l] X[t, j, i] for one (t, i) column.
template <int kHc, class L>
__device__ __forceinline__ void expand_column(float yi, void* X, Elt X_t, const float* post,
                                              const float* comb, int64_t hc_rt, int64_t t, int64_t i,
                                              int64_t H) {
  const int64_t hc = copies<kHc>(hc_rt);
  const float* po = post + t * hc;
  const float* c = comb + t * hc * hc;
  float old[kMaxHc];
#pragma unroll
  for (int64_t j = 0; j < hc; ++j) old[j] = L::load(X, X_t, (t * hc + j) * H + i);
#pragma unroll
  for (int64_t l = 0; l < hc; ++l) {
    float mixed = 0.0f;
#pragma unroll
    for (int64_t j = 0; j < hc; ++j) mixed += c[j * hc + l] * old[j];
    L::store(X, X_t, (t * hc + l) * H + i, po[l] * yi + mixed);
  }
}

// X[t, l, i] <- post[t, l] y[t, i] + sum_j comb[t, j, l] X[t, j, i]; each thread owns one (t, i) column.
template <int kHc, class L>
__global__ void hc_expand_kernel(const void* y, Elt y_t, void* X, Elt X_t, const float* post,
                                 const float* comb, int64_t hc_rt, int64_t H) {
  wait_for_previous_kernels();
  const int64_t t = blockIdx.x, i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= H) return;
  expand_column<kHc, L>(L::load(y, y_t, t * H + i), X, X_t, post, comb, hc_rt, t, i, H);
}

// hc_expand whose y is first rounded from the f32 sum (and stored), as convert_kernel then hc_expand_kernel.
template <int kHc, class L>
__global__ void hc_expand_from_sum_kernel(const float* sum, void* y, Elt y_t, void* X, Elt X_t,
                                          const float* post, const float* comb, int64_t hc_rt, int64_t H) {
  wait_for_previous_kernels();
  const int64_t t = blockIdx.x, i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i >= H) return;
  const float yi = L::stored(y_t, sum[t * H + i]);
  L::store(y, y_t, t * H + i, yi);
  expand_column<kHc, L>(yi, X, X_t, post, comb, hc_rt, t, i, H);
}

// hc_expand_from_sum of the ranks' sum, every peer's partial read from peer memory (NVLink, or the same
// GPU) after the handshake of comm/peer_handshake.cuh; this rank's partial is complete once the kernel passes
// its PDL wait. Every thread reaches the handshake's barriers: no early return.
template <int kHc, class L>
__global__ void hc_expand_peer_sum_kernel(const __grid_constant__ PeerView peers, void* y, Elt y_t, void* X,
                                          Elt X_t, const float* post, const float* comb, int64_t hc_rt,
                                          int64_t H) {
  wait_for_previous_kernels(/*let_next_start=*/false);
  peer::peer_arrive(peers);
  let_next_kernel_start();
  const int64_t t = blockIdx.x, i = blockIdx.y * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < H) {
    const float yi = L::stored(y_t, peer::rank_order_sum(peers, t * H + i));
    L::store(y, y_t, t * H + i, yi);
    expand_column<kHc, L>(yi, X, X_t, post, comb, hc_rt, t, i, H);
  }
  peer::peer_depart(peers);
}

// Whether a launch takes the V4.1 instantiation: 4 copies and every element operand bf16.
bool v41_shape(int64_t hc, std::initializer_list<Elt> types) {
  for (const Elt t : types)
    if (t != Elt::bf16) return false;
  return hc == 4;
}

}  // namespace

cudaError_t launch_hc_expand_from_sum(const float* sum, void* y, Elt y_t, void* X, Elt X_t, const float* post,
                                      const float* comb, int64_t T, int64_t hc, int64_t H, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  const auto kernel = v41_shape(hc, {y_t, X_t}) ? hc_expand_from_sum_kernel<4, AllBf16>
                                                : hc_expand_from_sum_kernel<0, AnyElt>;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(T), grid_for(H, kThreads)), kThreads, 0, s, sum, y,
                       y_t, X, X_t, post, comb, hc, H);
}

cudaError_t launch_hc_expand_peer_sum(const PeerView& peers, void* y, Elt y_t, void* X, Elt X_t,
                                      const float* post, const float* comb, int64_t T, int64_t hc, int64_t H,
                                      cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;  // no block: no rank signals, none waits
  const auto kernel = v41_shape(hc, {y_t, X_t}) ? hc_expand_peer_sum_kernel<4, AllBf16>
                                                : hc_expand_peer_sum_kernel<0, AnyElt>;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(T), grid_for(H, kThreads)), kThreads, 0, s, peers,
                       y, y_t, X, X_t, post, comb, hc, H);
}

cudaError_t launch_hc_replicate(const void* x, Elt x_t, void* X, Elt X_t, int64_t T, int64_t hc, int64_t H,
                                cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  return launch_kernel(hc_replicate_kernel, dim3(static_cast<unsigned>(T), grid_for(H, kThreads)), kThreads,
                       0, s, x, x_t, X, X_t, hc, H);
}

cudaError_t launch_hc_mixes(const void* X, Elt X_t, int64_t T, int64_t hc, int64_t H, const float* fn,
                            const float* base, const float* scale, float norm_eps, float hc_eps,
                            int64_t sinkhorn_iters, float* pre, float* post, float* comb, cudaStream_t s) {
  if (T <= 0) return cudaSuccess;
  const int64_t nmix = (2 + hc) * hc;
  const dim3 dots_grid(static_cast<unsigned>(T), static_cast<unsigned>(nmix));
  const bool vec = X_t == Elt::bf16 && (hc * H) % 8 == 0 && aligned16(X) && aligned16(fn);
  const cudaError_t err = launch_kernel(vec ? hc_mix_dots_kernel<true> : hc_mix_dots_kernel<false>, dots_grid,
                                        kThreads, 0, s, X, X_t, hc, hc * H, fn, norm_eps, pre, post, comb);
  if (err != cudaSuccess) return err;
  const dim3 rows(static_cast<unsigned>(T)), entries(static_cast<unsigned>(hc * hc));
  return launch_kernel(hc == 4         ? hc_mix_finish_kernel<true, 4>
                       : hc * hc <= 32 ? hc_mix_finish_kernel<true, 0>
                                       : hc_mix_finish_kernel<false, 0>,
                       rows, entries, 0, s, hc, base, scale, hc_eps, sinkhorn_iters, pre, post, comb);
}

cudaError_t launch_hc_collapse(const void* X, Elt X_t, const float* pre, void* out, Elt out_t, int64_t T,
                               int64_t hc, int64_t H, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  const auto kernel =
      v41_shape(hc, {X_t, out_t}) ? hc_collapse_kernel<4, AllBf16> : hc_collapse_kernel<0, AnyElt>;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(T), grid_for(H, kThreads)), kThreads, 0, s, X, X_t,
                       pre, out, out_t, hc, H);
}

cudaError_t launch_hc_collapse_norm(const void* X, Elt X_t, const float* pre, const void* w, Elt w_t,
                                    float eps, void* collapsed, Elt c_t, void* normed, Elt n_t, int64_t T,
                                    int64_t hc, int64_t H, cudaStream_t s, const QuantActOut& codes) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  if (codes.wanted() && (n_t != Elt::bf16 || !quant_act_out_fits(H, codes.block)))
    return cudaErrorInvalidValue;
  // The fused kernel is compiled for V4.1's 4 copies; other shapes take the two kernels.
  if (hc != 4 || X_t != Elt::bf16 || c_t != Elt::bf16 || H % 8 != 0 || !aligned16(X) ||
      !aligned16(collapsed)) {
    const cudaError_t err = launch_hc_collapse(X, X_t, pre, collapsed, c_t, T, hc, H, s);
    return err != cudaSuccess ? err
                              : launch_rms_norm(collapsed, c_t, w, w_t, eps, normed, n_t, T, H, s, codes);
  }
  return launch_kernel(hc_collapse_norm_kernel<4>, dim3(static_cast<unsigned>(T), grid_for(H, kThreads)),
                       kThreads, 0, s, static_cast<const uint16_t*>(X), pre, w, w_t, eps,
                       static_cast<uint16_t*>(collapsed), normed, n_t, H, codes);
}

cudaError_t launch_hc_expand(const void* y, Elt y_t, void* X, Elt X_t, const float* post, const float* comb,
                             int64_t T, int64_t hc, int64_t H, cudaStream_t s) {
  if (T <= 0 || H <= 0) return cudaSuccess;
  const auto kernel = v41_shape(hc, {y_t, X_t}) ? hc_expand_kernel<4, AllBf16> : hc_expand_kernel<0, AnyElt>;
  return launch_kernel(kernel, dim3(static_cast<unsigned>(T), grid_for(H, kThreads)), kThreads, 0, s, y, y_t,
                       X, X_t, post, comb, hc, H);
}

}  // namespace dspark::cuda
