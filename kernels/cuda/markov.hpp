// The Markov head's per-position records (top-2 and sampled draw) and their commit, the draft distribution
// of a sampled position, and the confidence head (markov.cu); their CudaBackend
// ops are in markov_ops.cpp. Plain C++ (g++ and nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/launch_common.hpp"
#include "lib/core/markov_record.hpp"
#include "lib/core/peer_view.hpp"

namespace dspark::cuda {

constexpr int64_t kMarkovTile = 256;  // vocabulary columns per block of the top-2 pass
// Shared memory of a markov_top2 tile block: markov_embed[prev] of every request (fp32) + per-warp top-2s.
inline size_t markov_smem_bytes(int64_t B, int64_t R) {
  return static_cast<size_t>(B * R) * sizeof(float) + static_cast<size_t>(kWarps * B) * sizeof(MarkovRecord);
}
// The Markov bias cache (lib/model/markov_cache.hpp) as the kernels read it: rows f32 [n, Vr], slot i32 [V]
// (token -> row or -1); rows null: no cache.
struct MarkovCacheView {
  const float* rows;
  const int32_t* slot;
};
// draws: some request may draw (else the greedy kernels, which read no sampling field). partial scratch:
// B * ceil(Vr / kMarkovTile) MarkovRecord. head_tiles: nullptr, or markov_head in bf16 mma
// tiles (Vr % kMmaTileRows == 0), which the tensor-core kernel then reads instead (the same bits).
cudaError_t launch_markov_top2(const float* logits, int64_t Vr, const void* markov_head, Elt head_t,
                               const void* head_tiles, int64_t R, const void* markov_embed, Elt embed_t,
                               int64_t V, const int32_t* prev, const int32_t* requests,
                               const int32_t* sampling, int64_t B, int64_t j, int64_t k, int64_t vocab_offset,
                               MarkovCacheView cache, bool draws, MarkovRecord* partial, MarkovRecord* cand,
                               cudaStream_t s);
// out f32 [n, Vr]: the bias dots of tokens[0..n) (each in [0, V)) from the kernel launch_markov_top2 picks
// for the same weights, so a cached row has the computed path's bits. n at most kMarkovBiasRowsPerLaunch.
constexpr int64_t kMarkovBiasRowsPerLaunch = 32;
cudaError_t launch_markov_bias_rows(int64_t Vr, const void* markov_head, Elt head_t, const void* head_tiles,
                                    int64_t R, const void* markov_embed, Elt embed_t, int64_t V,
                                    const int32_t* tokens, int64_t n, float* out, cudaStream_t s);
// Where a commit writes (Backend::markov_commit's MarkovOutputs): prev [B], ids / margin / q [B, k], norm
// [B, k, 2].
struct MarkovOutputPtrs {
  int32_t* prev;
  int32_t* ids;
  float* margin;
  float* q;
  float* norm;
};
cudaError_t launch_markov_commit(const MarkovRecord* cand, const int32_t* requests, int64_t B, int64_t j,
                                 int64_t k, const MarkovOutputPtrs& out, cudaStream_t s);
// launch_markov_commit of every rank's records in peer memory (the [B] MarkovRecord buffers of `peers`)
// merged in rank order, in place of argmax_exchange, after the exchange's handshake
// (comm/peer_handshake.cuh).
cudaError_t launch_markov_peer_commit(const PeerView& peers, const int32_t* requests, int64_t B, int64_t j,
                                      int64_t k, const MarkovOutputPtrs& out, cudaStream_t s);
// Backend::draft_distribution: out f32 [n, V].
cudaError_t launch_draft_distribution(const float* logits, int64_t Vr, const float* bias, const int32_t* rows,
                                      int64_t n, const int32_t* sampling, const float* norm, int64_t k,
                                      int64_t vocab_offset, int64_t V, float* out, cudaStream_t s);
cudaError_t launch_confidence(const void* h, Elt h_t, int64_t H, const void* markov_embed, Elt embed_t,
                              int64_t V, int64_t R, const void* proj, Elt proj_t, const int32_t* anchor,
                              const int32_t* ids, const int32_t* requests, int64_t B, int64_t k, float* conf,
                              float* conf_logit, cudaStream_t s);

}  // namespace dspark::cuda
