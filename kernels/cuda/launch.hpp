// The CUDA kernels of the backend as plain C++ launch functions: raw device pointers, sizes and the stream.
// Included by the host wrappers (g++) and by the .cu files (nvcc); nothing here depends on fmt or on Tensor.
// Every launcher enqueues its kernels on `stream` and returns cudaGetLastError() (cudaSuccess when there was
// nothing to do); the host side turns an error into a dspark::Error that names the op. No launcher
// synchronises, allocates or copies from the host, so every op can be captured in a CUDA graph.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "core/top2.hpp"

namespace dspark::cuda {

// Float storage types an op may read or write (as dspark::DType bf16 / f16 / f32).
enum class Elt : int32_t { bf16 = 0, f16 = 1, f32 = 2 };

// Whether launches let a kernel overlap the tail of the one before it (programmatic dependent launch,
// sm_90+): on unless set_programmatic_launch(false), which CudaBackend calls with Tuning::pdl (process-wide:
// the last backend constructed decides). The results are the same bits either way.
bool programmatic_launch();
void set_programmatic_launch(bool on);

// Block sizes are constants (never derived from the GPU), so every rank reduces in the same order.
// Whether a pointer allows 16-byte vector loads (the kernels' fast paths and the tensor-core paths need it).
inline bool aligned16(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

// ---- memory / convert (memory.cu)
cudaError_t launch_fill_i32(int32_t* p, int64_t n, int32_t value, cudaStream_t s);
cudaError_t launch_copy(const void* src, void* dst, int64_t bytes, bool last_after_rest, cudaStream_t s);
cudaError_t launch_convert(const void* src, Elt src_t, void* dst, Elt dst_t, int64_t n, cudaStream_t s);
// out[t] = table[ids[t]]; an id outside [0, V) gives a zero row.
cudaError_t launch_embed(const void* table, Elt table_t, int64_t V, int64_t H, const int32_t* ids, int64_t T,
                         void* out, Elt out_t, cudaStream_t s);

// ---- dense fallback (dense.cu): y[t, o] = x[t, g in_g + i] . w[o, i], g = o / out_g; warp per output,
// fp32 accumulation. Used for weights cuBLAS does not take with bf16 activations (f16 / f32) and for
// activations that are not bf16.
cudaError_t launch_dense_gemv(const void* x, Elt x_t, int64_t x_stride, const void* w, Elt w_t, void* y,
                              Elt y_t, int64_t y_stride, int64_t rows, int64_t n_out, int64_t in_g,
                              int64_t out_g, cudaStream_t s);

// ---- norms, RoPE, fp8 QDQ (norm_rope.cu)
cudaError_t launch_rms_norm(const void* x, Elt x_t, const void* w, Elt w_t, float eps, void* out, Elt out_t,
                            int64_t rows, int64_t n, cudaStream_t s);
// The RoPE frequencies, computed on the host with the CPU reference's expression (bit-identical); passed
// by value so that a captured graph carries them.
constexpr int kMaxRopeHalf = 256;
struct RopeFreqs {
  float f[kMaxRopeHalf];
};
cudaError_t launch_rope(void* x, Elt x_t, const int32_t* pos, int64_t T, int64_t heads, int64_t d,
                        int64_t rope_dim, const RopeFreqs& freqs, bool inverse, cudaStream_t s);
cudaError_t launch_kv_qdq(void* x, Elt x_t, int64_t n, int64_t block, cudaStream_t s);
// rms_norm, forward rope and kv_qdq of N rows of d (one head) in one kernel, the same bits as the three in
// turn; needs d % block == 0 and kv_norm_rope_qdq_smem_bytes(d) <= 48 KiB (cudaErrorInvalidValue otherwise).
size_t kv_norm_rope_qdq_smem_bytes(int64_t d);
cudaError_t launch_kv_norm_rope_qdq(const void* x, Elt x_t, const void* w, Elt w_t, float eps,
                                    const int32_t* pos, int64_t N, int64_t d, int64_t rope_dim,
                                    const RopeFreqs& freqs, int64_t block, void* out, Elt out_t,
                                    cudaStream_t s);

// ---- manifold hyper-connections (mhc.cu); X [T, hc, H]
cudaError_t launch_hc_replicate(const void* x, Elt x_t, void* X, Elt X_t, int64_t T, int64_t hc, int64_t H,
                                cudaStream_t s);
constexpr int kMaxHc = 8;
cudaError_t launch_hc_mixes(const void* X, Elt X_t, int64_t T, int64_t hc, int64_t H, const float* fn,
                            const float* base, const float* scale, float norm_eps, float hc_eps,
                            int64_t sinkhorn_iters, float* pre, float* post, float* comb, cudaStream_t s);
cudaError_t launch_hc_collapse(const void* X, Elt X_t, const float* pre, void* out, Elt out_t, int64_t T,
                               int64_t hc, int64_t H, cudaStream_t s);
// y = sum rounded to y_t (stored), then launch_hc_expand with it, in one kernel (same bits).
cudaError_t launch_hc_expand_from_sum(const float* sum, void* y, Elt y_t, void* X, Elt X_t, const float* post,
                                      const float* comb, int64_t T, int64_t hc, int64_t H, cudaStream_t s);
// launch_hc_collapse, then launch_rms_norm of the collapsed rows with w into normed: one kernel for bf16 X
// and collapsed rows (H % 8 == 0, aligned), the two otherwise; the same bits either way.
cudaError_t launch_hc_collapse_norm(const void* X, Elt X_t, const float* pre, const void* w, Elt w_t,
                                    float eps, void* collapsed, Elt c_t, void* normed, Elt n_t, int64_t T,
                                    int64_t hc, int64_t H, cudaStream_t s);
cudaError_t launch_hc_expand(const void* y, Elt y_t, void* X, Elt X_t, const float* post, const float* comb,
                             int64_t T, int64_t hc, int64_t H, cudaStream_t s);
// launch_hc_expand_from_sum of mine + peer (rank order), the peer's partial and flag words mapped from the
// other GPU of a tp = 2 group (core/peer_buffer.hpp): waits for the peer's signal, sends its own.
cudaError_t launch_hc_expand_peer_sum(const float* mine, const float* peer, int rank, uint32_t* signal_peer,
                                      uint32_t* flag, uint32_t* arrivals, void* y, Elt y_t, void* X, Elt X_t,
                                      const float* post, const float* comb, int64_t T, int64_t hc, int64_t H,
                                      cudaStream_t s);

// ---- KV rings (ring.cu); 16-bit ring rows, positions i32
cudaError_t launch_ring_write(uint16_t* ring_kv, int32_t* ring_pos, int64_t slots, int64_t W, int64_t d,
                              const uint16_t* kv, const int32_t* row_slot, const int32_t* row_pos, int64_t N,
                              cudaStream_t s);

// ---- attention (attention.cu): one block per (head, request)
struct AttentionArgs {
  const void* q;
  Elt q_t;
  const void* block_kv;
  Elt block_kv_t;
  const void* ring_kv;
  Elt ring_kv_t;
  const int32_t* ring_pos;
  const int32_t* requests;  // [B, 4]
  const float* sink;        // [heads]
  void* out;
  Elt out_t;
  int64_t B, k, heads, d, slots, W;
  float scale;  // 1 / sqrt(d), computed on the host as the CPU does
  // Optional: the inverse RoPE of the output's last rope_dim dims at rope_pos[t] (nullptr: none), the same
  // bits as launch_rope(inverse) run afterwards.
  const int32_t* rope_pos;
  int64_t rope_dim;
  RopeFreqs freqs;
  int64_t query_group;  // queries per block: set by launch_attention
  // Key splits of the tensor-core kernel (attention_splits; 0 or 1: unsplit) and, when > 1, their device
  // scratch (attention_split_scratch_bytes, any contents) and heads * B counters (zero between launches).
  int64_t splits;
  float* split_partials;
  uint32_t* split_counters;
};
// Dynamic shared memory of one block (the host refuses shapes over what the GPU allows).
size_t attention_smem_bytes(int64_t d, int64_t W, int64_t k);
cudaError_t launch_attention(const AttentionArgs& a, cudaStream_t s);
// Flash-decoding on the tensor-core kernel: a small grid of (head, request) blocks splits each request's key
// blocks over `splits` blocks, and the last of them to finish merges the partials in split order. The count
// depends on the shape only (not on the GPU), so every rank and every GPU sums in the same order.
constexpr int64_t kMaxAttentionSplits = 16;
constexpr int64_t kAttentionSplitPairs = 1024;  // (head, request) counters a backend reserves per stream
// The splits launch_attention will take for `a` (1 off the tensor-core path or with more than
// kAttentionSplitPairs pairs), and the scratch they need.
int64_t attention_splits(const AttentionArgs& a);
size_t attention_split_scratch_bytes(const AttentionArgs& a, int64_t splits);
// Tests: force the split count of the tensor-core kernel (clamped to [1, kMaxAttentionSplits]; 0 =
// automatic).
void set_attention_splits_for_testing(int splits);

// ---- mixture of experts (moe_route.cu, moe_experts.cu)
cudaError_t launch_moe_route(const void* x, Elt x_t, const void* gate, Elt gate_t, const float* bias,
                             int64_t T, int64_t E, int64_t H, int64_t top_k, float route_scale,
                             float gate_temp, bool normalize, float* score_scratch /* [T, E] */, int32_t* ids,
                             float* weights, cudaStream_t s);

// Device pointers of every expert's matrices, passed by value as a kernel parameter (no device-side table
// to build or keep in sync; graph capture records the values).
constexpr int kMaxExperts = 256;
constexpr int kMaxTopK = 16;
struct ExpertSet {
  const void* w1[kMaxExperts];
  const void* w3[kMaxExperts];
  const void* w2[kMaxExperts];
  const void* shared_w1;
  const void* shared_w3;
  const void* shared_w2;
  Elt w1_t, w3_t, w2_t, shared_w1_t, shared_w3_t, shared_w2_t;
  int64_t E;          // routed experts
  int64_t I;          // routed intermediate channels (this rank's)
  int64_t I_shared;   // shared intermediate channels (this rank's)
  bool tiles;         // the routed matrices are in bf16 mma tiles (mma_tile.cuh), not row-major
  bool shared_tiles;  // the shared expert's are
};
// Units of a routed launch: the distinct routed experts the rows select (at most min(E, T top_k)).
inline int64_t moe_max_units(int64_t T, int64_t top_k, int64_t E) {
  return T * top_k < E ? T * top_k : E;
}
// Scratch of launch_moe_routed (the units, their (row, choice) pairs and h [T top_k, I]) and of
// launch_moe_shared (h [T, I_shared]).
size_t moe_routed_scratch_bytes(int64_t T, int64_t top_k, int64_t E, int64_t I);
size_t moe_shared_scratch_bytes(int64_t T, int64_t I_shared);
// y [T, top_k, H] f32: each row's choices' expert outputs; each selected expert's w1, w3 and w2 are read
// once per call (grouped by expert). Choices outside [0, E) are not written. w1 and w3 share an element type.
cudaError_t launch_moe_routed(const void* x, Elt x_t, const int32_t* ids, const float* weights, int64_t T,
                              int64_t H, int64_t top_k, const ExpertSet& experts, float swiglu_limit,
                              void* scratch, float* y, cudaStream_t s);
// out [T, H] f32: the shared expert's output of every row.
cudaError_t launch_moe_shared(const void* x, Elt x_t, int64_t T, int64_t H, const ExpertSet& experts,
                              float swiglu_limit, void* scratch, float* out, cudaStream_t s);
// dst = src [rows, cols] bf16 (row-major) rearranged into mma tiles (mma_tile.cuh): rows a multiple of
// kMmaTileRows, cols of kMmaTileCols, both buffers 16-byte aligned, not overlapping.
constexpr int64_t kMmaTileRows = 16, kMmaTileCols = 32;
// out [T, G out_g] = x [T, G K] W^T per group (W [G out_g, K] bf16 in mma tiles; group g's rows read x's
// columns [g K, g K + K)) for T <= kLinearTilesMaxRows: the few-row linear layers of a draft step. x bf16,
// 16-byte aligned; out bf16 or f32; out_g a multiple of 16, K of 32.
constexpr int64_t kLinearTilesMaxRows = 16;
cudaError_t launch_linear_tiles(const void* x, int64_t T, int64_t groups, const void* w_tiles, int64_t out_g,
                                int64_t K, void* out, Elt out_t, cudaStream_t s);
cudaError_t launch_pack_mma_tiles(const void* src, void* dst, int64_t rows, int64_t cols, cudaStream_t s);
// out [T, H] = each row's y in ascending expert id (ids outside [0, E) skipped), then shared, in fp32.
cudaError_t launch_moe_combine(const int32_t* ids, int64_t T, int64_t H, int64_t top_k, int64_t E,
                               const float* y, const float* shared, float* out, cudaStream_t s);

// ---- Markov head and confidence (markov.cu)
constexpr int64_t kMarkovTile = 256;  // vocabulary columns per block of the top-2 pass
// Shared memory of a markov_top2 tile block: markov_embed[prev] of every request (fp32) + per-warp top-2s.
inline size_t markov_smem_bytes(int64_t B, int64_t R) {
  return static_cast<size_t>(B * R) * sizeof(float) + static_cast<size_t>(kWarps * B) * sizeof(Top2);
}
// partial scratch: B * ceil(Vr / kMarkovTile) Top2. head_tiles: nullptr, or markov_head in bf16 mma tiles
// (Vr % kMmaTileRows == 0), which the tensor-core kernel then reads instead (the same bits).
cudaError_t launch_markov_top2(const float* logits, int64_t Vr, const void* markov_head, Elt head_t,
                               const void* head_tiles, int64_t R, const void* markov_embed, Elt embed_t,
                               int64_t V, const int32_t* prev, const int32_t* requests, int64_t B, int64_t j,
                               int64_t k, int64_t vocab_offset, Top2* partial, Top2* cand,
                               cudaStream_t s);
cudaError_t launch_markov_commit(const Top2* cand, const int32_t* requests, int64_t B, int64_t j,
                                 int64_t k, int32_t* prev, int32_t* ids, float* margin, cudaStream_t s);
// launch_markov_commit of this rank's records merged (rank order) with the peer's, read from the other GPU of
// a tp = 2 group (core/peer_buffer.hpp) in place of argmax_exchange: waits for the peer's signal, sends its
// own.
cudaError_t launch_markov_peer_commit(const Top2* mine, const Top2* peer, int rank,
                                      uint32_t* signal_peer, uint32_t* flag, uint32_t* arrivals,
                                      const int32_t* requests, int64_t B, int64_t j, int64_t k, int32_t* prev,
                                      int32_t* ids, float* margin, cudaStream_t s);
cudaError_t launch_confidence(const void* h, Elt h_t, int64_t H, const void* markov_embed, Elt embed_t,
                              int64_t V, int64_t R, const void* proj, Elt proj_t, const int32_t* anchor,
                              const int32_t* ids, const int32_t* requests, int64_t B, int64_t k, float* conf,
                              float* conf_logit, cudaStream_t s);

}  // namespace dspark::cuda
