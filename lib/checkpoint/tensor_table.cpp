#include "lib/checkpoint/tensor_table.hpp"

#include <fmt/format.h>

namespace dspark {

bool is_drafter_tensor(const std::string& name) {
  return name.starts_with("embed.") || name.starts_with("head.") || name.starts_with("mtp.");
}

std::string stage_prefix(int64_t stage) {
  return fmt::format("mtp.{}.", stage);
}
std::string expert_prefix(int64_t stage, int64_t e) {
  return fmt::format("mtp.{}.ffn.experts.{}.", stage, e);
}
std::string shared_expert_prefix(int64_t stage) {
  return fmt::format("mtp.{}.ffn.shared_experts.", stage);
}

std::string exl3_role(const std::string& base) {
  if (base == "head") return base;
  std::string r = base;
  if (r.rfind("mtp.", 0) == 0) r = r.substr(r.find('.', 4) + 1);  // past "mtp.<stage>."
  if (r.rfind("ffn.experts.", 0) == 0) return "ffn.experts";
  return r;
}

WeightFormat configured_format(const DrafterTensor& t, const ModelConfig& c) {
  if (!t.linear) return WeightFormat::dense;
  const std::string& d = t.routed_expert && !c.expert_dtype.empty() ? c.expert_dtype : c.dtype;
  if (d == "fp8") return WeightFormat::fp8_block;
  if (d == "fp4") return WeightFormat::fp4;
  return WeightFormat::dense;
}

std::vector<DrafterTensor> drafter_tensors(const ModelConfig& c) {
  const int64_t H = c.dim, V = c.vocab_size, d = c.head_dim, nh = c.n_heads, I = c.moe_inter_dim;
  const int64_t S = c.n_mtp_layers, E = c.n_routed_experts, R = c.markov_rank, mix = c.hc_mix_dim();
  std::vector<DrafterTensor> t;
  auto vec = [&](std::string name, int64_t n, DType dt = DType::bf16) {
    t.push_back({std::move(name), {n}, dt, false, false});
  };
  auto lin = [&](std::string name, int64_t out, int64_t in, bool routed = false) {
    t.push_back({std::move(name), {out, in}, DType::bf16, true, routed});
  };
  t.push_back({"embed.weight", {V, H}, DType::bf16, false, false});
  t.push_back({"head.weight", {V, H}, DType::bf16, false, false});
  for (int64_t i = 0; i < S; ++i) {
    const std::string p = stage_prefix(i);
    if (i == 0) {
      lin(p + "main_proj", H, c.row_dim());
      vec(p + "main_norm.weight", H);
    }
    vec(p + "attn_norm.weight", H);
    vec(p + "ffn_norm.weight", H);
    for (const char* half : {"attn", "ffn"}) {
      t.push_back({fmt::format("{}hc_{}_fn", p, half), {mix, c.hc_mult * H}, DType::f32, false, false});
      vec(fmt::format("{}hc_{}_base", p, half), mix, DType::f32);
      vec(fmt::format("{}hc_{}_scale", p, half), 3, DType::f32);
    }
    lin(p + "attn.wq_a", c.q_lora_rank, H);
    vec(p + "attn.q_norm.weight", c.q_lora_rank);
    lin(p + "attn.wq_b", nh * d, c.q_lora_rank);
    lin(p + "attn.wkv", d, H);
    vec(p + "attn.kv_norm.weight", d);
    vec(p + "attn.attn_sink", nh, DType::f32);
    lin(p + "attn.wo_a", c.o_groups * c.o_lora_rank, nh * d / c.o_groups);
    lin(p + "attn.wo_b", H, c.o_groups * c.o_lora_rank);
    t.push_back({p + "ffn.gate.weight", {E, H}, DType::bf16, false, false});
    vec(p + "ffn.gate.bias", E, DType::f32);
    for (int64_t e = 0; e < E; ++e) {
      const std::string x = expert_prefix(i, e);
      lin(x + "w1", I, H, true);
      lin(x + "w3", I, H, true);
      lin(x + "w2", H, I, true);
    }
    const std::string s = shared_expert_prefix(i);
    lin(s + "w1", I * c.n_shared_experts, H);
    lin(s + "w3", I * c.n_shared_experts, H);
    lin(s + "w2", H, I * c.n_shared_experts);
    if (i == S - 1) {
      vec(p + "norm.weight", H);
      t.push_back({p + "markov_head.embed.weight", {V, R}, DType::bf16, false, false});
      t.push_back({p + "markov_head.head.weight", {V, R}, DType::bf16, false, false});
      t.push_back({p + "confidence_head.proj.weight", {1, H + R}, DType::bf16, false, false});
    }
  }
  return t;
}

}  // namespace dspark
