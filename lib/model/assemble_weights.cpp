#include "lib/model/assemble_weights.hpp"

#include <fmt/format.h>

#include <map>
#include <string>

namespace dspark {

DrafterWeights assemble_drafter_weights(const ModelConfig& cfg, const TensorSource& part) {
  return assemble_drafter_weights(cfg, part,
                                  [&](const DrafterTensor& t) { return dense_linear(t.name, part(t)); });
}

DrafterWeights assemble_drafter_weights(const ModelConfig& cfg, const TensorSource& part,
                                        const LinearSource& linear, const LinearSource& head) {
  std::map<std::string, DrafterTensor> table;
  for (DrafterTensor& t : drafter_tensors(cfg)) table.emplace(t.name, std::move(t));
  DrafterWeights w;
  auto T = [&](const std::string& name) {
    Tensor t = part(table.at(name));
    w.bytes += t.nbytes();
    return t;
  };
  auto L = [&](const std::string& name) {
    LinearWeight l = linear(table.at(name));
    w.bytes += linear_bytes(l);
    return l;
  };
  auto mix = [&](const std::string& p, const char* half) {
    return HcMixWeights{T(fmt::format("{}hc_{}_fn", p, half)), T(fmt::format("{}hc_{}_base", p, half)),
                        T(fmt::format("{}hc_{}_scale", p, half))};
  };
  auto expert = [&](const std::string& x) { return ExpertWeights{L(x + "w1"), L(x + "w3"), L(x + "w2")}; };

  w.embed = T("embed.weight");
  if (head) {
    w.head = head(table.at("head.weight"));
    w.bytes += linear_bytes(w.head);
  } else {
    w.head = dense_linear("head.weight", T("head.weight"));
  }
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
