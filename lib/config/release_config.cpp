#include "lib/config/release_config.hpp"

#include <set>
#include <string_view>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

using nlohmann::json;

struct KeyMap {
  std::string_view released;   // inside text_config
  std::string_view inference;  // parse_model_config's key
  bool required;               // false: SPEC §2 gives a default or a fallback
};

// SPEC §2's table. The expert counts are optional one by one: the drafter's own (dspark_*) win, the target's
// are the fallback, and parse_model_config requires neither (it falls back to the V4.1 values only in the
// inference layout: here at least one of each pair is required below).
constexpr KeyMap kTextKeys[] = {
    {"hidden_size", "dim", true},
    {"num_attention_heads", "n_heads", true},
    {"head_dim", "head_dim", true},
    {"qk_rope_head_dim", "rope_head_dim", true},
    {"q_lora_rank", "q_lora_rank", true},
    {"o_groups", "o_groups", true},
    {"o_lora_rank", "o_lora_rank", true},
    {"sliding_window", "window_size", true},
    {"rms_norm_eps", "norm_eps", true},
    {"hc_mult", "hc_mult", true},
    {"hc_sinkhorn_iters", "hc_sinkhorn_iters", true},
    {"hc_eps", "hc_eps", true},
    {"rope_theta", "rope_theta", true},
    {"vocab_size", "vocab_size", true},
    {"moe_intermediate_size", "moe_inter_dim", true},
    {"n_shared_experts", "n_shared_experts", true},
    {"scoring_func", "score_func", true},
    {"routed_scaling_factor", "route_scale", true},
    {"swiglu_limit", "swiglu_limit", true},
    {"norm_topk_prob", "norm_topk_prob", true},
    {"gate_temp", "gate_temp", false},
    {"num_hidden_layers", "n_layers", true},
    {"num_nextn_predict_layers", "n_mtp_layers", true},
    {"dspark_block_size", "dspark_block_size", true},
    {"dspark_noise_token_id", "dspark_noise_token_id", true},
    {"dspark_target_layer_ids", "dspark_target_layer_ids", true},
    {"dspark_markov_rank", "dspark_markov_rank", true},
    {"n_routed_experts", "n_routed_experts", false},
    {"dspark_n_routed_experts", "dspark_n_routed_experts", false},
    {"num_experts_per_tok", "n_activated_experts", false},
    {"dspark_num_experts_per_tok", "dspark_n_activated_experts", false},
};

bool contains(const json& obj, std::string_view key) {
  return obj.contains(std::string(key));
}

}  // namespace

bool is_release_layout(const json& j) {
  return j.is_object() && j.contains("text_config");
}

ReleaseTranslation translate_release_config(const json& j, const std::string& source) {
  const json& text = j.at("text_config");
  if (!text.is_object()) fail("{}: 'text_config' must be an object (got {})", source, text.dump());
  ReleaseTranslation t;
  t.inference = json::object();
  std::set<std::string> used;
  for (const KeyMap& k : kTextKeys) {
    const std::string released = "text_config." + std::string(k.released);
    if (!contains(text, k.released)) {
      if (k.required) fail("{}: '{}' is missing (the drafter needs it; SPEC §2)", source, released);
      continue;
    }
    t.inference[std::string(k.inference)] = text.at(std::string(k.released));
    t.names[std::string(k.inference)] = released;
    used.insert(std::string(k.released));
  }
  if (!contains(text, "dspark_n_routed_experts") && !contains(text, "n_routed_experts"))
    fail("{}: 'text_config.dspark_n_routed_experts' is missing, and so is its fallback n_routed_experts",
         source);
  if (!contains(text, "dspark_num_experts_per_tok") && !contains(text, "num_experts_per_tok"))
    fail(
        "{}: 'text_config.dspark_num_experts_per_tok' is missing, and so is its fallback num_experts_per_tok",
        source);
  // validate() names the drafter's expert counts by their dspark_* keys: point those at the key that gave
  // them.
  for (const auto& [mine, target] : {std::pair{"dspark_n_routed_experts", "n_routed_experts"},
                                     std::pair{"dspark_n_activated_experts", "n_activated_experts"}})
    if (!t.names.count(mine)) t.names[mine] = t.names.at(target);
  // The drafter's attention has one KV head shared by every query head (SPEC §3, wkv).
  if (contains(text, "num_key_value_heads")) {
    const json& kv = text.at("num_key_value_heads");
    if (!kv.is_number_integer() || kv.get<int64_t>() != 1)
      fail("{}: 'text_config.num_key_value_heads' must be 1, the drafter's one shared KV head (got {})",
           source, kv.dump());
    used.insert("num_key_value_heads");
  }
  for (const auto& [key, v] : text.items())
    if (!used.count(key)) t.ignored.push_back("text_config." + key);

  if (j.contains("expert_dtype") && j.contains("quantization_config") &&
      j.at("quantization_config").is_object() && j.at("quantization_config").contains("expert_dtype"))
    fail("{}: 'expert_dtype' is given both at the top level and in quantization_config", source);
  for (const auto& [key, v] : j.items()) {
    if (key == "text_config") continue;
    if (key == "quantization_config") {
      // expert_dtype may sit inside it or at the top level (SPEC §2); activation_scheme is checked because
      // the drafter always quantises activations dynamically.
      json q = v;
      if (q.is_object()) {
        if (q.contains("activation_scheme")) {
          const json& a = q.at("activation_scheme");
          if (!a.is_string() || a.get<std::string>() != "dynamic")
            fail("{}: 'quantization_config.activation_scheme' must be \"dynamic\" (got {})", source,
                 a.dump());
        }
        if (q.contains("expert_dtype")) {
          t.inference["expert_dtype"] = q.at("expert_dtype");
          t.names["expert_dtype"] = "quantization_config.expert_dtype";
          q.erase("expert_dtype");
        }
        // quant_method fp8 governs the attention, shared-expert and main_proj linears (SPEC §3).
        if (q.contains("quant_method") && q.at("quant_method").is_string()) {
          t.inference["dtype"] = q.at("quant_method").get<std::string>() == "fp8" ? "fp8" : "bf16";
          t.names["dtype"] = "quantization_config.quant_method";
        }
      }
      t.inference["quantization_config"] = q;
      continue;
    }
    if (key == "expert_dtype") {
      t.inference["expert_dtype"] = v;
      t.names["expert_dtype"] = "expert_dtype";
      continue;
    }
    t.ignored.push_back(
        key);  // metadata (architectures, model_type, token ids) or the target's (vision_config)
  }
  return t;
}

json release_from_inference(const json& inference) {
  json text = {{"model_type", "deepseek_v41_text"}, {"num_key_value_heads", 1}};
  for (const KeyMap& k : kTextKeys)
    if (inference.contains(std::string(k.inference)))
      text[std::string(k.released)] = inference.at(std::string(k.inference));
  json q = inference.value("quantization_config", json::object());
  q["activation_scheme"] = "dynamic";
  if (inference.value("dtype", std::string("bf16")) == "fp8")
    q["quant_method"] = "fp8";
  else
    q.erase("quant_method");
  const json expert = inference.value("expert_dtype", json(nullptr));
  if (!expert.is_null()) q["expert_dtype"] = expert;
  return json{{"architectures", {"DeepseekV41ForCausalLM"}},
              {"model_type", "deepseek_v41"},
              {"dtype", "bfloat16"},
              {"quantization_config", q},
              {"text_config", text}};
}

}  // namespace dspark
