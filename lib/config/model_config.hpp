// The drafter's model configuration, read from the checkpoint's config.json (SPEC §2).
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace dspark {

// Which of SPEC §2's two layouts a config.json had: the inference code's keys, or the released file's Hugging
// Face names nested in text_config.
enum class ConfigLayout { inference, release };

struct ModelConfig {
  int64_t dim = 5120;  // H
  int64_t n_heads = 64;
  int64_t head_dim = 512;      // d
  int64_t rope_head_dim = 64;  // r: the LAST r dims of each head
  int64_t q_lora_rank = 1280;
  int64_t o_groups = 8;
  int64_t o_lora_rank = 1024;
  int64_t window_size = 128;  // W
  double norm_eps = 1e-20;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 20;
  double hc_eps = 1e-6;
  double rope_theta = 10000.0;
  int64_t vocab_size = 129280;
  int64_t moe_inter_dim = 2304;     // I
  int64_t n_routed_experts = 128;   // dspark_n_routed_experts, falling back to n_routed_experts
  int64_t n_activated_experts = 3;  // dspark_n_activated_experts, falling back to n_activated_experts
  int64_t n_shared_experts = 1;
  std::string score_func = "sqrtsoftplus";  // only sqrtsoftplus is supported
  double route_scale = 1.5;
  double swiglu_limit = 10.0;
  bool norm_topk_prob = true;
  double gate_temp = 1.0;
  int64_t n_layers = 40;
  int64_t n_mtp_layers = 3;  // S, the drafter stages
  int64_t block_size = 5;    // dspark_block_size, k
  int64_t noise_token_id = 128799;
  std::vector<int64_t> target_layer_ids = {37, 38, 39};
  int64_t markov_rank = 256;       // R
  int64_t weight_block_size = 32;  // quantization_config.weight_block_size (fp8 blocks, kv QDQ block)
  std::string quant_method;        // quantization_config.quant_method, "" when absent
  std::string quant_fmt;           // quantization_config.fmt ("e4m3"), "" when absent
  std::string scale_fmt;  // quantization_config.scale_fmt (or top-level scale_fmt): "ue8m0", "" when absent
  // quant_method exl3 (exllamav3's conversions, SPEC §9): the codebook ("mcg", "mul1", "3inst"; "" = from the
  // tensors' markers), the default and head bits, and an optional bit table per role ("main_proj",
  // "attn.wq_a", "ffn.experts", ...) that the trellis shapes are checked against. 0 / empty when absent.
  struct Exl3 {
    std::string codebook;
    int64_t bits = 0, head_bits = 0;
    std::map<std::string, int64_t> role_bits;
    bool operator==(const Exl3&) const = default;
  } exl3;
  std::string dtype = "bf16";  // bf16 | fp8: the format of the non-expert linear weights
  std::string expert_dtype;  // routed experts' format when it differs (fp4 | fp8 | bf16), "" when null/absent
  ConfigLayout layout = ConfigLayout::inference;  // how the file spelled it (values are layout-independent)

  int64_t n_taps() const { return static_cast<int64_t>(target_layer_ids.size()); }
  int64_t row_dim() const { return n_taps() * dim; }              // context row width, 3H
  int64_t hc_mix_dim() const { return (2 + hc_mult) * hc_mult; }  // 24

  bool operator==(const ModelConfig&) const = default;
};

// Parses and validates either layout of SPEC §2. Errors name the key as the file spells it: wrong type, value
// out of range, inconsistent sizes (n_heads % o_groups, rope_head_dim > head_dim or odd, n_activated_experts
// > n_routed_experts, noise token >= vocab, ...). The inference layout is strict: a key that is neither read
// nor a known DeepSeek-V4 key is an error, and absent keys take the V4.1 defaults above. The released layout
// (text_config) ignores the target's keys (listed at debug level) and requires every key the drafter uses
// that SPEC §2 gives no default.
ModelConfig parse_model_config(const nlohmann::json& j, const std::string& source = "config.json");
ModelConfig load_model_config(const std::filesystem::path& path);
nlohmann::json model_config_to_json(const ModelConfig& c);  // the inference layout
// The released layout (SPEC §2): what `dspark_make_ckpt --config-layout release` writes.
nlohmann::json model_config_to_release_json(const ModelConfig& c);
// The tiny test config of SPEC §2 (H 256, 8 heads of 128, r 32, q_lora 128, 4 groups of 128, W 16, 8 experts
// top-2, I 512, vocab 1024, R 32, k 5, 3 stages, 3 taps).
ModelConfig tiny_model_config();

}  // namespace dspark
