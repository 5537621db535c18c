// The compute interface the drafter is written against. A backend owns memory (host for the CPU reference,
// device for CUDA) and implements the ops of SPEC §4 on Tensors in that memory. Shapes below: T rows
// (tokens), H hidden, hc stream copies, activations bf16 unless marked; every reduction accumulates in fp32.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>

#include "comm/exchange.hpp"
#include "lib/core/markov_record.hpp"
#include "lib/core/tensor.hpp"
#include "lib/model/weights.hpp"

namespace dspark {

// Per-request fields of a draft batch, as the kernels read them (i32 [B, 4]).
enum DraftRequestField : int64_t {
  kReqSlot = 0,
  kReqLow = 1,
  kReqAnchorPos = 2,
  kReqOutputs = 3,
  kReqFields = 4
};

// Per-request sampling fields of a draft batch (i32 [B, 4]; SPEC §4 "Sampled drafts"): the temperature's
// f32 bits (0: greedy), the seed's low and high words, and flags (kSampleWantsDistribution).
constexpr int64_t kSampleTemperature = 0, kSampleSeedLow = 1, kSampleSeedHigh = 2, kSampleFlags = 3;
constexpr int64_t kSampleFields = 4;
constexpr int32_t kSampleWantsDistribution = 1;  // the answer carries the whole q per position

// What the Markov loop writes at position j of each request (each [B, k]): the drafted token (i32), its
// margin (top1 - top2 of logits + bias, f32), its probability q(tok) under the draft distribution (f32; 1 for
// a greedy token), and the draw's merged normaliser (f32 [B, k, 2]: z_max, z_sum; 0, 0 for a greedy token),
// which draft_distribution reads.
struct MarkovOutputs {
  Tensor ids, margin, q, norm;
};

struct MixParams {
  float norm_eps;
  float hc_eps;
  int64_t sinkhorn_iters;
};

struct RouteParams {
  int64_t top_k;
  float route_scale;
  float gate_temp;
  bool normalize;
};

// The Markov bias cache (SPEC §4) as a rank holds it: the fp32 bias rows markov_head · markov_embed[t] of its
// vocabulary shard for a set of previous tokens (Backend::markov_bias_rows: the live bias's kernel and
// summation order), and the table a Markov position looks its previous token up in.
struct MarkovCache {
  Tensor rows;  // f32 [n, V_r]: row i is the bias of the i-th cached token
  Tensor slot;  // i32 [V]: the token's row in `rows`, or -1
  bool empty() const { return rows.empty(); }
};

// One stage's part of an insert (Backend::insert_kv_rows): its wkv and KV norm, its ring, and scratch for its
// KV rows before (kv) and after (kv_n) the norm, both [N, d].
struct InsertKvStage {
  const LinearWeight* wkv = nullptr;
  Tensor kv_norm, ring_kv, ring_pos, kv, kv_n;
};

struct KvRowParams {
  float eps = 0;
  int64_t rope_dim = 0;
  double theta = 0;
  int64_t block = 0;  // fp8 QDQ block
};

// An activation's SPEC §3 quantisation (per row, blocks of `block` elements) in the layout of the backend
// that allocated it (Backend::alloc_act_codes), for up to `rows` rows of `cols`. The op that produces the
// activation writes it beside the activation (rms_norm_coded, hc_collapse_norm_coded), and the products that
// quantise their input (fp8 block and fp4 weights of that block) read it instead of quantising the input
// again: the same bits, one pass fewer on the step's path. Empty: the backend keeps none, and each product
// quantises its own input.
struct ActCodes {
  Tensor data;
  int64_t rows = 0, cols = 0, block = 0;
  bool empty() const { return data.empty(); }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;
  // The weight formats its linear ops run (the loader refuses a checkpoint holding another, naming it).
  virtual bool supports_format(WeightFormat f) const { return f == WeightFormat::dense; }

  // ---- memory
  virtual Tensor alloc(DType dtype, const Shape& shape) = 0;
  virtual void upload(const Tensor& dst, const void* src) = 0;  // dst.nbytes() bytes from host
  virtual void download(void* dst, const Tensor& src) = 0;      // src.nbytes() bytes to host
  virtual void fill_i32(const Tensor& t, int32_t value) = 0;
  virtual void zero(const Tensor& t) = 0;
  virtual void synchronize() = 0;
  // Host memory that the backend's ops read and write directly (CUDA: page-locked and mapped; the CPU: a
  // plain alloc), zero-filled. A step's request data and answer pass through it inside the step itself, by
  // copy(), so that a recorded step needs no separate transfer: the host writes it before the step and reads
  // it after synchronize() or wait_for_word().
  virtual Tensor alloc_host(DType dtype, const Shape& shape) = 0;
  // dst = src, byte for byte (same byte size), as an op of the sequence: between device buffers and those of
  // alloc_host, recordable in a graph; for a step's requests and answer and an insert's staged rows. Into
  // alloc_host memory its last 4-byte word is written after the others are in place: a completion word for
  // wait_for_word.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  // Returns once `word` (one i32 of alloc_host memory: the last word of a copy() into it) holds `value`, i.e.
  // the ops issued before it have written it, without waiting for the rest of the sequence to retire.
  // Throws dspark::Error when they fail, or finish without writing it.
  virtual void wait_for_word(const Tensor& word, int32_t value) = 0;
  // Row r of dst [N, D] = the D elements at host address sources[r] (i64 [N]; 0: row r stays as it is), as an
  // op of the sequence, recordable: a replay reads what the addresses name when it runs. The rows must lie in
  // memory reads_in_place() accepts and stay unchanged until the op has run (synchronize(), or a wait on a
  // later op).
  virtual void gather_host_rows(const Tensor& sources, const Tensor& dst) = 0;
  // Whether the backend's ops read host memory at `p` where it lies: page-locked memory mapped at its host
  // address (CUDA), or any host memory on a backend that computes in it.
  virtual bool reads_in_place(const void* p) const = 0;

  // ---- weight layout (optional): rearranges weights into the layouts this backend's kernels read fastest,
  // once, before the first step (the Drafter calls it on the weights it owns). A rearranged weight gets a
  // buffer of its own and a LinearWeight::format that names its layout (or keeps its matrix and gains a copy
  // in LinearWeight::tiles); whoever else holds the old buffer keeps the row-major original. The CPU
  // reference reads the checkpoint's layout: nothing to do.
  virtual void prepare_weights(DrafterWeights& /*w*/) {}

  // Bytes in use on the device this backend computes on: the whole device's (every process on it, what its
  // operator sees there), or 0 for a backend that computes in host memory.
  virtual uint64_t device_memory_used() const { return 0; }

  // ---- graphs (optional): record the ops issued between begin_capture() and end_capture() without running
  // them; replay() runs the recording again on the same buffers. A backend without graphs runs eagerly.
  virtual bool supports_graphs() const { return false; }
  // (std::runtime_error, not dspark::fail: this header is also read by nvcc, where fmt's checks do not
  // compile.)
  virtual void begin_capture() { throw std::runtime_error(name() + " backend: no graph capture"); }
  // Ends the recording; an empty pointer when it failed (the backend is usable again either way).
  virtual std::shared_ptr<void> end_capture() { return {}; }
  virtual void replay(const std::shared_ptr<void>& /*graph*/) {
    throw std::runtime_error(name() + " backend: no graph replay");
  }

  // ---- side branches (optional): the ops issued between begin_side(lane) and end_side() may run
  // concurrently with the main sequence issued after them and with the other lane's work, until the next
  // join_side(), which joins both lanes. Side work starts after everything issued on the main sequence before
  // begin_side(), runs in issue order with earlier work of its lane, and must not use the communicator; the
  // caller keeps the sequences off each other's buffers. SideLane::step holds a draft step's short branches,
  // SideLane::insert a context insert that the draft issued after it runs beside. A backend without
  // concurrency (the CPU reference) runs everything in issue order: the results are the same either way.
  enum class SideLane { step, insert };
  virtual void begin_side(SideLane /*lane*/) {}
  virtual void end_side() {}
  virtual void join_side() {}

  // ---- activation codes (optional; see ActCodes): storage for the codes of up to `rows` rows of `cols`
  // quantised per `block`, or an empty ActCodes where this backend keeps none for that shape.
  virtual ActCodes alloc_act_codes(int64_t /*rows*/, int64_t /*cols*/, int64_t /*block*/) { return {}; }
  // rms_norm, writing out's codes into `codes` too (empty, or alloc_act_codes' for out's row length).
  virtual void rms_norm_coded(const Tensor& x, const Tensor& w, float eps, const Tensor& out,
                              const ActCodes& /*codes*/) {
    rms_norm(x, w, eps, out);
  }
  // hc_collapse_norm, writing normed's codes into `codes` too (as rms_norm_coded's).
  virtual void hc_collapse_norm_coded(const Tensor& X, const Tensor& pre, const Tensor& w, float eps,
                                      const Tensor& collapsed, const Tensor& normed,
                                      const ActCodes& /*codes*/) {
    hc_collapse_norm(X, pre, w, eps, collapsed, normed);
  }
  // linear of x, whose codes `codes` holds as x's producer wrote them (or empty): a product that quantises
  // its input with codes.block reads them instead (the same result).
  virtual void linear_coded(const Tensor& x, const ActCodes& /*codes*/, const LinearWeight& w,
                            const Tensor& out) {
    linear(x, w, out);
  }

  // ---- dense building blocks
  // out[t] = table[ids[t]]; ids i32 [T], table [V, H], out [T, H].
  virtual void embed(const Tensor& table, const Tensor& ids, const Tensor& out) = 0;
  // out = x W^T; x [T, in]; out [T, out] bf16 (rounded once) or f32 (a partial for the all-reduce).
  virtual void linear(const Tensor& x, const LinearWeight& w, const Tensor& out) = 0;
  // Block-diagonal linear: x [T, G * in_g], w [G * out_g, in_g]; group g maps x's g-th slice through w's g-th
  // rows.
  virtual void grouped_linear(const Tensor& x, const LinearWeight& w, int64_t groups, const Tensor& out) = 0;
  // out = w * x * rsqrt(mean(x^2) + eps) per row of [T, n].
  virtual void rms_norm(const Tensor& x, const Tensor& w, float eps, const Tensor& out) = 0;
  // In place on x [T, heads, d]: rotate the last rope_dim dims of every head by position pos[t] (i32 [T]);
  // inverse uses the conjugate.
  virtual void rope(const Tensor& x, const Tensor& pos, int64_t rope_dim, double theta, bool inverse) = 0;
  // In place on x [T, n]: fp8 e4m3 quantise/dequantise per `block` elements with power-of-two scales.
  virtual void kv_qdq(const Tensor& x, int64_t block) = 0;
  // The KV row's finishing steps, kv [N, d] (one head) -> out [N, d]: rms_norm with w, forward RoPE of the
  // last rope_dim dims at pos, fp8 QDQ per `block` elements, each step rounding to out's dtype. A backend may
  // fuse them (with the same result); the default runs the three ops.
  virtual void kv_norm_rope_qdq(const Tensor& kv, const Tensor& w, float eps, const Tensor& pos,
                                int64_t rope_dim, double theta, int64_t block, const Tensor& out) {
    rms_norm(kv, w, eps, out);
    rope(out.reshaped({out.dim(0), 1, out.numel() / out.dim(0)}), pos, rope_dim, theta, false);
    kv_qdq(out, block);
  }
  // dst = src converted (f32 -> bf16 rounding, bf16 -> f32).
  virtual void convert(const Tensor& src, const Tensor& dst) = 0;

  // ---- manifold hyper-connections (mHC), X [T, hc, H]
  // X[t, j] = x[t] for every copy j.
  virtual void hc_replicate(const Tensor& x, const Tensor& X) = 0;
  // pre/post [T, hc] f32, comb [T, hc, hc] f32 (row j = source copy, column l = destination copy).
  virtual void hc_mixes(const Tensor& X, const HcMixWeights& w, const MixParams& p, const Tensor& pre,
                        const Tensor& post, const Tensor& comb) = 0;
  // out[t] = sum_j pre[t, j] X[t, j].
  virtual void hc_collapse(const Tensor& X, const Tensor& pre, const Tensor& out) = 0;
  // hc_collapse into `collapsed`, then rms_norm of it with w into `normed`. A backend may fuse them (with the
  // same result); the default runs the two ops.
  virtual void hc_collapse_norm(const Tensor& X, const Tensor& pre, const Tensor& w, float eps,
                                const Tensor& collapsed, const Tensor& normed) {
    hc_collapse(X, pre, collapsed);
    rms_norm(collapsed, w, eps, normed);
  }
  // X[t, l] <- post[t, l] y[t] + sum_j comb[t, j, l] X[t, j].
  virtual void hc_expand(const Tensor& y, const Tensor& X, const Tensor& post, const Tensor& comb) = 0;

  // y = sum (f32 [T, H]) converted to y's dtype (the all-reduced partials' one rounding), then hc_expand(y,
  // X, post, comb). A backend may fuse them (with the same result); the default runs the two ops.
  virtual void convert_hc_expand(const Tensor& sum, const Tensor& y, const Tensor& X, const Tensor& post,
                                 const Tensor& comb) {
    convert(sum, y);
    hc_expand(y, X, post, comb);
  }

  // convert_hc_expand of the sum over the ranks of the exchange's partials (f32, the leading X.dim(0) rows
  // of ex.buffer(), complete on this rank when the op runs). The default all-reduces them, then converts and
  // expands; a backend may read the peers' partials inside the op where ex.peers() has them (the same bits).
  virtual void sum_and_expand(const Exchange& ex, const Tensor& y, const Tensor& X, const Tensor& post,
                              const Tensor& comb) {
    const Tensor partial = ex.buffer().rows(0, X.dim(0));
    ex.all_reduce_sum(partial);
    convert_hc_expand(partial, y, X, post, comb);
  }

  // ---- KV rings: ring_kv [slots, W, d] bf16, ring_pos [slots, W] i32 (-1 = empty)
  // Row n of kv goes to slot slots[n] at entry pos[n] mod W, in order (a later row wins); rows with slot -1
  // (the padding of an insert bucket) go nowhere.
  virtual void ring_write(const Tensor& ring_kv, const Tensor& ring_pos, const Tensor& kv,
                          const Tensor& slots, const Tensor& pos) = 0;
  virtual void ring_clear(const Tensor& ring_pos, int64_t slot) = 0;
  // An insert's KV rows for every stage: kv = x wkv^T, kv_n = kv_norm_rope_qdq(kv) at pos, ring_write(kv_n)
  // at slots / pos; x_codes: x's codes (linear_coded's), or empty. A backend may run the stages together with
  // the same result; the default runs them in turn.
  virtual void insert_kv_rows(const Tensor& x, const ActCodes& x_codes, std::span<const InsertKvStage> stages,
                              const Tensor& pos, const Tensor& slots, const KvRowParams& p) {
    for (const InsertKvStage& st : stages) {
      linear_coded(x, x_codes, *st.wkv, st.kv);
      kv_norm_rope_qdq(st.kv, st.kv_norm, p.eps, pos, p.rope_dim, p.theta, p.block, st.kv_n);
      ring_write(st.ring_kv, st.ring_pos, st.kv_n, slots, pos);
    }
  }

  // ---- attention of one stage for B requests of k block rows each (T = B k)
  // q [T, heads, d] (RoPE applied), block_kv [T, d], requests i32 [B, kReqFields], sink [heads] f32.
  // Keys of request b: its slot's ring entries with position in [low, P - 1], then its k block rows.
  // out [T, heads, d] = softmax-with-sink weighted sum of the keys (K = V).
  virtual void attention(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                         const Tensor& ring_pos, const Tensor& requests, const Tensor& sink, int64_t k,
                         const Tensor& out) = 0;

  // attention into out, then the inverse RoPE of out's last rope_dim dims of every head at pos (the block
  // rows' positions, i32 [T]). A backend may fuse them (with the same result); the default runs the two ops.
  virtual void attention_inverse_rope(const Tensor& q, const Tensor& block_kv, const Tensor& ring_kv,
                                      const Tensor& ring_pos, const Tensor& requests, const Tensor& sink,
                                      int64_t k, const Tensor& pos, int64_t rope_dim, double theta,
                                      const Tensor& out) {
    attention(q, block_kv, ring_kv, ring_pos, requests, sink, k, out);
    rope(out, pos, rope_dim, theta, true);
  }

  // ---- mixture of experts
  // ids i32 [T, top_k] in descending order of (score + bias), weights f32 [T, top_k].
  virtual void moe_route(const Tensor& x, const Tensor& gate, const Tensor& bias, const RouteParams& p,
                         const Tensor& ids, const Tensor& weights) = 0;
  // The experts' output is sum over routed choices of bf16(w2(bf16(w * h))) + bf16(w2(bf16(h_shared))), where
  // h = silu(min(w1 x, limit)) * clamp(w3 x, +-limit), over this rank's intermediate channels only (a
  // partial). Three ops, so that the shared expert, which needs no routing, may run on the side branch beside
  // moe_route and the routed experts:
  // x_codes (both): x's codes (linear_coded's), or empty.
  // out f32 [T, H] = bf16(w2(bf16(h_shared))) of each row of x [T, H].
  virtual void moe_shared_expert(const Tensor& x, const ActCodes& x_codes, const StageWeights& stage,
                                 float swiglu_limit, const Tensor& out) = 0;
  // y f32 [T, top_k, H]: y[t, c] = bf16(w2(bf16(weights[t, c] * h))) of expert ids[t, c] on row t. Choices
  // with an id outside [0, E) are left unwritten (moe_combine skips them).
  virtual void moe_routed_experts(const Tensor& x, const ActCodes& x_codes, const Tensor& ids,
                                  const Tensor& weights, const StageWeights& stage, float swiglu_limit,
                                  const Tensor& y) = 0;
  // out f32 [T, H]: row t's y[t, c] added in fp32 from 0 in ascending expert id (equal ids in choice order;
  // ids outside [0, n_experts) skipped), then shared[t].
  virtual void moe_combine(const Tensor& ids, const Tensor& y, const Tensor& shared, int64_t n_experts,
                           const Tensor& out) = 0;

  // ---- head, Markov loop, confidence
  // For request b at block row j (< its output count): logits [T, V_r] f32 plus the Markov bias
  // markov_head · markov_embed[prev[b]]; writes this rank's MarkovRecord (global ids = vocab_offset +
  // column) to cand [B] (as i32 [B, kMarkovRecordWords]): the top-2, and at temperature tau > 0 (sampling
  // [B, kSampleFields]; empty when every request of the batch is greedy, which a backend may run without the
  // draw's arithmetic) the draw over z = (logit + bias) / tau with the noise of (seed, anchor position + j,
  // id) and its normaliser. Requests with j >= outputs get markov_empty(). markov_head_tiles: empty, or
  // markov_head in bf16 mma tiles (DrafterWeights::markov_head_tiles), which a backend may read instead.
  // cache: empty, or the bias rows of some previous tokens (markov_bias_rows' bits): a request whose prev
  // has a row adds that row instead of computing the bias, and a position whose every request does reads no
  // markov_head.
  virtual void markov_top2(const Tensor& logits, const Tensor& markov_head, const Tensor& markov_head_tiles,
                           const Tensor& markov_embed, const Tensor& prev, const Tensor& requests,
                           const Tensor& sampling, int64_t j, int64_t k, int64_t vocab_offset,
                           const MarkovCache& cache, const Tensor& cand) = 0;
  // out f32 [n, V_r]: row i = markov_head · markov_embed[tokens[i]] (tokens i32 [n], each in [0, V)), with
  // the kernel and summation order of markov_top2's bias, so that a cached row gives the computed path's
  // bits.
  virtual void markov_bias_rows(const Tensor& markov_head, const Tensor& markov_head_tiles,
                                const Tensor& markov_embed, const Tensor& tokens, const Tensor& out) = 0;
  // After the exchange, for requests with j < outputs: out.ids[b, j] = drafted_token(cand[b]), out.margin
  // [b, j] = best - second, out.q[b, j] = drafted_probability(cand[b]), out.norm[b, j] = (z_max, z_sum) of a
  // draw (else 0, 0), prev[b] = the drafted token.
  virtual void markov_commit(const Tensor& cand, const Tensor& requests, int64_t j, const Tensor& prev,
                             const MarkovOutputs& out) = 0;
  // markov_commit of the ranks' records of the exchange merged (rank order, merge_markov; the leading
  // prev.numel() records of ex.buffer(), complete on this rank when the op runs). The default runs
  // argmax_exchange on them, then markov_commit; a backend may merge the peers' records inside the commit
  // where ex.peers() has them (the same bits).
  virtual void commit_markov(const Exchange& ex, const Tensor& requests, int64_t j, const Tensor& prev,
                             const MarkovOutputs& out) {
    const Tensor cand = ex.buffer().rows(0, prev.numel());
    ex.argmax_exchange(cand);
    markov_commit(cand, requests, j, prev, out);
  }
  // The draft distribution of sampled positions over this rank's vocabulary columns, for a host's exact
  // rejection sampling: out f32 [n, V], row i for block row t = rows[i] (request b = t / k, position t % k):
  // q_v = exp(z_v - z_max) / z_sum in columns v = vocab_offset + c (c < V_r), z_v = (logits[t, c] + bias[i,
  // c]) / tau_b, (z_max, z_sum) = norm[t] (markov_commit's); 0 in every other column, so that the ranks'
  // rows summed are the whole q. bias f32 [n, V_r]: markov_bias_rows of the position's previous token.
  virtual void draft_distribution(const Tensor& logits, const Tensor& bias, const Tensor& rows,
                                  const Tensor& sampling, const Tensor& norm, int64_t k, int64_t vocab_offset,
                                  const Tensor& out) = 0;
  // conf_logit[b, j] = proj · [h[b k + j] ; markov_embed[prev_j]] with prev_0 = anchor[b], prev_j = ids[b,
  // j-1]; conf = sigmoid(conf_logit); positions j >= outputs are 0. h [T, H], conf/conf_logit f32 [B, k].
  virtual void confidence(const Tensor& h, const Tensor& markov_embed, const Tensor& proj,
                          const Tensor& anchor, const Tensor& ids, const Tensor& requests, int64_t k,
                          const Tensor& conf, const Tensor& conf_logit) = 0;
};

}  // namespace dspark
