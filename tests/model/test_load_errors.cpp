// A broken checkpoint or config stops the load with an error that names the tensor, the file or the key.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/model/exl3_parts.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/edited_checkpoint.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

using test::load_error;

// A copy of the tiny checkpoint with tensors edited (tests/support/edited_checkpoint.hpp).
fs::path edited_copy(const std::string& name, const test::TensorEdit& edit) {
  return test::edited_checkpoint(test::tiny_checkpoint(), name, edit);
}

TEST(LoadErrors, TheUneditedCopyLoads) {
  EXPECT_EQ(load_error(edited_copy("ok", [](TensorSpec&, std::vector<uint8_t>&) { return true; })),
            "loaded without error");
}

TEST(LoadErrors, MissingTensor) {
  const auto dir =
      edited_copy("missing", [](TensorSpec& s, auto&) { return s.name != "mtp.1.attn.wkv.weight"; });
  EXPECT_THAT(load_error(dir), HasSubstr("'mtp.1.attn.wkv.weight' is missing"));
}

TEST(LoadErrors, WrongShape) {
  const auto dir = edited_copy("shape", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.2.ffn_norm.weight") {
      s.shape = {128};
      b.resize(256);
    }
    return true;
  });
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("'mtp.2.ffn_norm.weight'"));
  EXPECT_THAT(msg, HasSubstr("shape [128]"));
  EXPECT_THAT(msg, HasSubstr("model.safetensors"));
}

TEST(LoadErrors, WrongDtype) {
  const auto dir = edited_copy("dtype", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.0.attn.attn_sink") {  // must be f32
      s.dtype = DType::bf16;
      b.resize(b.size() / 2);
    }
    return true;
  });
  EXPECT_THAT(load_error(dir), HasSubstr("'mtp.0.attn.attn_sink' in"));
  EXPECT_THAT(load_error(dir), HasSubstr("dtype bf16, expected f32"));
}

TEST(LoadErrors, QuantisedWeightIsRecognisedAndRefused) {
  const auto dir = edited_copy("fp8", [](TensorSpec& s, std::vector<uint8_t>& b) {
    if (s.name == "mtp.0.attn.wo_a.weight") {
      s.dtype = DType::f8_e4m3;
      b.resize(b.size() / 2);
    }
    return true;
  });
  // Adds the block scales next to it: [ceil(512/32), ceil(256/32)] e8m0.
  {
    const Checkpoint src(dir);
    std::vector<TensorSpec> specs;
    std::vector<std::vector<uint8_t>> data;
    for (const std::string& n : src.names()) {
      const TensorInfo& info = src.get(n);
      specs.push_back({n, info.dtype, info.shape});
      data.emplace_back(info.nbytes);
      src.read(n, data.back().data());
    }
    specs.push_back({"mtp.0.attn.wo_a.scale", DType::f8_e8m0, {16, 8}});
    data.emplace_back(16 * 8, uint8_t{127});
    const fs::path tmp = dir / "model.safetensors.tmp";
    SafetensorsWriter w(tmp, specs);
    for (size_t i = 0; i < specs.size(); ++i) w.write(specs[i].name, data[i].data(), data[i].size());
    w.finish();
    fs::rename(tmp, dir / "model.safetensors");
  }
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("'mtp.0.attn.wo_a'"));
  EXPECT_THAT(msg, HasSubstr("stored fp8 block but config.json's dtype says dense"));
}

// The golden EXL3 checkpoint (exllamav3's quantization_config keys, the head stored as head.trellis) loads on
// the CPU backend; a `.bias` beside a trellis is refused (no linear of the drafter has one).
TEST(LoadErrors, AnExl3CheckpointLoadsAndATrellisWithABiasIsRefused) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  EXPECT_EQ(load_error(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/ckpt"), "loaded without error");
  const std::string msg = load_error(test::edited_checkpoint(
      DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/ckpt", "exl3-bias", [](TensorSpec&, auto&) { return true; },
      {{{"mtp.1.attn.wq_b.bias", DType::f16, {1024}}, std::vector<uint8_t>(2048, 0)}}));
  EXPECT_THAT(msg, HasSubstr("tensor 'mtp.1.attn.wq_b.bias' in "));
  EXPECT_THAT(msg, HasSubstr("the drafter's linears have no bias"));
}

// A copy of the golden EXL3 checkpoint through `edit` (and with `extra` tensors): the load's message.
std::string exl3_error(const std::string& name, const test::TensorEdit& edit,
                       const std::vector<test::ExtraTensor>& extra = {}) {
  return load_error(
      test::edited_checkpoint(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/ckpt", "exl3-" + name, edit, extra));
}

TEST(LoadErrors, Exl3RolesAreTheNamesWithinAStageWithTheExpertsTogether) {
  EXPECT_EQ(exl3_role("head"), "head");
  EXPECT_EQ(exl3_role("mtp.0.main_proj"), "main_proj");
  EXPECT_EQ(exl3_role("mtp.12.attn.wq_a"), "attn.wq_a");
  EXPECT_EQ(exl3_role("mtp.2.ffn.shared_experts.w3"), "ffn.shared_experts.w3");
  EXPECT_EQ(exl3_role("mtp.2.ffn.experts.17.w2"), "ffn.experts");
}

TEST(LoadErrors, MalformedExl3PartsAreRefusedNamingTheTensor) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const auto refused = [](const std::string& name, const test::TensorEdit& edit,
                          const std::vector<test::ExtraTensor>& extra, const std::string& tensor,
                          const std::string& why) {
    const std::string msg = exl3_error(name, edit, extra);
    EXPECT_THAT(msg, HasSubstr("tensor '" + tensor)) << name;
    EXPECT_THAT(msg, HasSubstr(why)) << name;
  };
  const auto reshaped = [](std::string tensor, Shape shape, size_t num, size_t den) {
    return [=](TensorSpec& s, std::vector<uint8_t>& b) {
      if (s.name == tensor) {
        s.shape = shape;
        b.resize(b.size() / den * num);
      }
      return true;
    };
  };
  const auto keep = [](TensorSpec&, std::vector<uint8_t>&) { return true; };
  // main_proj at K = 4 where exl3_bits says 5; a trellis whose tiles do not match the matrix.
  refused("bits", reshaped("mtp.0.main_proj.trellis", {48, 16, 64}, 64, 80), {},
          "mtp.0.main_proj.trellis' in ",
          "K = 4 bits per weight, but quantization_config.exl3_bits.main_proj says 5");
  refused("tiles", reshaped("mtp.0.attn.wq_a.trellis", {8, 8, 64}, 1, 2), {}, "mtp.0.attn.wq_a.trellis' in ",
          "expected i16 [16, 8, 16 K] with K in 1..8");
  // suh of the wrong length; a missing svh.
  refused("suh", reshaped("mtp.1.attn.wkv.suh", {128}, 1, 2), {}, "mtp.1.attn.wkv.suh' in ",
          "f16 [128], expected f16 [256]");
  refused(
      "svh", [](TensorSpec& s, std::vector<uint8_t>&) { return s.name != "head.svh"; }, {}, "head' in ",
      "the EXL3 weight has neither .svh nor .sv");
  // Both codebook markers; a marker other than the config's codebook.
  refused("markers", keep, {{{"mtp.2.ffn.experts.3.w2.mcg", DType::i32, {}}, {0, 0, 0, 0}}},
          "mtp.2.ffn.experts.3.w2' in ", "has both codebook markers .mcg and .mul1");
  refused(
      "codebook",
      [](TensorSpec& s, std::vector<uint8_t>&) {
        if (s.name == "mtp.0.attn.wo_b.mul1") s.name = "mtp.0.attn.wo_b.mcg";
        return true;
      },
      {}, "mtp.0.attn.wo_b' in ", "its codebook is mcg but quantization_config.codebook says mul1");
}

TEST(LoadErrors, TruncatedFile) {
  const auto dir = edited_copy("truncated", [](TensorSpec&, auto&) { return true; });
  fs::resize_file(dir / "model.safetensors", fs::file_size(dir / "model.safetensors") - 1000);
  EXPECT_THAT(load_error(dir), HasSubstr("model.safetensors"));
}

TEST(LoadErrors, BadConfigKey) {
  const auto dir = edited_copy("config", [](TensorSpec&, auto&) { return true; });
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  j["n_headz"] = 8;
  std::ofstream(dir / "config.json") << j.dump();
  EXPECT_THAT(load_error(dir), HasSubstr("'n_headz'"));
}

TEST(LoadErrors, ConfigDisagreeingWithTensors) {
  const auto dir = edited_copy("config-vocab", [](TensorSpec&, auto&) { return true; });
  nlohmann::json j = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  j["vocab_size"] = 2048;
  std::ofstream(dir / "config.json") << j.dump();
  const std::string msg = load_error(dir);
  EXPECT_THAT(msg, HasSubstr("'embed.weight'"));
  EXPECT_THAT(msg, HasSubstr("config.json implies [2048, 256]"));
}

}  // namespace
}  // namespace dspark
