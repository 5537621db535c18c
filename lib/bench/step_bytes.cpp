#include "lib/bench/step_bytes.hpp"

#include "lib/core/error.hpp"

namespace dspark::bench {
namespace {

uint64_t bytes(const Tensor& t) {
  return t.nbytes();
}
uint64_t bytes(const LinearWeight& w) {
  return linear_bytes(w);
}
// What a product of `rows` rows reads of w: an fp8 block weight's bf16 copy where the backend reads that.
uint64_t product_bytes(const LinearWeight& w, int64_t rows) {
  return w.format == WeightFormat::fp8_block && !w.dequantised.empty() && rows >= kDequantisedMinRows
             ? bytes(w.dequantised)
             : bytes(w);
}
uint64_t bytes(const ExpertWeights& e) {
  return bytes(e.w1) + bytes(e.w3) + bytes(e.w2);
}
uint64_t bytes(const HcMixWeights& m) {
  return bytes(m.fn) + bytes(m.base) + bytes(m.scale);
}
uint64_t row_bytes(const Tensor& t) {
  return t.shape.empty() || t.dim(0) == 0 ? 0 : t.nbytes() / static_cast<uint64_t>(t.dim(0));
}

}  // namespace

StepBytes draft_step_bytes(const DrafterWeights& w, const DraftTouch& touch) {
  if (touch.experts.size() != w.stages.size())
    fail("draft_step_bytes: expert sets for {} stages, the model has {}", touch.experts.size(),
         w.stages.size());
  StepBytes b;
  for (size_t i = 0; i < w.stages.size(); ++i) {
    const StageWeights& s = w.stages[i];
    b.dense += bytes(s.attn_norm) + bytes(s.ffn_norm) + bytes(s.hc_attn) + bytes(s.hc_ffn);
    b.dense +=
        bytes(s.wq_a) + bytes(s.q_norm) + bytes(s.wq_b) + product_bytes(s.wkv, touch.rows) + bytes(s.kv_norm);
    b.dense += bytes(s.attn_sink) + bytes(s.wo_a) + bytes(s.wo_b);
    b.dense += bytes(s.gate) + bytes(s.gate_bias) + bytes(s.shared);
    for (int32_t e : touch.experts[i]) {
      if (e < 0 || static_cast<size_t>(e) >= s.experts.size())
        fail("draft_step_bytes: stage {} routed to expert {} of {}", i, e, s.experts.size());
      b.experts += bytes(s.experts[static_cast<size_t>(e)]);
    }
  }
  b.dense += bytes(w.final_norm);
  b.head = bytes(w.head) + bytes(w.confidence_proj);
  // A cached bias row: V_r f32, this rank's vocabulary shard.
  const uint64_t bias_row = w.markov_head.shape.empty() ? 0 : static_cast<uint64_t>(w.markov_head.dim(0)) * 4;
  b.markov = bytes(w.markov_head) * static_cast<uint64_t>(touch.markov_positions) +
             row_bytes(w.markov_embed) * static_cast<uint64_t>(touch.markov_embed_rows) +
             bias_row * static_cast<uint64_t>(touch.markov_cached_rows);
  b.embed = row_bytes(w.embed) * static_cast<uint64_t>(touch.embed_rows);
  return b;
}

StepBytes insert_bytes(const DrafterWeights& w, int64_t rows) {
  StepBytes b;
  b.dense = product_bytes(w.main_proj, rows) + bytes(w.main_norm);
  for (const StageWeights& s : w.stages) b.dense += product_bytes(s.wkv, rows) + bytes(s.kv_norm);
  return b;
}

}  // namespace dspark::bench
