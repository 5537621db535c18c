#include "model/load_weights.hpp"

#include <map>
#include <string_view>
#include <vector>

#include "checkpoint/tensor_table.hpp"
#include "core/error.hpp"

namespace dspark {
namespace {

const char* format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::dense:
      return "dense";
    case WeightFormat::fp8_block:
      return "fp8 block";
    case WeightFormat::fp4:
      return "fp4";
    case WeightFormat::exl3:
      return "EXL3";
  }
  return "?";
}

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
           info ? info->file.string() : ckpt.dir().string(), format_name(f));
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

// Reads, for one tensor of the table, the part this rank owns, and uploads it.
class Loader {
 public:
  Loader(const Checkpoint& ckpt, Backend& backend, uint64_t& bytes)
      : ckpt_(ckpt), backend_(backend), bytes_(bytes) {}

  // The whole tensor, checked against its table entry.
  Tensor whole(const DrafterTensor& t) { return rows(t, 0, t.shape[0]); }

  // Leading-dimension rows [r0, r0 + n).
  Tensor rows(const DrafterTensor& t, int64_t r0, int64_t n) {
    const TensorInfo& info = checked(t);
    Shape shape = info.shape;
    shape[0] = n;
    Tensor dst = backend_.alloc(info.dtype, shape);
    std::vector<uint8_t> host(dst.nbytes());
    ckpt_.read_rows(info.name, r0, n, host.data());
    return finish(dst, host);
  }

  // Columns [c0, c0 + n) of a 2-D tensor.
  Tensor cols(const DrafterTensor& t, int64_t c0, int64_t n) {
    const TensorInfo& info = checked(t);
    Tensor dst = backend_.alloc(info.dtype, {info.shape[0], n});
    std::vector<uint8_t> host(dst.nbytes());
    ckpt_.read_cols(info.name, c0, n, host.data());
    return finish(dst, host);
  }

  LinearWeight linear_rows(const DrafterTensor& t, int64_t r0, int64_t n) {
    LinearWeight w = header(t);
    w.weight = rows(t, r0, n);
    w.out = n;
    return w;
  }
  LinearWeight linear_cols(const DrafterTensor& t, int64_t c0, int64_t n) {
    LinearWeight w = header(t);
    w.weight = cols(t, c0, n);
    w.in = n;
    return w;
  }
  LinearWeight linear_whole(const DrafterTensor& t) { return linear_rows(t, 0, t.shape[0]); }

 private:
  LinearWeight header(const DrafterTensor& t) {
    return LinearWeight{t.name, WeightFormat::dense, t.shape[0], t.shape[1], {}};
  }

  const TensorInfo& checked(const DrafterTensor& t) {
    check_tensor(ckpt_, t);
    return *ckpt_.find(t.weight_name());
  }

  Tensor finish(const Tensor& dst, const std::vector<uint8_t>& host) {
    backend_.upload(dst, host.data());
    bytes_ += dst.nbytes();
    return dst;
  }

  const Checkpoint& ckpt_;
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
  Loader load(ckpt, backend, w.bytes);
  auto T = [&](const std::string& name) -> const DrafterTensor& { return table.at(name); };

  const int64_t d = cfg.head_dim, o_lora = cfg.o_lora_rank;
  w.embed = load.whole(T("embed.weight"));
  w.head = load.linear_rows(T("head.weight"), plan.vocab.begin, plan.vocab.size());
  w.main_proj = load.linear_whole(T("mtp.0.main_proj"));
  w.main_norm = load.whole(T("mtp.0.main_norm.weight"));
  for (int64_t i = 0; i < cfg.n_mtp_layers; ++i) {
    const std::string p = stage_prefix(i);
    StageWeights s;
    s.attn_norm = load.whole(T(p + "attn_norm.weight"));
    s.ffn_norm = load.whole(T(p + "ffn_norm.weight"));
    s.hc_attn = {load.whole(T(p + "hc_attn_fn")), load.whole(T(p + "hc_attn_base")),
                 load.whole(T(p + "hc_attn_scale"))};
    s.hc_ffn = {load.whole(T(p + "hc_ffn_fn")), load.whole(T(p + "hc_ffn_base")),
                load.whole(T(p + "hc_ffn_scale"))};
    s.wq_a = load.linear_whole(T(p + "attn.wq_a"));
    s.q_norm = load.whole(T(p + "attn.q_norm.weight"));
    s.wq_b = load.linear_rows(T(p + "attn.wq_b"), plan.heads.begin * d, plan.heads.size() * d);
    s.wkv = load.linear_whole(T(p + "attn.wkv"));
    s.kv_norm = load.whole(T(p + "attn.kv_norm.weight"));
    s.attn_sink = load.rows(T(p + "attn.attn_sink"), plan.heads.begin, plan.heads.size());
    s.wo_a = load.linear_rows(T(p + "attn.wo_a"), plan.groups.begin * o_lora, plan.groups.size() * o_lora);
    s.wo_b = load.linear_cols(T(p + "attn.wo_b"), plan.groups.begin * o_lora, plan.groups.size() * o_lora);
    s.gate = load.whole(T(p + "ffn.gate.weight"));
    s.gate_bias = load.whole(T(p + "ffn.gate.bias"));
    auto expert = [&](const std::string& x, const Range& r) {
      return ExpertWeights{load.linear_rows(T(x + "w1"), r.begin, r.size()),
                           load.linear_rows(T(x + "w3"), r.begin, r.size()),
                           load.linear_cols(T(x + "w2"), r.begin, r.size())};
    };
    for (int64_t e = 0; e < cfg.n_routed_experts; ++e)
      s.experts.push_back(expert(expert_prefix(i, e), plan.inter));
    s.shared = expert(shared_expert_prefix(i), plan.shared_inter);
    w.stages.push_back(std::move(s));
  }
  const std::string last = stage_prefix(cfg.n_mtp_layers - 1);
  w.final_norm = load.whole(T(last + "norm.weight"));
  w.markov_embed = load.whole(T(last + "markov_head.embed.weight"));
  w.markov_head = load.rows(T(last + "markov_head.head.weight"), plan.vocab.begin, plan.vocab.size());
  w.confidence_proj = load.whole(T(last + "confidence_head.proj.weight"));
  return w;
}

}  // namespace dspark
