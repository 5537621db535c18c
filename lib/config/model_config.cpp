#include "lib/config/model_config.hpp"

#include <spdlog/spdlog.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string_view>

#include "lib/config/release_config.hpp"
#include "lib/core/error.hpp"

namespace dspark {
namespace {

using nlohmann::json;

// Keys a real DeepSeek V3 / V3.2 / V4 config.json carries (the inference code's ModelArgs plus Hugging Face
// metadata) that the drafter does not read. They are accepted and ignored; any other key is an error, so a
// typo cannot silently fall back to a default. Keys that merely re-spell a field we DO read (HF's
// hidden_size, num_attention_heads, qk_rope_head_dim, sliding_window, rms_norm_eps, ...) are deliberately
// absent: a config written that way must fail loudly instead of taking the V4.1 default.
constexpr std::string_view kIgnoredKeys[] = {
    // Hugging Face / tooling metadata
    "_name_or_path",
    "architectures",
    "model_type",
    "torch_dtype",
    "transformers_version",
    "auto_map",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "tie_word_embeddings",
    "use_cache",
    "initializer_range",
    "attention_bias",
    "attention_dropout",
    "hidden_act",
    // V3 inference ModelArgs: serving limits, dense layers, node-limited routing, MLA, YaRN
    "max_batch_size",
    "max_seq_len",
    "inter_dim",
    "n_dense_layers",
    "n_expert_groups",
    "n_limited_groups",
    "kv_lora_rank",
    "qk_nope_head_dim",
    "v_head_dim",
    "original_seq_len",
    "rope_factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    // V3.2 sparse-attention indexer
    "index_n_heads",
    "index_head_dim",
    "index_topk",
    // V4 target-only features: compressed attention, hash-routed layers, scale storage
    "compress_ratios",
    "compress_rope_theta",
    "n_hash_layers",
    "num_hash_layers",
    "scale_dtype",
    "topk_method",
};

bool is_ignored(std::string_view key) {
  return std::find(std::begin(kIgnoredKeys), std::end(kIgnoredKeys), key) != std::end(kIgnoredKeys);
}

// Typed access to one JSON value; every error names the source file and the (dotted) key.
// `names` maps a key to the name the file spells it with, where that differs (the released layout).
class Reader {
 public:
  explicit Reader(const std::string& source, const std::map<std::string, std::string>* names = nullptr)
      : source_(source), names_(names) {}

  [[noreturn]] void bad(std::string_view key, std::string_view what) const {
    fail("{}: '{}' {}", source_, spelled(key), what);
  }
  std::string spelled(std::string_view key) const {
    if (names_ != nullptr)
      if (auto it = names_->find(std::string(key)); it != names_->end()) return it->second;
    return std::string(key);
  }

  int64_t integer(const json& v, std::string_view key) const {
    if (v.is_number_integer() && !v.is_number_unsigned()) return v.get<int64_t>();
    if (v.is_number_unsigned() && v.get<uint64_t>() <= uint64_t(std::numeric_limits<int64_t>::max()))
      return static_cast<int64_t>(v.get<uint64_t>());
    bad(key, fmt::format("must be an integer (got {})", v.dump()));
  }
  double number(const json& v, std::string_view key) const {
    if (!v.is_number()) bad(key, fmt::format("must be a number (got {})", v.dump()));
    return v.get<double>();
  }
  bool boolean(const json& v, std::string_view key) const {
    if (!v.is_boolean()) bad(key, fmt::format("must be a boolean (got {})", v.dump()));
    return v.get<bool>();
  }
  std::string string(const json& v, std::string_view key) const {
    if (!v.is_string()) bad(key, fmt::format("must be a string (got {})", v.dump()));
    return v.get<std::string>();
  }
  // A string, or null meaning "absent" ("").
  std::string string_or_null(const json& v, std::string_view key) const {
    if (v.is_null()) return {};
    if (!v.is_string()) bad(key, fmt::format("must be a string or null (got {})", v.dump()));
    return v.get<std::string>();
  }
  std::vector<int64_t> int_list(const json& v, std::string_view key) const {
    if (!v.is_array()) bad(key, fmt::format("must be an array of integers (got {})", v.dump()));
    std::vector<int64_t> out;
    for (size_t i = 0; i < v.size(); ++i) out.push_back(integer(v[i], fmt::format("{}[{}]", key, i)));
    return out;
  }

  const std::string& source() const { return source_; }

 private:
  const std::string& source_;
  const std::map<std::string, std::string>* names_;
};

void read_quantization_config(const Reader& r, const json& q, ModelConfig& c) {
  if (q.is_null()) return;
  if (!q.is_object()) r.bad("quantization_config", fmt::format("must be an object (got {})", q.dump()));
  for (const auto& [key, v] : q.items()) {
    const std::string k = "quantization_config." + key;
    if (key == "quant_method") {
      c.quant_method = r.string(v, k);
    } else if (key == "fmt") {
      c.quant_fmt = r.string(v, k);
    } else if (key == "scale_fmt") {
      c.scale_fmt = r.string_or_null(v, k);
    } else if (key == "weight_block_size") {
      // DeepSeek writes [b, b]; a single integer is accepted too. Only square blocks exist in the formats.
      if (v.is_array()) {
        const std::vector<int64_t> b = r.int_list(v, k);
        if (b.size() != 2 || b[0] != b[1])
          r.bad(k, fmt::format("must be [b, b] or an integer (got {})", v.dump()));
        c.weight_block_size = b[0];
      } else {
        c.weight_block_size = r.integer(v, k);
      }
    } else if (key == "expert_dtype") {
      c.expert_dtype = r.string_or_null(v, k);
    } else if (key == "codebook") {
      c.exl3.codebook = r.string(v, k);
    } else if (key == "bits") {
      c.exl3.bits = r.integer(v, k);
    } else if (key == "head_bits") {
      c.exl3.head_bits = r.integer(v, k);
    } else if (key == "exl3_bits") {
      if (!v.is_object()) r.bad(k, fmt::format("must be an object of role: bits (got {})", v.dump()));
      for (const auto& [role, bits] : v.items()) c.exl3.role_bits[role] = r.integer(bits, k + "." + role);
    } else if (key == "version" || key == "calibration" || key == "out_scales") {
      // exllamav3's conversion metadata: everything else of the format is read from the tensors.
    } else if (key == "activation_scheme" || key == "modules_to_not_convert") {
      // HF's fp8 metadata: activations are always quantised dynamically here.
    } else {
      fail("{}: unknown key '{}'", r.source(), k);
    }
  }
}

// Cross-key and range checks; each names the offending key.
void validate(const Reader& r, const ModelConfig& c) {
  auto positive = [&](std::string_view key, int64_t v) {
    if (v <= 0) r.bad(key, fmt::format("must be a positive integer (got {})", v));
  };
  positive("dim", c.dim);
  positive("n_heads", c.n_heads);
  positive("head_dim", c.head_dim);
  positive("rope_head_dim", c.rope_head_dim);
  positive("q_lora_rank", c.q_lora_rank);
  positive("o_groups", c.o_groups);
  positive("o_lora_rank", c.o_lora_rank);
  positive("window_size", c.window_size);
  positive("hc_mult", c.hc_mult);
  positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  positive("vocab_size", c.vocab_size);
  positive("moe_inter_dim", c.moe_inter_dim);
  positive("dspark_n_routed_experts", c.n_routed_experts);
  positive("dspark_n_activated_experts", c.n_activated_experts);
  positive("n_shared_experts", c.n_shared_experts);
  positive("n_layers", c.n_layers);
  positive("n_mtp_layers", c.n_mtp_layers);
  positive("dspark_block_size", c.block_size);
  positive("dspark_markov_rank", c.markov_rank);
  positive("quantization_config.weight_block_size", c.weight_block_size);
  // Upper bounds on every integer (ten or more times the released model's values): a larger one would hang a
  // step, size the worker's buffers absurdly, overflow a product of sizes, or wrap where it is narrowed (the
  // model description's uint32 fields, int32 token ids).
  auto at_most = [&](std::string_view key, int64_t v, int64_t hi) {
    if (v > hi) r.bad(key, fmt::format("must be at most {} (got {})", hi, v));
  };
  at_most("dim", c.dim, 65536);
  at_most("n_heads", c.n_heads, 1024);
  at_most("head_dim", c.head_dim, 8192);
  at_most("q_lora_rank", c.q_lora_rank, 65536);
  at_most("o_lora_rank", c.o_lora_rank, 65536);
  at_most("window_size", c.window_size, 65536);
  at_most("hc_mult", c.hc_mult, 16);
  at_most("hc_sinkhorn_iters", c.hc_sinkhorn_iters, 1000);
  at_most("vocab_size", c.vocab_size, INT32_MAX);
  at_most("moe_inter_dim", c.moe_inter_dim, 65536);
  at_most("dspark_n_routed_experts", c.n_routed_experts, 4096);
  at_most("n_shared_experts", c.n_shared_experts, 64);
  at_most("n_layers", c.n_layers, 65536);
  at_most("n_mtp_layers", c.n_mtp_layers, 64);
  at_most("dspark_block_size", c.block_size, 64);
  at_most("dspark_markov_rank", c.markov_rank, 65536);
  at_most("quantization_config.weight_block_size", c.weight_block_size, 4096);
  if (c.target_layer_ids.size() > 16)
    r.bad("dspark_target_layer_ids",
          fmt::format("must hold at most 16 layers (got {})", c.target_layer_ids.size()));

  if (c.rope_head_dim % 2 != 0) r.bad("rope_head_dim", fmt::format("must be even (got {})", c.rope_head_dim));
  if (c.rope_head_dim > c.head_dim)
    r.bad("rope_head_dim", fmt::format("must be <= head_dim {} (got {})", c.head_dim, c.rope_head_dim));
  if (c.n_heads % c.o_groups != 0)
    r.bad("o_groups", fmt::format("must divide n_heads {} (got {})", c.n_heads, c.o_groups));
  if (c.n_activated_experts > c.n_routed_experts)
    r.bad("dspark_n_activated_experts", fmt::format("must be <= the routed experts {} (got {})",
                                                    c.n_routed_experts, c.n_activated_experts));
  if (c.noise_token_id < 0 || c.noise_token_id >= c.vocab_size)
    r.bad("dspark_noise_token_id",
          fmt::format("must be in [0, vocab_size {}) (got {})", c.vocab_size, c.noise_token_id));
  if (c.target_layer_ids.empty()) r.bad("dspark_target_layer_ids", "must not be empty");
  std::set<int64_t> seen;
  for (size_t i = 0; i < c.target_layer_ids.size(); ++i) {
    const int64_t id = c.target_layer_ids[i];
    if (id < 0 || id >= c.n_layers)
      r.bad(fmt::format("dspark_target_layer_ids[{}]", i),
            fmt::format("must be a layer in [0, n_layers {}) (got {})", c.n_layers, id));
    if (!seen.insert(id).second)
      r.bad(fmt::format("dspark_target_layer_ids[{}]", i), fmt::format("repeats layer {}", id));
  }

  auto above_zero = [&](std::string_view key, double v) {
    if (!(v > 0) || !std::isfinite(v)) r.bad(key, fmt::format("must be a finite number > 0 (got {})", v));
  };
  above_zero("norm_eps", c.norm_eps);
  above_zero("hc_eps", c.hc_eps);
  above_zero("rope_theta", c.rope_theta);
  above_zero("route_scale", c.route_scale);
  above_zero("gate_temp", c.gate_temp);
  if (!(c.swiglu_limit >= 0) || !std::isfinite(c.swiglu_limit))
    r.bad("swiglu_limit", fmt::format("must be a finite number >= 0, 0 = no clamp (got {})", c.swiglu_limit));

  if (c.score_func != "sqrtsoftplus")
    r.bad("score_func", fmt::format("'{}' is not supported (only sqrtsoftplus)", c.score_func));
  if (c.dtype != "bf16" && c.dtype != "fp8")
    r.bad("dtype", fmt::format("must be bf16 or fp8 (got '{}')", c.dtype));
  if (!c.expert_dtype.empty() && c.expert_dtype != "fp4" && c.expert_dtype != "fp8" &&
      c.expert_dtype != "bf16")
    r.bad("expert_dtype", fmt::format("must be fp4, fp8, bf16 or null (got '{}')", c.expert_dtype));
  if (!c.quant_method.empty() && c.quant_method != "fp8" && c.quant_method != "exl3")
    r.bad("quantization_config.quant_method",
          fmt::format("'{}' is not supported (fp8 or exl3)", c.quant_method));
  const bool exl3 = c.quant_method == "exl3";
  if (!exl3 &&
      (!c.exl3.codebook.empty() || c.exl3.bits != 0 || c.exl3.head_bits != 0 || !c.exl3.role_bits.empty()))
    r.bad("quantization_config",
          "has EXL3 keys (codebook, bits, head_bits, exl3_bits) but quant_method is not exl3");
  if (!c.exl3.codebook.empty() && c.exl3.codebook != "mcg" && c.exl3.codebook != "mul1" &&
      c.exl3.codebook != "3inst")
    r.bad("quantization_config.codebook",
          fmt::format("must be mcg, mul1 or 3inst (got '{}')", c.exl3.codebook));
  const auto bits_ok = [&](const std::string& key, int64_t b, bool optional) {
    if ((optional && b == 0) || (b >= 1 && b <= 8)) return;
    r.bad(key, fmt::format("must be 1 to 8 bits per weight (got {})", b));
  };
  bits_ok("quantization_config.bits", c.exl3.bits, true);
  bits_ok("quantization_config.head_bits", c.exl3.head_bits, true);
  for (const auto& [role, b] : c.exl3.role_bits) bits_ok("quantization_config.exl3_bits." + role, b, false);
  if (!c.quant_fmt.empty() && c.quant_fmt != "e4m3")
    r.bad("quantization_config.fmt", fmt::format("'{}' is not supported (only e4m3)", c.quant_fmt));
  if (!c.scale_fmt.empty() && c.scale_fmt != "ue8m0")
    r.bad("quantization_config.scale_fmt", fmt::format("'{}' is not supported (only ue8m0)", c.scale_fmt));
}

ModelConfig parse_inference_layout(const json& j, const std::string& source,
                                   const std::map<std::string, std::string>* names) {
  const Reader r(source, names);
  ModelConfig c;
  std::optional<int64_t> routed, activated, dspark_routed, dspark_activated;
  std::optional<std::string> top_scale_fmt;

  using Field = std::function<void(const json&, const std::string&)>;
  auto i64 = [&](int64_t& dst) -> Field {
    return [&](const json& v, const std::string& k) { dst = r.integer(v, k); };
  };
  auto f64 = [&](double& dst) -> Field {
    return [&](const json& v, const std::string& k) { dst = r.number(v, k); };
  };
  auto opt = [&](std::optional<int64_t>& dst) -> Field {
    return [&](const json& v, const std::string& k) { dst = r.integer(v, k); };
  };
  const std::map<std::string, Field, std::less<>> fields = {
      {"dim", i64(c.dim)},
      {"n_heads", i64(c.n_heads)},
      {"head_dim", i64(c.head_dim)},
      {"rope_head_dim", i64(c.rope_head_dim)},
      {"q_lora_rank", i64(c.q_lora_rank)},
      {"o_groups", i64(c.o_groups)},
      {"o_lora_rank", i64(c.o_lora_rank)},
      {"window_size", i64(c.window_size)},
      {"norm_eps", f64(c.norm_eps)},
      {"hc_mult", i64(c.hc_mult)},
      {"hc_sinkhorn_iters", i64(c.hc_sinkhorn_iters)},
      {"hc_eps", f64(c.hc_eps)},
      {"rope_theta", f64(c.rope_theta)},
      {"vocab_size", i64(c.vocab_size)},
      {"moe_inter_dim", i64(c.moe_inter_dim)},
      {"n_routed_experts", opt(routed)},
      {"n_activated_experts", opt(activated)},
      {"dspark_n_routed_experts", opt(dspark_routed)},
      {"dspark_n_activated_experts", opt(dspark_activated)},
      {"n_shared_experts", i64(c.n_shared_experts)},
      {"score_func", [&](const json& v, const std::string& k) { c.score_func = r.string(v, k); }},
      {"route_scale", f64(c.route_scale)},
      {"swiglu_limit", f64(c.swiglu_limit)},
      {"norm_topk_prob", [&](const json& v, const std::string& k) { c.norm_topk_prob = r.boolean(v, k); }},
      {"gate_temp", f64(c.gate_temp)},
      {"n_layers", i64(c.n_layers)},
      {"n_mtp_layers", i64(c.n_mtp_layers)},
      {"dspark_block_size", i64(c.block_size)},
      {"dspark_noise_token_id", i64(c.noise_token_id)},
      {"dspark_target_layer_ids",
       [&](const json& v, const std::string& k) { c.target_layer_ids = r.int_list(v, k); }},
      {"dspark_markov_rank", i64(c.markov_rank)},
      {"quantization_config", [&](const json& v, const std::string&) { read_quantization_config(r, v, c); }},
      {"dtype", [&](const json& v, const std::string& k) { c.dtype = r.string(v, k); }},
      {"expert_dtype", [&](const json& v, const std::string& k) { c.expert_dtype = r.string_or_null(v, k); }},
      {"scale_fmt", [&](const json& v, const std::string& k) { top_scale_fmt = r.string_or_null(v, k); }},
  };

  for (const auto& [key, v] : j.items()) {
    if (auto it = fields.find(key); it != fields.end()) {
      it->second(v, key);
    } else if (!is_ignored(key)) {
      fail("{}: unknown key '{}'", source, key);
    }
  }
  // The drafter's own expert counts win over the target's (SPEC §2).
  c.n_routed_experts = dspark_routed.value_or(routed.value_or(c.n_routed_experts));
  c.n_activated_experts = dspark_activated.value_or(activated.value_or(c.n_activated_experts));
  // V3.1-style top-level scale_fmt applies when quantization_config does not say.
  if (c.scale_fmt.empty() && top_scale_fmt) c.scale_fmt = *top_scale_fmt;

  validate(r, c);
  return c;
}

}  // namespace

ModelConfig parse_model_config(const json& j, const std::string& source) {
  if (!j.is_object()) fail("{}: must be a JSON object (got {})", source, j.type_name());
  if (!is_release_layout(j)) return parse_inference_layout(j, source, nullptr);
  const ReleaseTranslation t = translate_release_config(j, source);
  if (!t.ignored.empty())
    spdlog::debug("{}: the drafter does not use {} key(s) of the released config.json: {}", source,
                  t.ignored.size(), fmt::join(t.ignored, ", "));
  ModelConfig c = parse_inference_layout(t.inference, source, &t.names);
  c.layout = ConfigLayout::release;
  return c;
}

ModelConfig load_model_config(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path.string());
  json j;
  try {
    j = json::parse(in);
  } catch (const json::parse_error& e) {
    fail("{}: invalid JSON: {}", path.string(), e.what());
  }
  return parse_model_config(j, path.string());
}

json model_config_to_json(const ModelConfig& c) {
  json q = {{"weight_block_size", {c.weight_block_size, c.weight_block_size}}};
  if (!c.quant_method.empty()) q["quant_method"] = c.quant_method;
  if (!c.quant_fmt.empty()) q["fmt"] = c.quant_fmt;
  if (!c.scale_fmt.empty()) q["scale_fmt"] = c.scale_fmt;
  if (!c.exl3.codebook.empty()) q["codebook"] = c.exl3.codebook;
  if (c.exl3.bits != 0) q["bits"] = c.exl3.bits;
  if (c.exl3.head_bits != 0) q["head_bits"] = c.exl3.head_bits;
  if (!c.exl3.role_bits.empty()) q["exl3_bits"] = c.exl3.role_bits;
  return json{
      {"dim", c.dim},
      {"n_heads", c.n_heads},
      {"head_dim", c.head_dim},
      {"rope_head_dim", c.rope_head_dim},
      {"q_lora_rank", c.q_lora_rank},
      {"o_groups", c.o_groups},
      {"o_lora_rank", c.o_lora_rank},
      {"window_size", c.window_size},
      {"norm_eps", c.norm_eps},
      {"hc_mult", c.hc_mult},
      {"hc_sinkhorn_iters", c.hc_sinkhorn_iters},
      {"hc_eps", c.hc_eps},
      {"rope_theta", c.rope_theta},
      {"vocab_size", c.vocab_size},
      {"moe_inter_dim", c.moe_inter_dim},
      {"n_routed_experts", c.n_routed_experts},
      {"n_activated_experts", c.n_activated_experts},
      {"dspark_n_routed_experts", c.n_routed_experts},
      {"dspark_n_activated_experts", c.n_activated_experts},
      {"n_shared_experts", c.n_shared_experts},
      {"score_func", c.score_func},
      {"route_scale", c.route_scale},
      {"swiglu_limit", c.swiglu_limit},
      {"norm_topk_prob", c.norm_topk_prob},
      {"gate_temp", c.gate_temp},
      {"n_layers", c.n_layers},
      {"n_mtp_layers", c.n_mtp_layers},
      {"dspark_block_size", c.block_size},
      {"dspark_noise_token_id", c.noise_token_id},
      {"dspark_target_layer_ids", c.target_layer_ids},
      {"dspark_markov_rank", c.markov_rank},
      {"dtype", c.dtype},
      {"expert_dtype", c.expert_dtype.empty() ? json(nullptr) : json(c.expert_dtype)},
      {"quantization_config", q},
  };
}

json model_config_to_release_json(const ModelConfig& c) {
  return release_from_inference(model_config_to_json(c));
}

ModelConfig tiny_model_config() {
  ModelConfig c;
  c.dim = 256;
  c.n_heads = 8;
  c.head_dim = 128;
  c.rope_head_dim = 32;
  c.q_lora_rank = 128;
  c.o_groups = 4;
  c.o_lora_rank = 128;
  c.window_size = 16;
  c.vocab_size = 1024;
  c.moe_inter_dim = 512;
  c.n_routed_experts = 8;
  c.n_activated_experts = 2;
  c.n_layers = 4;
  c.n_mtp_layers = 3;
  c.block_size = 5;
  c.noise_token_id = 1000;
  c.target_layer_ids = {1, 2, 3};
  c.markov_rank = 32;
  c.weight_block_size = 32;
  c.quant_method = "fp8";
  c.quant_fmt = "e4m3";
  c.scale_fmt = "ue8m0";
  c.dtype = "bf16";
  return c;
}

}  // namespace dspark
