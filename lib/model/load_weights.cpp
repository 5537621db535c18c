#include "model/load_weights.hpp"

#include <map>
#include <string_view>
#include <vector>

#include "checkpoint/tensor_table.hpp"
#include "core/error.hpp"
#include "model/tensor_split.hpp"

namespace dspark {
namespace {

bool is_float_dense(DType t) {
  return t == DType::bf16 || t == DType::f16 || t == DType::f32;
}

// Existence, representation, shape and dtype of one table entry.
void check_tensor(const Checkpoint& ckpt, const DrafterTensor& t) {
  if (t.linear) {
    const WeightFormat f = detect_weight_format(ckpt, t.name);
    if (f != WeightFormat::dense) {
      const TensorInfo* info = ckpt.find(t.name + (f == WeightFormat::exl3 ? ".trellis" : ".weight"));
      fail("tensor '{}' in {}: {} weights are not supported yet (dense bf16/f16/f32 only)", t.name,
           info ? info->file.string() : ckpt.dir().string(), weight_format_name(f));
    }
  }
  const std::string name = t.weight_name();
  const TensorInfo* info = ckpt.find(name);
  if (!info) fail("checkpoint {}: tensor '{}' is missing", ckpt.dir().string(), name);
  if (info->shape != t.shape)
    fail("tensor '{}' in {}: shape {} but config.json implies {}", name, info->file.string(),
         shape_str(info->shape), shape_str(t.shape));
  const bool ok = t.linear ? is_float_dense(info->dtype) : info->dtype == t.dense_dtype;
  if (!ok)
    fail("tensor '{}' in {}: dtype {}, expected {}", name, info->file.string(), dtype_name(info->dtype),
         t.linear ? std::string_view("bf16, f16 or f32") : dtype_name(t.dense_dtype));
}

// Reads, for one tensor of the table, the part this rank owns (tensor_split) and uploads it.
class Loader {
 public:
  Loader(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan, Backend& backend,
         uint64_t& bytes)
      : ckpt_(ckpt), cfg_(cfg), plan_(plan), backend_(backend), bytes_(bytes) {}

  Tensor tensor(const DrafterTensor& t) {
    const TensorInfo& info = *ckpt_.find(t.weight_name());
    const TensorSplit split = tensor_split(t, cfg_, plan_);
    Shape shape = info.shape;
    if (split.kind == TensorSplit::Kind::cols)
      shape[1] = split.count;
    else
      shape[0] = split.count;
    Tensor dst = backend_.alloc(info.dtype, shape);
    std::vector<uint8_t> host(dst.nbytes());
    if (split.kind == TensorSplit::Kind::cols)
      ckpt_.read_cols(info.name, split.begin, split.count, host.data());
    else
      ckpt_.read_rows(info.name, split.begin, split.count, host.data());
    backend_.upload(dst, host.data());
    bytes_ += dst.nbytes();
    return dst;
  }

  LinearWeight linear(const DrafterTensor& t) {
    Tensor w = tensor(t);
    return LinearWeight{t.name, WeightFormat::dense, w.dim(0), w.dim(1), w};
  }

 private:
  const Checkpoint& ckpt_;
  const ModelConfig& cfg_;
  const ShardPlan& plan_;
  Backend& backend_;
  uint64_t& bytes_;
};

}  // namespace

WeightFormat detect_weight_format(const Checkpoint& ckpt, const std::string& base) {
  if (ckpt.has(base + ".trellis")) return WeightFormat::exl3;
  const TensorInfo* w = ckpt.find(base + ".weight");
  if (!w) fail("checkpoint {}: tensor '{}.weight' is missing", ckpt.dir().string(), base);
  if (ckpt.has(base + ".scale")) {
    if (w->dtype == DType::f8_e4m3) return WeightFormat::fp8_block;
    if (w->dtype == DType::i8 || w->dtype == DType::u8) return WeightFormat::fp4;
    fail("tensor '{}.weight' in {}: has a .scale but dtype {} is neither fp8 nor packed fp4", base,
         w->file.string(), dtype_name(w->dtype));
  }
  return WeightFormat::dense;
}

DrafterWeights load_drafter_weights(const Checkpoint& ckpt, const ModelConfig& cfg, const ShardPlan& plan,
                                    Backend& backend) {
  std::map<std::string, DrafterTensor> table;
  for (DrafterTensor& t : drafter_tensors(cfg)) {
    check_tensor(ckpt, t);  // the whole table before any data is read
    table.emplace(t.name, std::move(t));
  }
  DrafterWeights w;
  Loader load(ckpt, cfg, plan, backend, w.bytes);
  auto T = [&](const std::string& name) { return load.tensor(table.at(name)); };
  auto L = [&](const std::string& name) { return load.linear(table.at(name)); };
  auto mix = [&](const std::string& p, const char* half) {
    return HcMixWeights{T(fmt::format("{}hc_{}_fn", p, half)), T(fmt::format("{}hc_{}_base", p, half)),
                        T(fmt::format("{}hc_{}_scale", p, half))};
  };
  auto expert = [&](const std::string& x) { return ExpertWeights{L(x + "w1"), L(x + "w3"), L(x + "w2")}; };

  w.embed = T("embed.weight");
  w.head = load.linear(table.at("head.weight"));
  w.main_proj = L("mtp.0.main_proj");
  w.main_norm = T("mtp.0.main_norm.weight");
  for (int64_t i = 0; i < cfg.n_mtp_layers; ++i) {
    const std::string p = stage_prefix(i);
    StageWeights s;
    s.attn_norm = T(p + "attn_norm.weight");
    s.ffn_norm = T(p + "ffn_norm.weight");
    s.hc_attn = mix(p, "attn");
    s.hc_ffn = mix(p, "ffn");
    s.wq_a = L(p + "attn.wq_a");
    s.q_norm = T(p + "attn.q_norm.weight");
    s.wq_b = L(p + "attn.wq_b");
    s.wkv = L(p + "attn.wkv");
    s.kv_norm = T(p + "attn.kv_norm.weight");
    s.attn_sink = T(p + "attn.attn_sink");
    s.wo_a = L(p + "attn.wo_a");
    s.wo_b = L(p + "attn.wo_b");
    s.gate = T(p + "ffn.gate.weight");
    s.gate_bias = T(p + "ffn.gate.bias");
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e) s.experts.push_back(expert(expert_prefix(i, e)));
    s.shared = expert(shared_expert_prefix(i));
    w.stages.push_back(std::move(s));
  }
  const std::string last = stage_prefix(cfg.n_mtp_layers - 1);
  w.final_norm = T(last + "norm.weight");
  w.markov_embed = T(last + "markov_head.embed.weight");
  w.markov_head = T(last + "markov_head.head.weight");
  w.confidence_proj = T(last + "confidence_head.proj.weight");
  return w;
}

}  // namespace dspark
