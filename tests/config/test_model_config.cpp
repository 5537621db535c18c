// config.json parsing: the golden tiny config, V4.1 defaults, the expert-count fallback, and one test per
// error class checking that the message names the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/golden.hpp"

#include <unistd.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "lib/config/model_config.hpp"
#include "lib/core/error.hpp"

namespace dspark {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

// The message of the Error that parsing j throws ("" when it does not throw).
std::string parse_error(const json& j) {
  try {
    parse_model_config(j);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ModelConfig, GoldenConfigIsTheTinyConfig) {
  DSPARK_SKIP_WITHOUT_GOLDEN();
  const ModelConfig c = load_model_config(DSPARK_SHARED_DIR "/golden/tiny-v41/ckpt/config.json");
  const ModelConfig t = tiny_model_config();
  EXPECT_EQ(c.dim, 256);
  EXPECT_EQ(c.n_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.rope_head_dim, 32);
  EXPECT_EQ(c.q_lora_rank, 128);
  EXPECT_EQ(c.o_groups, 4);
  EXPECT_EQ(c.o_lora_rank, 128);
  EXPECT_EQ(c.window_size, 16);
  EXPECT_EQ(c.vocab_size, 1024);
  EXPECT_EQ(c.moe_inter_dim, 512);
  EXPECT_EQ(c.n_routed_experts, 8);
  EXPECT_EQ(c.n_activated_experts, 2);
  EXPECT_EQ(c.n_layers, 4);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.block_size, 5);
  EXPECT_EQ(c.noise_token_id, 1000);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(c.markov_rank, 32);
  EXPECT_EQ(c.weight_block_size, 32);
  EXPECT_EQ(c.quant_method, "fp8");
  EXPECT_EQ(c.scale_fmt, "ue8m0");
  EXPECT_EQ(c.expert_dtype, "");
  EXPECT_EQ(c.row_dim(), 768);
  EXPECT_EQ(c.hc_mix_dim(), 24);
  EXPECT_TRUE(c == t) << "tiny_model_config() differs from the golden config.json";
}

TEST(ModelConfig, AbsentKeysTakeV41Defaults) {
  const ModelConfig c = parse_model_config(json::object());
  EXPECT_TRUE(c == ModelConfig{});
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.n_routed_experts, 128);
  EXPECT_EQ(c.n_activated_experts, 3);
  EXPECT_EQ(c.noise_token_id, 128799);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int64_t>{37, 38, 39}));
  EXPECT_EQ(c.markov_rank, 256);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-20);
  EXPECT_EQ(c.score_func, "sqrtsoftplus");
}

TEST(ModelConfig, DsparkExpertCountsFallBackToTheTargets) {
  ModelConfig c = parse_model_config({{"n_routed_experts", 64}, {"n_activated_experts", 4}});
  EXPECT_EQ(c.n_routed_experts, 64);
  EXPECT_EQ(c.n_activated_experts, 4);
  c = parse_model_config({{"n_routed_experts", 256},
                          {"n_activated_experts", 6},
                          {"dspark_n_routed_experts", 16},
                          {"dspark_n_activated_experts", 2}});
  EXPECT_EQ(c.n_routed_experts, 16);
  EXPECT_EQ(c.n_activated_experts, 2);
}

TEST(ModelConfig, JsonRoundTrip) {
  ModelConfig odd = tiny_model_config();
  odd.expert_dtype = "fp4";
  odd.quant_method = "";
  odd.quant_fmt = "";
  odd.scale_fmt = "";
  odd.weight_block_size = 128;
  odd.norm_topk_prob = false;
  odd.norm_eps = 1e-6;
  for (const ModelConfig& c : {tiny_model_config(), ModelConfig{}, odd}) {
    EXPECT_TRUE(parse_model_config(model_config_to_json(c)) == c) << model_config_to_json(c).dump();
  }
}

TEST(ModelConfig, WeightBlockSizeAsPairOrInteger) {
  EXPECT_EQ(
      parse_model_config({{"quantization_config", {{"weight_block_size", {128, 128}}}}}).weight_block_size,
      128);
  EXPECT_EQ(parse_model_config({{"quantization_config", {{"weight_block_size", 64}}}}).weight_block_size, 64);
  EXPECT_THAT(parse_error({{"quantization_config", {{"weight_block_size", {32, 64}}}}}),
              HasSubstr("'quantization_config.weight_block_size' must be [b, b]"));
}

TEST(ModelConfig, KnownDeepSeekKeysAreIgnored) {
  const json j = {
      {"architectures", {"DeepseekV4ForCausalLM"}},
      {"model_type", "deepseek_v4"},
      {"torch_dtype", "bfloat16"},
      {"transformers_version", "4.57.0"},
      {"inter_dim", 18432},
      {"n_dense_layers", 0},
      {"max_seq_len", 1048576},
      {"rope_factor", 16},
      {"compress_ratios", {0, 4, 128}},
      {"index_topk", 512},
      {"num_hash_layers", 3},
      {"scale_fmt", "ue8m0"},
      {"quantization_config", {{"activation_scheme", "dynamic"}, {"weight_block_size", {32, 32}}}}};
  const ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.scale_fmt, "ue8m0");  // the top-level scale_fmt applies when quantization_config is silent
}

TEST(ModelConfig, UnknownKeysAreErrors) {
  EXPECT_THAT(parse_error({{"hidden_size", 5120}}), HasSubstr("config.json: unknown key 'hidden_size'"));
  EXPECT_THAT(parse_error({{"dimm", 5120}}), HasSubstr("unknown key 'dimm'"));
  EXPECT_THAT(parse_error({{"quantization_config", {{"block", 32}}}}),
              HasSubstr("unknown key 'quantization_config.block'"));
}

TEST(ModelConfig, WrongTypesNameKeyAndType) {
  EXPECT_THAT(parse_error({{"dim", "256"}}), HasSubstr("'dim' must be an integer"));
  EXPECT_THAT(parse_error({{"dim", 256.5}}), HasSubstr("'dim' must be an integer"));
  EXPECT_THAT(parse_error({{"norm_eps", "1e-20"}}), HasSubstr("'norm_eps' must be a number"));
  EXPECT_THAT(parse_error({{"norm_topk_prob", 1}}), HasSubstr("'norm_topk_prob' must be a boolean"));
  EXPECT_THAT(parse_error({{"score_func", 3}}), HasSubstr("'score_func' must be a string"));
  EXPECT_THAT(parse_error({{"q_lora_rank", nullptr}}), HasSubstr("'q_lora_rank' must be an integer"));
  EXPECT_THAT(parse_error({{"dspark_target_layer_ids", 37}}),
              HasSubstr("'dspark_target_layer_ids' must be an array of integers"));
  EXPECT_THAT(parse_error({{"dspark_target_layer_ids", {37, "x"}}}),
              HasSubstr("'dspark_target_layer_ids[1]' must be an integer"));
  EXPECT_THAT(parse_error({{"quantization_config", 3}}),
              HasSubstr("'quantization_config' must be an object"));
  EXPECT_THAT(parse_error(json::array()), HasSubstr("must be a JSON object"));
}

TEST(ModelConfig, ValuesOutOfRangeNameTheKey) {
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"dim", 0}}, "'dim' must be a positive integer"},
      {{{"n_heads", -8}}, "'n_heads' must be a positive integer"},
      {{{"vocab_size", 0}}, "'vocab_size' must be a positive integer"},
      {{{"moe_inter_dim", 0}}, "'moe_inter_dim' must be a positive integer"},
      {{{"dspark_markov_rank", 0}}, "'dspark_markov_rank' must be a positive integer"},
      {{{"rope_head_dim", 63}}, "'rope_head_dim' must be even"},
      {{{"rope_head_dim", 1024}}, "'rope_head_dim' must be <= head_dim"},
      {{{"o_groups", 7}}, "'o_groups' must divide n_heads"},
      {{{"dspark_n_activated_experts", 200}}, "'dspark_n_activated_experts' must be <= the routed experts"},
      {{{"dspark_noise_token_id", 129280}}, "'dspark_noise_token_id' must be in [0, vocab_size"},
      {{{"dspark_noise_token_id", -1}}, "'dspark_noise_token_id' must be in [0, vocab_size"},
      {{{"norm_eps", 0.0}}, "'norm_eps' must be a finite number > 0"},
      {{{"hc_eps", -1e-6}}, "'hc_eps' must be a finite number > 0"},
      {{{"hc_sinkhorn_iters", 0}}, "'hc_sinkhorn_iters' must be a positive integer"},
      {{{"hc_sinkhorn_iters", int64_t{1} << 40}},
       "'hc_sinkhorn_iters' must be at most 1000 (got 1099511627776)"},
      {{{"hc_mult", 17}}, "'hc_mult' must be at most 16"},
      {{{"window_size", 65537}}, "'window_size' must be at most 65536"},
      {{{"dspark_block_size", 65}}, "'dspark_block_size' must be at most 64"},
      {{{"dspark_block_size", 0}}, "'dspark_block_size' must be a positive integer"},
      {{{"dim", 65537}}, "'dim' must be at most 65536 (got 65537)"},
      {{{"n_heads", 2048}}, "'n_heads' must be at most 1024 (got 2048)"},
      {{{"head_dim", 16384}}, "'head_dim' must be at most 8192 (got 16384)"},
      {{{"q_lora_rank", 65537}}, "'q_lora_rank' must be at most 65536"},
      {{{"o_lora_rank", 65537}}, "'o_lora_rank' must be at most 65536"},
      {{{"vocab_size", int64_t{1} << 32}}, "'vocab_size' must be at most 2147483647 (got 4294967296)"},
      {{{"moe_inter_dim", 65537}}, "'moe_inter_dim' must be at most 65536"},
      {{{"dspark_n_routed_experts", 4097}}, "'dspark_n_routed_experts' must be at most 4096"},
      {{{"n_shared_experts", 65}}, "'n_shared_experts' must be at most 64"},
      {{{"n_layers", 65537}}, "'n_layers' must be at most 65536"},
      {{{"n_mtp_layers", 65}}, "'n_mtp_layers' must be at most 64"},
      {{{"dspark_markov_rank", 4294967297}}, "'dspark_markov_rank' must be at most 65536 (got 4294967297)"},
      {{{"quantization_config", {{"weight_block_size", 8192}}}},
       "'quantization_config.weight_block_size' must be at most 4096"},
      {{{"dspark_target_layer_ids", {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}}},
       "'dspark_target_layer_ids' must hold at most 16 layers (got 17)"},
      {{{"dim", 18446744073709551615ull}}, "'dim' must be an integer (got 18446744073709551615)"},
      {{{"dspark_target_layer_ids", json::array()}}, "'dspark_target_layer_ids' must not be empty"},
      {{{"dspark_target_layer_ids", {37, 40}}},
       "'dspark_target_layer_ids[1]' must be a layer in [0, n_layers"},
      {{{"dspark_target_layer_ids", {38, 38}}}, "'dspark_target_layer_ids[1]' repeats layer 38"},
      {{{"swiglu_limit", -1.0}}, "'swiglu_limit' must be a finite number >= 0"},
      {{{"dtype", "fp32"}}, "'dtype' must be bf16 or fp8"},
      {{{"expert_dtype", "int4"}}, "'expert_dtype' must be fp4, fp8, bf16 or null"},
      {{{"quantization_config", {{"weight_block_size", 0}}}},
       "'quantization_config.weight_block_size' must be a"},
      {{{"quantization_config", {{"quant_method", "awq"}}}},
       "'quantization_config.quant_method' 'awq' is not"},
      {{{"quantization_config", {{"scale_fmt", "fp32"}}}}, "'quantization_config.scale_fmt' 'fp32' is not"},
  };
  for (const auto& [j, msg] : cases) EXPECT_THAT(parse_error(j), HasSubstr(msg)) << j.dump();
}

TEST(ModelConfig, IntegersAtTheirUpperBoundsAreAccepted) {
  const ModelConfig c = parse_model_config(
      json{{"dim", 65536},
           {"vocab_size", 2147483647},
           {"n_mtp_layers", 64},
           {"dspark_markov_rank", 65536},
           {"dspark_target_layer_ids", {24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39}}},
      "config.json");
  EXPECT_EQ(c.dim, 65536);
  EXPECT_EQ(c.vocab_size, 2147483647);
  EXPECT_EQ(c.n_mtp_layers, 64);
  EXPECT_EQ(c.markov_rank, 65536);
  EXPECT_EQ(c.n_taps(), 16);
}

TEST(ModelConfig, OnlySqrtSoftplusScoring) {
  EXPECT_THAT(parse_error({{"score_func", "softmax"}}), HasSubstr("'score_func' 'softmax' is not supported"));
  EXPECT_THAT(parse_error({{"score_func", "sigmoid"}}), HasSubstr("not supported"));
}

// exllamav3's quantization_config (the golden EXL3 case's): the codebook, the bits and the per-role table are
// read, written back by model_config_to_json, and bad values are refused naming the key.
TEST(ModelConfig, Exl3QuantizationConfigIsReadAndChecked) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const ModelConfig c = load_model_config(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/ckpt/config.json");
  EXPECT_EQ(c.quant_method, "exl3");
  EXPECT_EQ(c.exl3.codebook, "mul1");
  EXPECT_EQ(c.exl3.bits, 2);
  EXPECT_EQ(c.exl3.head_bits, 6);
  EXPECT_EQ(c.exl3.role_bits.size(), 10u);
  EXPECT_EQ(c.exl3.role_bits.at("main_proj"), 5);
  EXPECT_EQ(c.exl3.role_bits.at("attn.wkv"), 4);
  EXPECT_EQ(c.exl3.role_bits.at("ffn.experts"), 2);
  EXPECT_EQ(c.weight_block_size, 32);  // wo_a's fp8 blocks
  EXPECT_TRUE(parse_model_config(model_config_to_json(c)) == c) << model_config_to_json(c).dump();
  const auto q = [](json extra) {
    json j = {{"quant_method", "exl3"}};
    j.update(extra);
    return json{{"quantization_config", j}};
  };
  EXPECT_THAT(parse_error(q({{"bits", 9}})),
              HasSubstr("'quantization_config.bits' must be 1 to 8 bits per weight (got 9)"));
  EXPECT_THAT(parse_error(q({{"codebook", "xyz"}})), HasSubstr("must be mcg, mul1 or 3inst (got 'xyz')"));
  EXPECT_THAT(parse_error(q({{"exl3_bits", {{"main_proj", 0}}}})),
              HasSubstr("'quantization_config.exl3_bits.main_proj' must be 1 to 8 bits per weight (got 0)"));
  EXPECT_THAT(parse_error(q({{"exl3_bits", 4}})), HasSubstr("must be an object of role: bits"));
  EXPECT_NO_THROW(parse_model_config(
      q({{"version", "0.0.18"}, {"calibration", {{"rows", 250}}}, {"out_scales", "auto"}})));
  EXPECT_THAT(parse_error({{"quantization_config", {{"quant_method", "fp8"}, {"bits", 4}}}}),
              HasSubstr("has EXL3 keys (codebook, bits, head_bits, exl3_bits) but quant_method is not exl3"));
  EXPECT_THAT(parse_error({{"quantization_config", {{"quant_method", "awq"}}}}),
              HasSubstr("'awq' is not supported (fp8 or exl3)"));
}

TEST(ModelConfig, LoadErrorsNameTheFile) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("dspark_test_model_config_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const auto bad = dir / "config.json";
  std::ofstream(bad) << "{\"dim\": 256,";
  try {
    load_model_config(bad);
    ADD_FAILURE() << "no error for truncated JSON";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(bad.string() + ": invalid JSON"));
  }
  std::ofstream(bad) << "{\"dim\": 0}";
  try {
    load_model_config(bad);
    ADD_FAILURE() << "no error for dim 0";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(bad.string() + ": 'dim' must be a positive integer"));
  }
  std::filesystem::remove_all(dir);
  EXPECT_THROW(load_model_config(dir / "missing.json"), Error);
}

}  // namespace
}  // namespace dspark
