// The Markov loop's ops (top-2, commit, the tp = 2 peer commit) and the confidence head of CudaBackend
// (kernels: markov.cu): shape / dtype checks, then launches.
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

void CudaBackend::markov_top2(const Tensor& logits, const Tensor& markov_head,
                              const Tensor& markov_head_tiles, const Tensor& markov_embed, const Tensor& prev,
                              const Tensor& requests, int64_t j, int64_t k, int64_t vocab_offset,
                              const MarkovCache& cache, const Tensor& cand) {
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
  auto* partial =
      static_cast<Top2*>(scratch(static_cast<size_t>(std::max<int64_t>(B * ntiles, 1)) * sizeof(Top2), op));
  static_assert(sizeof(Top2) == sizeof(Top2));
  check(cuda::launch_markov_top2(
            logits.as<const float>(), Vr, markov_head.data, elt(markov_head, op, "markov_head"),
            markov_head_tiles.empty() ? nullptr : markov_head_tiles.data, R, markov_embed.data,
            elt(markov_embed, op, "markov_embed"), markov_embed.dim(0), prev.as<const int32_t>(),
            requests.as<const int32_t>(), B, j, k, vocab_offset, view, partial,
            reinterpret_cast<Top2*>(cand.as<int32_t>()), cur_),
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

void CudaBackend::commit_top2(const Exchange& ex, const Tensor& requests, int64_t j, const Tensor& prev,
                              const Tensor& ids, const Tensor& margin) {
  const PeerView* peers = ex.peers();
  if (peers == nullptr) return Backend::commit_top2(ex, requests, j, prev, ids, margin);
  const char* op = "commit_top2";
  const Tensor& cand = ex.buffer();
  expect_dtype(cand, DType::i32, op, "cand");
  expect_dtype(prev, DType::i32, op, "prev");
  expect_dtype(ids, DType::i32, op, "ids");
  expect_dtype(margin, DType::f32, op, "margin");
  expect_rank(ids, 2, op, "ids");
  const int64_t B = prev.numel(), k = ids.dim(1);
  if (ids.dim(0) != B) fail("cuda {}: ids {} for {} requests", op, shape_str(ids.shape), B);
  if (j < 0 || j >= k) fail("cuda {}: position {} outside [0, k = {})", op, j, k);
  if (cand.numel() < B * 4) fail("cuda {}: {} requests against records {}", op, B, shape_str(cand.shape));
  expect_numel(margin, B * k, op, "margin");
  request_rows_check(requests, B, op);
  check(cuda::launch_markov_peer_commit(*peers, requests.as<const int32_t>(), B, j, k, prev.as<int32_t>(),
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
