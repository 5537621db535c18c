// The Markov loop's ops (records, commit, the peer commit), the draft distribution and the confidence head of
// CudaBackend (kernels: markov.cu): shape / dtype checks, then launches.
#include <algorithm>
#include <limits>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/cuda_ops_common.hpp"
#include "kernels/cuda/markov.hpp"

namespace dspark {

using cuda::check;
using cuda::elt;
using cuda::expect_dtype;
using cuda::expect_numel;
using cuda::expect_rank;
using cuda::kMaxGridYZ;
using cuda::request_rows_check;
using cuda::sampling_rows_check;

void CudaBackend::markov_top2(const Tensor& logits, const Tensor& markov_head,
                              const Tensor& markov_head_tiles, const Tensor& markov_embed, const Tensor& prev,
                              const Tensor& requests, const Tensor& sampling, int64_t j, int64_t k,
                              int64_t vocab_offset, const MarkovCache& cache, const Tensor& cand) {
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
  expect_numel(cand, B * kMarkovRecordWords, op, "cand");
  request_rows_check(requests, B, op);
  if (!sampling.empty()) sampling_rows_check(sampling, B, op);
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
  cuda::MarkovCacheView view{nullptr, nullptr};
  if (!cache.empty()) {
    expect_dtype(cache.rows, DType::f32, op, "cache rows");
    expect_dtype(cache.slot, DType::i32, op, "cache slot");
    expect_rank(cache.rows, 2, op, "cache rows");
    if (cache.rows.dim(1) != Vr || cache.slot.numel() != markov_embed.dim(0))
      fail("cuda markov_top2: cache rows {} and slot table {} do not fit V_r {} and V {}",
           shape_str(cache.rows.shape), shape_str(cache.slot.shape), Vr, markov_embed.dim(0));
    view = {cache.rows.as<const float>(), cache.slot.as<const int32_t>()};
  }
  const int64_t ntiles = (Vr + cuda::kMarkovTile - 1) / cuda::kMarkovTile;
  auto* partial = static_cast<MarkovRecord*>(
      scratch(static_cast<size_t>(std::max<int64_t>(B * ntiles, 1)) * sizeof(MarkovRecord), op));
  check(cuda::launch_markov_top2(
            logits.as<const float>(), Vr, markov_head.data, elt(markov_head, op, "markov_head"),
            markov_head_tiles.empty() ? nullptr : markov_head_tiles.data, R, markov_embed.data,
            elt(markov_embed, op, "markov_embed"), markov_embed.dim(0), prev.as<const int32_t>(),
            requests.as<const int32_t>(), sampling.empty() ? nullptr : sampling.as<const int32_t>(), B, j, k,
            vocab_offset, view, /*draws=*/!sampling.empty(), partial,
            reinterpret_cast<MarkovRecord*>(cand.as<int32_t>()), cur_),
        op);
}

void CudaBackend::markov_bias_rows(const Tensor& markov_head, const Tensor& markov_head_tiles,
                                   const Tensor& markov_embed, const Tensor& tokens, const Tensor& out) {
  const char* op = "markov_bias_rows";
  expect_rank(markov_head, 2, op, "markov_head");
  expect_rank(markov_embed, 2, op, "markov_embed");
  expect_dtype(tokens, DType::i32, op, "tokens");
  expect_dtype(out, DType::f32, op, "out");
  const int64_t Vr = markov_head.dim(0), R = markov_head.dim(1), n = tokens.numel();
  if (markov_embed.dim(1) != R)
    fail("cuda markov_bias_rows: markov_head {} and markov_embed {} disagree", shape_str(markov_head.shape),
         shape_str(markov_embed.shape));
  expect_numel(out, n * Vr, op, "out");
  if (!markov_head_tiles.empty())
    expect_numel(markov_head_tiles, markov_head.numel(), op, "markov_head_tiles");
  for (int64_t i0 = 0; i0 < n; i0 += cuda::kMarkovBiasRowsPerLaunch) {
    const int64_t m = std::min(n - i0, cuda::kMarkovBiasRowsPerLaunch);
    check(cuda::launch_markov_bias_rows(Vr, markov_head.data, elt(markov_head, op, "markov_head"),
                                        markov_head_tiles.empty() ? nullptr : markov_head_tiles.data, R,
                                        markov_embed.data, elt(markov_embed, op, "markov_embed"),
                                        markov_embed.dim(0), tokens.as<const int32_t>() + i0, m,
                                        out.as<float>() + i0 * Vr, cur_),
          op);
  }
}

namespace {

// The checks markov_commit and commit_markov share; the outputs' device pointers.
cuda::MarkovOutputPtrs commit_outputs(const char* op, const Tensor& requests, int64_t j, const Tensor& prev,
                                      const MarkovOutputs& out) {
  expect_dtype(prev, DType::i32, op, "prev");
  expect_dtype(out.ids, DType::i32, op, "ids");
  expect_dtype(out.margin, DType::f32, op, "margin");
  expect_dtype(out.q, DType::f32, op, "q");
  expect_dtype(out.norm, DType::f32, op, "norm");
  expect_rank(out.ids, 2, op, "ids");
  const int64_t B = prev.numel(), k = out.ids.dim(1);
  if (out.ids.dim(0) != B) fail("cuda {}: ids {} for {} requests", op, shape_str(out.ids.shape), B);
  if (j < 0 || j >= k) fail("cuda {}: position {} outside [0, k = {})", op, j, k);
  expect_numel(out.margin, B * k, op, "margin");
  expect_numel(out.q, B * k, op, "q");
  expect_numel(out.norm, B * k * 2, op, "norm");
  request_rows_check(requests, B, op);
  return {prev.as<int32_t>(), out.ids.as<int32_t>(), out.margin.as<float>(), out.q.as<float>(),
          out.norm.as<float>()};
}

}  // namespace

void CudaBackend::markov_commit(const Tensor& cand, const Tensor& requests, int64_t j, const Tensor& prev,
                                const MarkovOutputs& out) {
  const char* op = "markov_commit";
  const cuda::MarkovOutputPtrs ptrs = commit_outputs(op, requests, j, prev, out);
  expect_dtype(cand, DType::i32, op, "cand");
  const int64_t B = prev.numel();
  expect_numel(cand, B * kMarkovRecordWords, op, "cand");
  check(cuda::launch_markov_commit(reinterpret_cast<const MarkovRecord*>(cand.as<const int32_t>()),
                                   requests.as<const int32_t>(), B, j, out.ids.dim(1), ptrs, cur_),
        op);
}

void CudaBackend::commit_markov(const Exchange& ex, const Tensor& requests, int64_t j, const Tensor& prev,
                                const MarkovOutputs& out) {
  const PeerView* peers = ex.peers();
  if (peers == nullptr) return Backend::commit_markov(ex, requests, j, prev, out);
  const char* op = "commit_markov";
  const cuda::MarkovOutputPtrs ptrs = commit_outputs(op, requests, j, prev, out);
  const Tensor& cand = ex.buffer();
  expect_dtype(cand, DType::i32, op, "cand");
  const int64_t B = prev.numel();
  if (cand.numel() < B * kMarkovRecordWords)
    fail("cuda {}: {} requests against records {}", op, B, shape_str(cand.shape));
  check(
      cuda::launch_markov_peer_commit(*peers, requests.as<const int32_t>(), B, j, out.ids.dim(1), ptrs, cur_),
      op);
}

void CudaBackend::draft_distribution(const Tensor& logits, const Tensor& bias, const Tensor& rows,
                                     const Tensor& sampling, const Tensor& norm, int64_t k,
                                     int64_t vocab_offset, const Tensor& out) {
  const char* op = "draft_distribution";
  expect_rank(logits, 2, op, "logits");
  expect_rank(out, 2, op, "out");
  for (const auto& [t, name] :
       {std::pair{&logits, "logits"}, {&bias, "bias"}, {&norm, "norm"}, {&out, "out"}})
    expect_dtype(*t, DType::f32, op, name);
  expect_dtype(rows, DType::i32, op, "rows");
  expect_dtype(sampling, DType::i32, op, "sampling");
  const int64_t Vr = logits.dim(1), n = rows.numel(), V = out.dim(1);
  if (k < 1) fail("cuda draft_distribution: k = {}", k);
  expect_numel(bias, n * Vr, op, "bias");
  if (out.dim(0) != n) fail("cuda draft_distribution: out {} for {} rows", shape_str(out.shape), n);
  if (vocab_offset < 0 || vocab_offset + Vr > V)
    fail("cuda draft_distribution: columns [{}, {}) outside a vocabulary of {}", vocab_offset,
         vocab_offset + Vr, V);
  if (n > kMaxGridYZ) fail("cuda draft_distribution: {} rows (at most {})", n, kMaxGridYZ);
  // The rows' block rows are the host's: checked here, where a wrong one would read past the buffers.
  if (norm.numel() % (2 * k) != 0 || sampling.numel() != norm.numel() / (2 * k) * kSampleFields ||
      logits.dim(0) < norm.numel() / 2)
    fail("cuda draft_distribution: logits {}, sampling {} and norm {} disagree", shape_str(logits.shape),
         shape_str(sampling.shape), shape_str(norm.shape));
  check(cuda::launch_draft_distribution(logits.as<const float>(), Vr, bias.as<const float>(),
                                        rows.as<const int32_t>(), n, sampling.as<const int32_t>(),
                                        norm.as<const float>(), k, vocab_offset, V, out.as<float>(), cur_),
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
