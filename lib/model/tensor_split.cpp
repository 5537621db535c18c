#include "lib/model/tensor_split.hpp"

#include "lib/core/block_quant.hpp"

namespace dspark {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

TensorSplit rows(const Range& r) {
  return {TensorSplit::Kind::rows, r.begin, r.size()};
}
TensorSplit cols(const Range& r) {
  return {TensorSplit::Kind::cols, r.begin, r.size()};
}

}  // namespace

TensorSplit tensor_split(const DrafterTensor& t, const ModelConfig& cfg, const ShardPlan& plan) {
  const std::string& n = t.name;
  const int64_t d = cfg.head_dim, o_lora = cfg.o_lora_rank;
  if (ends_with(n, ".attn.wq_b")) return rows({plan.heads.begin * d, plan.heads.end * d});
  if (ends_with(n, ".attn.attn_sink")) return rows(plan.heads);
  if (ends_with(n, ".attn.wo_a")) return rows({plan.groups.begin * o_lora, plan.groups.end * o_lora});
  if (ends_with(n, ".attn.wo_b")) return cols({plan.groups.begin * o_lora, plan.groups.end * o_lora});
  const bool shared = n.find(".ffn.shared_experts.") != std::string::npos;
  if (shared || t.routed_expert) {
    const Range& r = shared ? plan.shared_inter : plan.inter;
    return ends_with(n, ".w2") ? cols(r) : rows(r);  // w1 / w3 output rows, w2 input columns
  }
  if (n == "head.weight" || ends_with(n, ".markov_head.head.weight")) return rows(plan.vocab);
  return {TensorSplit::Kind::replicated, 0, t.shape[0]};
}

int64_t split_numel(const DrafterTensor& t, const TensorSplit& s) {
  return split_numel(t.shape, s);
}

int64_t split_numel(const Shape& shape, const TensorSplit& s) {
  const int64_t total = shape_numel(shape);
  switch (s.kind) {
    case TensorSplit::Kind::replicated:
      return total;
    case TensorSplit::Kind::rows:
      return total / shape[0] * s.count;
    case TensorSplit::Kind::cols:
      return shape[0] * s.count;
  }
  return total;
}

TensorSplit stored_part_split(WeightFormat f, StoredPart part, const TensorSplit& s, int64_t block,
                              const Shape& part_shape) {
  if (s.kind == TensorSplit::Kind::replicated) return {s.kind, 0, part_shape.empty() ? 0 : part_shape[0]};
  const bool rows = s.kind == TensorSplit::Kind::rows;
  const int64_t end = s.begin + s.count;
  if (f == WeightFormat::fp8_block && part == StoredPart::scale)
    return {s.kind, s.begin / block, (end + block - 1) / block - s.begin / block};
  if (f == WeightFormat::fp4 && !rows) {
    const int64_t per = part == StoredPart::weight ? 2 : kFp4Block;
    return {s.kind, s.begin / per, s.count / per};
  }
  return s;
}

}  // namespace dspark
