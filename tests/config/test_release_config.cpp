// The config.json published with the DeepSeek-V4.1-Flash weights (SPEC §2, "Two layouts"): the fixture with
// the release's keys and values loads to SPEC §2's table of V4.1 values, the target's keys are ignored, and
// every error names the key as the released file spells it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

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

const char* const kFixture = DSPARK_SHARED_DIR "/fixtures/deepseek-v41-flash/config.json";

#define SKIP_WITHOUT_FIXTURE() \
  if (!std::filesystem::exists(kFixture)) GTEST_SKIP() << "no release fixture at " << kFixture

json fixture() {
  std::ifstream in(kFixture);
  return json::parse(in);
}

std::string parse_error(const json& j) {
  try {
    parse_model_config(j, "release.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(ReleaseConfig, TheReleasedFileLoadsToTheV41Values) {
  SKIP_WITHOUT_FIXTURE();
  const ModelConfig c = load_model_config(kFixture);
  // SPEC §2's table, column "V4.1-Flash".
  EXPECT_EQ(c.layout, ConfigLayout::release);
  EXPECT_EQ(c.dim, 5120);
  EXPECT_EQ(c.n_heads, 64);
  EXPECT_EQ(c.head_dim, 512);
  EXPECT_EQ(c.rope_head_dim, 64);
  EXPECT_EQ(c.q_lora_rank, 1280);
  EXPECT_EQ(c.o_groups, 8);
  EXPECT_EQ(c.o_lora_rank, 1024);
  EXPECT_EQ(c.window_size, 128);
  EXPECT_DOUBLE_EQ(c.norm_eps, 1e-20);
  EXPECT_EQ(c.hc_mult, 4);
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_DOUBLE_EQ(c.hc_eps, 1e-6);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);  // the target's YaRN rope_scaling does not apply to the stages
  EXPECT_EQ(c.vocab_size, 129280);
  EXPECT_EQ(c.moe_inter_dim, 2304);
  EXPECT_EQ(c.n_routed_experts, 128);   // dspark_n_routed_experts, not the target's 384
  EXPECT_EQ(c.n_activated_experts, 3);  // dspark_num_experts_per_tok, not the target's 6
  EXPECT_EQ(c.n_shared_experts, 1);
  EXPECT_EQ(c.score_func, "sqrtsoftplus");
  EXPECT_DOUBLE_EQ(c.route_scale, 1.5);
  EXPECT_DOUBLE_EQ(c.swiglu_limit, 10.0);
  EXPECT_TRUE(c.norm_topk_prob);
  EXPECT_DOUBLE_EQ(c.gate_temp, 1.0);  // absent from the release: SPEC §2's default
  EXPECT_EQ(c.n_layers, 40);
  EXPECT_EQ(c.n_mtp_layers, 3);
  EXPECT_EQ(c.block_size, 5);
  EXPECT_EQ(c.noise_token_id, 128799);
  EXPECT_EQ(c.target_layer_ids, (std::vector<int64_t>{37, 38, 39}));
  EXPECT_EQ(c.markov_rank, 256);
  EXPECT_EQ(c.quant_method, "fp8");
  EXPECT_EQ(c.weight_block_size, 32);
  EXPECT_EQ(c.scale_fmt, "ue8m0");
  EXPECT_EQ(c.dtype, "fp8");  // quant_method fp8 governs the linears of SPEC §3
  EXPECT_EQ(c.expert_dtype, "fp4");
}

TEST(ReleaseConfig, AMissingKeyIsNamedAsTheReleaseSpellsIt) {
  SKIP_WITHOUT_FIXTURE();
  for (const char* key : {"hidden_size", "qk_rope_head_dim", "sliding_window", "num_nextn_predict_layers",
                          "dspark_markov_rank", "moe_intermediate_size"}) {
    json j = fixture();
    j["text_config"].erase(key);
    EXPECT_THAT(parse_error(j), HasSubstr(std::string("'text_config.") + key + "' is missing")) << key;
  }
}

TEST(ReleaseConfig, WrongValuesNameTheReleasedKey) {
  SKIP_WITHOUT_FIXTURE();
  json j = fixture();
  j["text_config"]["hidden_size"] = "5120";
  EXPECT_THAT(parse_error(j), HasSubstr("'text_config.hidden_size' must be an integer"));
  j = fixture();
  j["text_config"]["rms_norm_eps"] = -1.0;
  EXPECT_THAT(parse_error(j), HasSubstr("'text_config.rms_norm_eps' must be a finite number > 0"));
  j = fixture();
  j["text_config"]["dspark_num_experts_per_tok"] = 200;  // more than the 128 routed experts
  EXPECT_THAT(parse_error(j), HasSubstr("'text_config.dspark_num_experts_per_tok' must be <="));
  j = fixture();
  j["text_config"]["num_key_value_heads"] = 8;
  EXPECT_THAT(parse_error(j), HasSubstr("'text_config.num_key_value_heads' must be 1"));
  j = fixture();
  j["quantization_config"]["activation_scheme"] = "static";
  EXPECT_THAT(parse_error(j), HasSubstr("'quantization_config.activation_scheme' must be \"dynamic\""));
  j = fixture();
  j["quantization_config"]["expert_dtype"] = "int4";
  EXPECT_THAT(parse_error(j), HasSubstr("'quantization_config.expert_dtype' must be fp4, fp8, bf16 or null"));
  j = fixture();
  j["quantization_config"]["quant_method"] = "awq";
  EXPECT_THAT(parse_error(j), HasSubstr("'quantization_config.quant_method'"));
}

TEST(ReleaseConfig, ExpertCountsFallBackToTheTargets) {
  SKIP_WITHOUT_FIXTURE();
  json j = fixture();
  j["text_config"].erase("dspark_n_routed_experts");
  j["text_config"].erase("dspark_num_experts_per_tok");
  const ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.n_routed_experts, 384);
  EXPECT_EQ(c.n_activated_experts, 6);
  j["text_config"].erase("num_experts_per_tok");
  EXPECT_THAT(parse_error(j), HasSubstr("'text_config.dspark_num_experts_per_tok' is missing"));
}

TEST(ReleaseConfig, TargetKeysAreIgnoredAndExpertDtypeMayBeTopLevel) {
  SKIP_WITHOUT_FIXTURE();
  json j = fixture();
  j["text_config"]["some_future_target_key"] = {{"anything", 1}};
  j["another_top_level_key"] = 7;
  j["quantization_config"].erase("expert_dtype");
  j["expert_dtype"] = "fp8";
  const ModelConfig c = parse_model_config(j);
  EXPECT_EQ(c.expert_dtype, "fp8");
  EXPECT_EQ(c.dim, 5120);
  j["quantization_config"]["expert_dtype"] = "fp4";
  EXPECT_THAT(parse_error(j), HasSubstr("'expert_dtype' is given both"));
}

TEST(ReleaseConfig, ReleaseJsonOfAConfigParsesBackToIt) {
  for (ModelConfig c : {tiny_model_config(), ModelConfig{}}) {
    c.layout = ConfigLayout::release;
    c.expert_dtype = "fp4";
    c.dtype = "fp8";  // the released layout says fp8 linears with quant_method fp8, and only so
    c.quant_method = "fp8";
    const json j = model_config_to_release_json(c);
    EXPECT_TRUE(j.contains("text_config"));
    EXPECT_EQ(j["text_config"]["hidden_size"], c.dim);
    EXPECT_TRUE(parse_model_config(j) == c) << j.dump();
  }
}

}  // namespace
}  // namespace dspark
