// mHC, KV rings, attention, MoE, the Markov loop and the confidence head: shape / dtype checks, then
// launches.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/rope_host.hpp"

namespace dspark {

using cuda::check;
using cuda::Elt;
using cuda::elt;
using cuda::expect_dtype;
using cuda::expect_numel;
using cuda::expect_rank;

namespace {

constexpr int64_t kMaxGridYZ = 65535;

void check_hc(const Tensor& X, const char* op) {
  expect_rank(X, 3, op, "X");
  if (X.dim(1) < 1 || X.dim(1) > cuda::kMaxHc)
    fail("cuda {}: hc = {} outside [1, {}]", op, X.dim(1), cuda::kMaxHc);
}

// The operands of an expand into X [T, hc, H]: y [T, H], post [T, hc] and comb [T, hc, hc] fp32.
void check_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb, const char* op) {
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_numel(y, T * H, op, "y");
  expect_dtype(post, DType::f32, op, "post");
  expect_dtype(comb, DType::f32, op, "comb");
  expect_numel(post, T * hc, op, "post");
  expect_numel(comb, T * hc * hc, op, "comb");
}

void request_rows_check(const Tensor& requests, int64_t B, const char* op) {
  expect_dtype(requests, DType::i32, op, "requests");
  if (requests.numel() < B * kReqFields)
    fail("cuda {}: requests {} hold fewer than {} rows of {}", op, shape_str(requests.shape), B, kReqFields);
}

// One expert matrix [rows, cols] of an ExpertSet; its dtype must agree with the set's, and its layout
// (row-major or mma tiles) with `layout`'s, the first matrix's.
const void* expert_matrix(const LinearWeight& w, int64_t rows, int64_t cols, Elt* t, bool first,
                          const LinearWeight& layout, const char* op) {
  if (w.format != WeightFormat::dense && w.format != WeightFormat::bf16_mma_tiles)
    fail("cuda {}: weight '{}' is {}, only dense weights are supported", op, w.name,
         weight_format_name(w.format));
  if (w.format != layout.format)
    fail("cuda {}: weight '{}' is {}, '{}' is {}: one launch reads one layout", op, w.name,
         weight_format_name(w.format), layout.name, weight_format_name(layout.format));
  if (w.out != rows || w.in != cols || w.weight.numel() != rows * cols)
    fail("cuda {}: weight '{}' [{}, {}] ({}) must be [{}, {}]", op, w.name, w.out, w.in,
         shape_str(w.weight.shape), rows, cols);
  const Elt e = elt(w.weight, op, w.name.c_str());
  if (first)
    *t = e;
  else if (e != *t)
    fail("cuda {}: weight '{}' is {}, other experts' are not", op, w.name, dtype_name(w.weight.dtype));
  return w.weight.data;
}

// A stage's routed experts as an ExpertSet (the shared expert's fields unset).
cuda::ExpertSet routed_set(const StageWeights& stage, int64_t H, const char* op) {
  const int64_t E = static_cast<int64_t>(stage.experts.size());
  if (E > cuda::kMaxExperts) fail("cuda {}: {} experts (at most {})", op, E, cuda::kMaxExperts);
  cuda::ExpertSet es{};
  es.E = E;
  es.I = E > 0 ? stage.experts[0].w1.out : 0;
  for (int64_t e = 0; e < E; ++e) {
    const ExpertWeights& ew = stage.experts[static_cast<size_t>(e)];
    const LinearWeight& layout = stage.experts[0].w1;  // every matrix in expert 0's w1's layout
    es.w1[e] = expert_matrix(ew.w1, es.I, H, &es.w1_t, e == 0, layout, op);
    es.w3[e] = expert_matrix(ew.w3, es.I, H, &es.w3_t, e == 0, layout, op);
    es.w2[e] = expert_matrix(ew.w2, H, es.I, &es.w2_t, e == 0, layout, op);
  }
  if (es.w1_t != es.w3_t) fail("cuda {}: w1 and w3 of the experts must have one dtype", op);
  es.tiles = E > 0 && stage.experts[0].w1.format == WeightFormat::bf16_mma_tiles;
  return es;
}

// A stage's shared expert as an ExpertSet (no routed experts).
cuda::ExpertSet shared_set(const StageWeights& stage, int64_t H, const char* op) {
  cuda::ExpertSet es{};
  es.I_shared = stage.shared.w1.out;
  const LinearWeight& layout = stage.shared.w1;
  es.shared_w1 = expert_matrix(stage.shared.w1, es.I_shared, H, &es.shared_w1_t, true, layout, op);
  es.shared_w3 = expert_matrix(stage.shared.w3, es.I_shared, H, &es.shared_w3_t, true, layout, op);
  es.shared_w2 = expert_matrix(stage.shared.w2, H, es.I_shared, &es.shared_w2_t, true, layout, op);
  if (es.shared_w1_t != es.shared_w3_t)
    fail("cuda {}: w1 and w3 of the shared expert must have one dtype", op);
  es.shared_tiles = layout.format == WeightFormat::bf16_mma_tiles;
  return es;
}

// Experts in mma tiles run on the tensor cores only: x bf16, its rows 16-byte aligned.
void expect_tiles_input(const Tensor& x, const char* op) {
  if (x.dtype != DType::bf16 || !cuda::aligned16(x.data))
    fail("cuda {}: the experts are in mma tiles, which need x bf16 and 16-byte aligned (x is {})", op,
         dtype_name(x.dtype));
}

// Rows of an activation x [T, H] (T = 0 for an empty one).
int64_t rows_of(const Tensor& x, const char* op) {
  if (x.shape.empty()) fail("cuda {}: x has no shape", op);
  const int64_t H = x.shape.back();
  return H > 0 ? x.numel() / H : 0;
}

}  // namespace

// ---- mHC

void CudaBackend::hc_replicate(const Tensor& x, const Tensor& X) {
  const char* op = "hc_replicate";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_numel(x, T * H, op, "x");
  check(cuda::launch_hc_replicate(x.data, elt(x, op, "x"), X.data, elt(X, op, "X"), T, hc, H, cur_), op);
}

void CudaBackend::hc_mixes(const Tensor& X, const HcMixWeights& w, const MixParams& p, const Tensor& pre,
                           const Tensor& post, const Tensor& comb) {
  const char* op = "hc_mixes";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2), nmix = (2 + hc) * hc;
  if (T > std::numeric_limits<int32_t>::max()) fail("cuda hc_mixes: {} rows", T);
  expect_dtype(w.fn, DType::f32, op, "fn");
  expect_dtype(w.base, DType::f32, op, "base");
  expect_dtype(w.scale, DType::f32, op, "scale");
  expect_numel(w.fn, nmix * hc * H, op, "fn");
  expect_numel(w.base, nmix, op, "base");
  if (w.scale.numel() < 3) fail("cuda hc_mixes: scale {} must hold 3 values", shape_str(w.scale.shape));
  for (const Tensor* t : {&pre, &post, &comb}) expect_dtype(*t, DType::f32, op, "pre/post/comb");
  expect_numel(pre, T * hc, op, "pre");
  expect_numel(post, T * hc, op, "post");
  expect_numel(comb, T * hc * hc, op, "comb");
  check(cuda::launch_hc_mixes(X.data, elt(X, op, "X"), T, hc, H, w.fn.as<const float>(),
                              w.base.as<const float>(), w.scale.as<const float>(), p.norm_eps, p.hc_eps,
                              p.sinkhorn_iters, pre.as<float>(), post.as<float>(), comb.as<float>(), cur_),
        op);
}

void CudaBackend::hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& out) {
  const char* op = "hc_collapse";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_dtype(pre, DType::f32, op, "pre");
  expect_numel(pre, T * hc, op, "pre");
  expect_numel(out, T * H, op, "out");
  check(cuda::launch_hc_collapse(X.data, elt(X, op, "X"), pre.as<const float>(), out.data,
                                 elt(out, op, "out"), T, hc, H, cur_),
        op);
}

void CudaBackend::hc_collapse_norm(const Tensor& X, const Tensor& pre, const Tensor& w, float eps,
                                   const Tensor& collapsed, const Tensor& normed) {
  const char* op = "hc_collapse_norm";
  check_hc(X, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_dtype(pre, DType::f32, op, "pre");
  expect_numel(pre, T * hc, op, "pre");
  expect_numel(w, H, op, "weight");
  expect_numel(collapsed, T * H, op, "collapsed");
  expect_numel(normed, T * H, op, "normed");
  check(cuda::launch_hc_collapse_norm(
            X.data, elt(X, op, "X"), pre.as<const float>(), w.data, elt(w, op, "weight"), eps, collapsed.data,
            elt(collapsed, op, "collapsed"), normed.data, elt(normed, op, "normed"), T, hc, H, cur_),
        op);
}

void CudaBackend::hc_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) {
  const char* op = "hc_expand";
  check_expand(y, X, post, comb, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  check(cuda::launch_hc_expand(y.data, elt(y, op, "y"), X.data, elt(X, op, "X"), post.as<const float>(),
                               comb.as<const float>(), T, hc, H, cur_),
        op);
}

void CudaBackend::convert_hc_expand(const Tensor& sum, const Tensor& y, const Tensor& X, const Tensor& post,
                                    const Tensor& comb) {
  const char* op = "convert_hc_expand";
  check_expand(y, X, post, comb, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  expect_dtype(sum, DType::f32, op, "sum");
  expect_numel(sum, T * H, op, "sum");
  check(
      cuda::launch_hc_expand_from_sum(sum.as<const float>(), y.data, elt(y, op, "y"), X.data, elt(X, op, "X"),
                                      post.as<const float>(), comb.as<const float>(), T, hc, H, cur_),
      op);
}

void CudaBackend::peer_sum_hc_expand(const PeerBuffer& s, int64_t rows, const Tensor& y, const Tensor& X,
                                     const Tensor& post, const Tensor& comb) {
  const char* op = "peer_sum_hc_expand";
  check_expand(y, X, post, comb, op);
  const int64_t T = X.dim(0), hc = X.dim(1), H = X.dim(2);
  if (s.empty()) fail("cuda {}: no peer partial", op);
  expect_dtype(s.mine, DType::f32, op, "partial");
  if (rows != T || s.mine.numel() < T * H)
    fail("cuda {}: {} rows of {} against a partial {}", op, rows, H, shape_str(s.mine.shape));
  check(cuda::launch_hc_expand_peer_sum(s.mine.as<const float>(), static_cast<const float*>(s.peer), s.rank,
                                        s.signal_peer, s.flag, s.arrivals, y.data, elt(y, op, "y"), X.data,
                                        elt(X, op, "X"), post.as<const float>(), comb.as<const float>(), T,
                                        hc, H, cur_),
        op);
}

// ---- KV rings

void CudaBackend::ring_write(const Tensor& ring_kv, const Tensor& ring_pos, const Tensor& kv,
                             const Tensor& slots, const Tensor& pos) {
  const char* op = "ring_write";
  expect_rank(ring_kv, 3, op, "ring_kv");
  expect_rank(ring_pos, 2, op, "ring_pos");
  expect_rank(kv, 2, op, "kv");
  expect_dtype(ring_pos, DType::i32, op, "ring_pos");
  expect_dtype(slots, DType::i32, op, "slots");
  expect_dtype(pos, DType::i32, op, "pos");
  if (dtype_size(ring_kv.dtype) != 2)
    fail("cuda ring_write: ring_kv must be 16-bit, got {}", dtype_name(ring_kv.dtype));
  expect_dtype(kv, ring_kv.dtype, op, "kv");
  const int64_t S = ring_kv.dim(0), W = ring_kv.dim(1), d = ring_kv.dim(2), N = kv.dim(0);
  if (ring_pos.dim(0) != S || ring_pos.dim(1) != W || kv.dim(1) != d || W < 1)
    fail("cuda ring_write: ring_kv {}, ring_pos {} and kv {} disagree", shape_str(ring_kv.shape),
         shape_str(ring_pos.shape), shape_str(kv.shape));
  expect_numel(slots, N, op, "slots");
  expect_numel(pos, N, op, "pos");
  if (N > std::numeric_limits<int32_t>::max()) fail("cuda ring_write: {} rows", N);
  check(cuda::launch_ring_write(ring_kv.as<uint16_t>(), ring_pos.as<int32_t>(), S, W, d,
                                kv.as<const uint16_t>(), slots.as<const int32_t>(), pos.as<const int32_t>(),
                                N, cur_),
        op);
}

void CudaBackend::ring_clear(const Tensor& ring_pos, int64_t slot) {
  const char* op = "ring_clear";
  expect_rank(ring_pos, 2, op, "ring_pos");
  expect_dtype(ring_pos, DType::i32, op, "ring_pos");
  if (slot < 0 || slot >= ring_pos.dim(0))
    fail("cuda ring_clear: slot {} out of range [0, {})", slot, ring_pos.dim(0));
  const int64_t W = ring_pos.dim(1);
  check(cuda::launch_fill_i32(ring_pos.as<int32_t>() + slot * W, W, -1, cur_), op);
}

// ---- attention

namespace {

// The checked kernel arguments of an attention op (no RoPE).
cuda::AttentionArgs attention_args(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                                   const Tensor& ring_pos, const Tensor& requests, const Tensor& sink,
                                   int64_t k, const Tensor& out, const char* op) {
  expect_rank(q, 3, op, "q");
  expect_rank(ring_kv, 3, op, "ring_kv");
  expect_rank(ring_pos, 2, op, "ring_pos");
  expect_dtype(ring_pos, DType::i32, op, "ring_pos");
  expect_dtype(sink, DType::f32, op, "sink");
  const int64_t T = q.dim(0), heads = q.dim(1), d = q.dim(2);
  if (k < 1 || T % k != 0) fail("cuda attention: {} rows are not requests of k = {}", T, k);
  const int64_t B = T / k, S = ring_kv.dim(0), W = ring_kv.dim(1);
  if (ring_kv.dim(2) != d || ring_pos.dim(0) != S || ring_pos.dim(1) != W)
    fail("cuda attention: ring_kv {} / ring_pos {} do not fit heads of {}", shape_str(ring_kv.shape),
         shape_str(ring_pos.shape), d);
  expect_numel(block_kv, T * d, op, "block_kv");
  expect_numel(sink, heads, op, "sink");
  expect_numel(out, T * heads * d, op, "out");
  request_rows_check(requests, B, op);
  if (B > kMaxGridYZ) fail("cuda attention: {} requests (at most {})", B, kMaxGridYZ);
  if (W + k > std::numeric_limits<int32_t>::max() / 2) fail("cuda attention: window {} too large", W);
  if (cuda::attention_smem_bytes(d, W, k) > 200 * 1024)
    fail("cuda attention: head dim {} and window {} need too much shared memory", d, W);
  cuda::AttentionArgs a{};
  a.q = q.data;
  a.q_t = elt(q, op, "q");
  a.block_kv = block_kv.data;
  a.block_kv_t = elt(block_kv, op, "block_kv");
  a.ring_kv = ring_kv.data;
  a.ring_kv_t = elt(ring_kv, op, "ring_kv");
  a.ring_pos = ring_pos.as<const int32_t>();
  a.requests = requests.as<const int32_t>();
  a.sink = sink.as<const float>();
  a.out = out.data;
  a.out_t = elt(out, op, "out");
  a.B = B;
  a.k = k;
  a.heads = heads;
  a.d = d;
  a.slots = S;
  a.W = W;
  a.scale = 1.0f / std::sqrt(static_cast<float>(d));
  return a;
}

}  // namespace

void CudaBackend::attention(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                            const Tensor& ring_pos, const Tensor& requests, const Tensor& sink, int64_t k,
                            const Tensor& out) {
  const char* op = "attention";
  cuda::AttentionArgs a = attention_args(q, block_kv, ring_kv, ring_pos, requests, sink, k, out, op);
  split_attention(a, op);
  check(cuda::launch_attention(a, cur_), op);
}

void CudaBackend::attention_inverse_rope(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                                         const Tensor& ring_pos, const Tensor& requests, const Tensor& sink,
                                         int64_t k, const Tensor& pos, int64_t rope_dim, double theta,
                                         const Tensor& out) {
  const char* op = "attention_inverse_rope";
  cuda::AttentionArgs a = attention_args(q, block_kv, ring_kv, ring_pos, requests, sink, k, out, op);
  expect_dtype(pos, DType::i32, op, "pos");
  if (pos.numel() < q.dim(0)) fail("cuda {}: {} positions for {} rows", op, pos.numel(), q.dim(0));
  cuda::check_rope_dim(rope_dim, a.d, op);
  a.rope_pos = pos.as<const int32_t>();
  a.rope_dim = rope_dim;
  a.freqs = cuda::rope_freqs(rope_dim, theta);
  split_attention(a, op);
  check(cuda::launch_attention(a, cur_), op);
}

// ---- mixture of experts

void CudaBackend::moe_route(const Tensor& x, const Tensor& gate, const Tensor& bias, const RouteParams& p,
                            const Tensor& ids, const Tensor& weights) {
  const char* op = "moe_route";
  expect_rank(gate, 2, op, "gate");
  const int64_t E = gate.dim(0), H = gate.dim(1);
  if (H < 1 || x.numel() % H != 0) fail("cuda moe_route: x {} is not rows of {}", shape_str(x.shape), H);
  const int64_t T = x.numel() / H;
  if (p.top_k < 1 || p.top_k > E || p.top_k > cuda::kMaxTopK)
    fail("cuda moe_route: top_k {} outside [1, min({}, {})]", p.top_k, E, cuda::kMaxTopK);
  if (E > cuda::kMaxExperts) fail("cuda moe_route: {} experts (at most {})", E, cuda::kMaxExperts);
  expect_dtype(bias, DType::f32, op, "bias");
  expect_numel(bias, E, op, "bias");
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(weights, DType::f32, op, "weights");
  expect_numel(ids, T * p.top_k, op, "ids");
  expect_numel(weights, T * p.top_k, op, "weights");
  float* scores = static_cast<float*>(scratch(static_cast<size_t>(T * E) * sizeof(float), op));
  check(cuda::launch_moe_route(x.data, elt(x, op, "x"), gate.data, elt(gate, op, "gate"),
                               bias.as<const float>(), T, E, H, p.top_k, p.route_scale, p.gate_temp,
                               p.normalize, scores, ids.as<int32_t>(), weights.as<float>(), cur_),
        op);
}

void CudaBackend::moe_shared_expert(const Tensor& x, const StageWeights& stage, float swiglu_limit,
                                    const Tensor& out) {
  const char* op = "moe_shared_expert";
  const int64_t T = rows_of(x, op), H = x.shape.back();
  if (T == 0) return;
  expect_dtype(out, DType::f32, op, "out");
  expect_numel(out, T * H, op, "out");
  const cuda::ExpertSet es = shared_set(stage, H, op);
  if (es.shared_tiles) expect_tiles_input(x, op);
  void* buf = scratch(cuda::moe_shared_scratch_bytes(T, es.I_shared), op);
  check(cuda::launch_moe_shared(x.data, elt(x, op, "x"), T, H, es, swiglu_limit, buf, out.as<float>(), cur_),
        op);
}

void CudaBackend::moe_routed_experts(const Tensor& x, const Tensor& ids, const Tensor& weights,
                                     const StageWeights& stage, float swiglu_limit, const Tensor& y) {
  const char* op = "moe_routed_experts";
  const int64_t T = rows_of(x, op), H = x.shape.back();
  if (T == 0) return;
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(weights, DType::f32, op, "weights");
  expect_dtype(y, DType::f32, op, "y");
  if (ids.numel() % T != 0) fail("cuda {}: ids {} are not {} rows", op, shape_str(ids.shape), T);
  const int64_t top_k = ids.numel() / T;
  if (top_k > cuda::kMaxTopK) fail("cuda {}: top_k {} over {}", op, top_k, cuda::kMaxTopK);
  expect_numel(weights, T * top_k, op, "weights");
  expect_numel(y, T * top_k * H, op, "y");
  const cuda::ExpertSet es = routed_set(stage, H, op);
  if (es.tiles) expect_tiles_input(x, op);
  void* buf = scratch(cuda::moe_routed_scratch_bytes(T, top_k, es.E, es.I), op);
  check(cuda::launch_moe_routed(x.data, elt(x, op, "x"), ids.as<const int32_t>(), weights.as<const float>(),
                                T, H, top_k, es, swiglu_limit, buf, y.as<float>(), cur_),
        op);
}

void CudaBackend::moe_combine(const Tensor& ids, const Tensor& y, const Tensor& shared, int64_t n_experts,
                              const Tensor& out) {
  const char* op = "moe_combine";
  expect_dtype(ids, DType::i32, op, "ids");
  for (const auto& [t, name] : {std::pair{&y, "y"}, {&shared, "shared"}, {&out, "out"}})
    expect_dtype(*t, DType::f32, op, name);
  const int64_t T = rows_of(out, op), H = out.shape.back();
  if (T == 0) return;
  if (ids.numel() % T != 0) fail("cuda moe_combine: ids {} are not {} rows", shape_str(ids.shape), T);
  const int64_t top_k = ids.numel() / T;
  if (top_k > cuda::kMaxTopK) fail("cuda moe_combine: top_k {} over {}", top_k, cuda::kMaxTopK);
  expect_numel(y, T * top_k * H, op, "y");
  expect_numel(shared, T * H, op, "shared");
  check(cuda::launch_moe_combine(ids.as<const int32_t>(), T, H, top_k, n_experts, y.as<const float>(),
                                 shared.as<const float>(), out.as<float>(), cur_),
        op);
}

// ---- Markov loop and confidence

void CudaBackend::markov_top2(const Tensor& logits, const Tensor& markov_head,
                              const Tensor& markov_head_tiles, const Tensor& markov_embed, const Tensor& prev,
                              const Tensor& requests, int64_t j, int64_t k, int64_t vocab_offset,
                              const Tensor& cand) {
  const char* op = "markov_top2";
  expect_rank(logits, 2, op, "logits");
  expect_rank(markov_head, 2, op, "markov_head");
  expect_rank(markov_embed, 2, op, "markov_embed");
  expect_dtype(logits, DType::f32, op, "logits");
  expect_dtype(prev, DType::i32, op, "prev");
  expect_dtype(cand, DType::i32, op, "cand");
  const int64_t Vr = logits.dim(1), R = markov_head.dim(1), B = prev.numel();
  if (markov_head.dim(0) != Vr || markov_embed.dim(1) != R)
    fail("cuda markov_top2: logits {}, markov_head {} and markov_embed {} disagree", shape_str(logits.shape),
         shape_str(markov_head.shape), shape_str(markov_embed.shape));
  if (k < 1 || j < 0 || j >= k) fail("cuda markov_top2: position {} outside [0, k = {})", j, k);
  if (logits.dim(0) < B * k)
    fail("cuda markov_top2: logits {} hold fewer than {} rows", shape_str(logits.shape), B * k);
  expect_numel(cand, B * 4, op, "cand");
  request_rows_check(requests, B, op);
  if (B > kMaxGridYZ) fail("cuda markov_top2: {} requests (at most {})", B, kMaxGridYZ);
  if (vocab_offset < 0 || vocab_offset + Vr > std::numeric_limits<int32_t>::max())
    fail("cuda markov_top2: vocabulary offset {} out of range", vocab_offset);
  if (cuda::markov_smem_bytes(B, R) > 200 * 1024)
    fail("cuda markov_top2: {} requests x Markov rank {} need {} bytes of shared memory (at most 200 KiB)", B,
         R, cuda::markov_smem_bytes(B, R));
  if (!markov_head_tiles.empty()) {
    expect_dtype(markov_head_tiles, DType::bf16, op, "markov_head_tiles");
    expect_numel(markov_head_tiles, markov_head.numel(), op, "markov_head_tiles");
  }
  const int64_t ntiles = (Vr + cuda::kMarkovTile - 1) / cuda::kMarkovTile;
  auto* partial = static_cast<Top2*>(
      scratch(static_cast<size_t>(std::max<int64_t>(B * ntiles, 1)) * sizeof(Top2), op));
  static_assert(sizeof(Top2) == sizeof(Top2));
  check(cuda::launch_markov_top2(
            logits.as<const float>(), Vr, markov_head.data, elt(markov_head, op, "markov_head"),
            markov_head_tiles.empty() ? nullptr : markov_head_tiles.data, R, markov_embed.data,
            elt(markov_embed, op, "markov_embed"), markov_embed.dim(0), prev.as<const int32_t>(),
            requests.as<const int32_t>(), B, j, k, vocab_offset, partial,
            reinterpret_cast<Top2*>(cand.as<int32_t>()), cur_),
        op);
}

void CudaBackend::markov_commit(const Tensor& cand, const Tensor& requests, int64_t j, const Tensor& prev,
                                const Tensor& ids, const Tensor& margin) {
  const char* op = "markov_commit";
  expect_dtype(cand, DType::i32, op, "cand");
  expect_dtype(prev, DType::i32, op, "prev");
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(margin, DType::f32, op, "margin");
  expect_rank(ids, 2, op, "ids");
  const int64_t B = prev.numel(), k = ids.dim(1);
  if (ids.dim(0) != B) fail("cuda markov_commit: ids {} for {} requests", shape_str(ids.shape), B);
  if (j < 0 || j >= k) fail("cuda markov_commit: position {} outside [0, k = {})", j, k);
  expect_numel(cand, B * 4, op, "cand");
  expect_numel(margin, B * k, op, "margin");
  request_rows_check(requests, B, op);
  check(cuda::launch_markov_commit(reinterpret_cast<const Top2*>(cand.as<const int32_t>()),
                                   requests.as<const int32_t>(), B, j, k, prev.as<int32_t>(),
                                   ids.as<int32_t>(), margin.as<float>(), cur_),
        op);
}

void CudaBackend::markov_peer_commit(const PeerBuffer& cand, const Tensor& requests, int64_t j,
                                     const Tensor& prev, const Tensor& ids, const Tensor& margin) {
  const char* op = "markov_peer_commit";
  if (cand.empty()) fail("cuda {}: no peer records", op);
  expect_dtype(cand.mine, DType::i32, op, "cand");
  expect_dtype(prev, DType::i32, op, "prev");
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(margin, DType::f32, op, "margin");
  expect_rank(ids, 2, op, "ids");
  const int64_t B = prev.numel(), k = ids.dim(1);
  if (ids.dim(0) != B) fail("cuda {}: ids {} for {} requests", op, shape_str(ids.shape), B);
  if (j < 0 || j >= k) fail("cuda {}: position {} outside [0, k = {})", op, j, k);
  if (cand.mine.numel() < B * 4)
    fail("cuda {}: {} requests against records {}", op, B, shape_str(cand.mine.shape));
  expect_numel(margin, B * k, op, "margin");
  request_rows_check(requests, B, op);
  check(cuda::launch_markov_peer_commit(reinterpret_cast<const Top2*>(cand.mine.as<const int32_t>()),
                                        static_cast<const Top2*>(cand.peer), cand.rank,
                                        cand.signal_peer, cand.flag, cand.arrivals,
                                        requests.as<const int32_t>(), B, j, k, prev.as<int32_t>(),
                                        ids.as<int32_t>(), margin.as<float>(), cur_),
        op);
}

void CudaBackend::confidence(const Tensor& h, const Tensor& markov_embed, const Tensor& proj,
                             const Tensor& anchor, const Tensor& ids, const Tensor& requests, int64_t k,
                             const Tensor& conf, const Tensor& conf_logit) {
  const char* op = "confidence";
  expect_rank(h, 2, op, "h");
  expect_rank(markov_embed, 2, op, "markov_embed");
  expect_dtype(anchor, DType::i32, op, "anchor");
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(conf, DType::f32, op, "conf");
  expect_dtype(conf_logit, DType::f32, op, "conf_logit");
  const int64_t H = h.dim(1), R = markov_embed.dim(1), B = anchor.numel();
  if (k < 1) fail("cuda confidence: k = {}", k);
  if (h.dim(0) < B * k) fail("cuda confidence: h {} holds fewer than {} rows", shape_str(h.shape), B * k);
  expect_numel(proj, H + R, op, "proj");
  expect_numel(ids, B * k, op, "ids");
  expect_numel(conf, B * k, op, "conf");
  expect_numel(conf_logit, B * k, op, "conf_logit");
  request_rows_check(requests, B, op);
  if (B > kMaxGridYZ) fail("cuda confidence: {} requests (at most {})", B, kMaxGridYZ);
  check(cuda::launch_confidence(h.data, elt(h, op, "h"), H, markov_embed.data,
                                elt(markov_embed, op, "markov_embed"), markov_embed.dim(0), R, proj.data,
                                elt(proj, op, "proj"), anchor.as<const int32_t>(), ids.as<const int32_t>(),
                                requests.as<const int32_t>(), B, k, conf.as<float>(), conf_logit.as<float>(),
                                cur_),
        op);
}

}  // namespace dspark
