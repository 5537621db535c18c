// Synthetic checkpoints in the seed's EXL3 mix (SyntheticFormat::exl3): the golden case's tensor names,
// dtypes and shapes (written by an independent implementation), exllamav3's config keys, scales in their
// stated ranges, trellis bytes independent of chunking, per-role bits and the codebook choice; the CPU
// drafter runs on it with activations at the scale the dense checkpoint gives.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/golden.hpp"
#include "tests/support/tensor_host.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;

fs::path write(const std::string& name, SyntheticFormat f, SyntheticOptions opt = {},
               const std::string& codebook = "mul1", const std::map<std::string, int64_t>& bits = {}) {
  const fs::path dir = test::scratch_dir(name);
  opt.force = true;
  write_synthetic_checkpoint(
      synthetic_model_config(tiny_model_config(), f, ConfigLayout::inference, codebook, bits), dir, opt);
  return dir;
}

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

template <typename T>
std::vector<T> read_all(const Checkpoint& ck, const std::string& name) {
  std::vector<T> v(ck.get(name).nbytes / sizeof(T));
  ck.read(name, v.data());
  return v;
}

class SyntheticExl3 : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = write("exl3", SyntheticFormat::exl3, {.seed = 3}); }
  static fs::path dir_;
};
fs::path SyntheticExl3::dir_;

TEST_F(SyntheticExl3, HasTheGoldenCasesTensorsWithTheirDtypesAndShapes) {
  DSPARK_SKIP_WITHOUT_GOLDEN_CASE("tiny-v41-exl3");
  const Checkpoint golden(DSPARK_SHARED_DIR "/golden/tiny-v41-exl3/ckpt"), ours(dir_);
  EXPECT_EQ(ours.names(), golden.names());
  for (const std::string& n : golden.names()) {
    EXPECT_EQ(ours.get(n).dtype, golden.get(n).dtype) << n;
    EXPECT_EQ(ours.get(n).shape, golden.get(n).shape) << n;
  }
}

TEST_F(SyntheticExl3, ConfigJsonHasExllamasKeysWithTheSeedsBits) {
  const nlohmann::json q = nlohmann::json::parse(std::ifstream(dir_ / "config.json"))["quantization_config"];
  EXPECT_EQ(q["quant_method"], "exl3");
  EXPECT_EQ(q["codebook"], "mul1");
  EXPECT_EQ(q["bits"], 2);
  EXPECT_EQ(q["head_bits"], 6);
  const std::map<std::string, int64_t> want = {{"head", 6},
                                               {"main_proj", 5},
                                               {"attn.wq_a", 4},
                                               {"attn.wkv", 4},
                                               {"attn.wq_b", 4},
                                               {"attn.wo_b", 4},
                                               {"ffn.shared_experts.w1", 4},
                                               {"ffn.shared_experts.w3", 4},
                                               {"ffn.shared_experts.w2", 4},
                                               {"ffn.experts", 2}};
  const auto bits = q["exl3_bits"].get<std::map<std::string, int64_t>>();
  EXPECT_EQ(bits, want);
  EXPECT_EQ(q["fmt"], "e4m3");
}

TEST_F(SyntheticExl3, ScalesLieInTheirRangesWithBothSigns) {
  // suh = +-a m, a = 1 / (sqrt(in) * 1.00031) (MUL1's std), svh = +-n; m, n in [e^-0.35, e^0.35] (fp16
  // rounded).
  const Checkpoint ck(dir_);
  const auto check = [&](const std::string& name, double a) {
    const std::vector<f16_t> v = read_all<f16_t>(ck, name);
    int negative = 0;
    for (const f16_t h : v) {
      const double m = std::abs(f16_to_float(h)) / a;
      EXPECT_GE(m, std::exp(-0.35) * (1 - 1e-3)) << name;
      EXPECT_LE(m, std::exp(0.35) * (1 + 1e-3)) << name;
      negative += f16_to_float(h) < 0;
    }
    EXPECT_GT(negative, static_cast<int>(v.size()) / 4) << name;
    EXPECT_LT(negative, static_cast<int>(v.size()) * 3 / 4) << name;
  };
  check("mtp.0.main_proj.suh", 1.0 / (std::sqrt(768.0) * 1.00031));
  check("mtp.0.main_proj.svh", 1.0);
  check("mtp.2.ffn.experts.7.w2.suh", 1.0 / (std::sqrt(512.0) * 1.00031));
  check("head.svh", 1.0);
  EXPECT_EQ(read_all<uint32_t>(ck, "mtp.1.attn.wkv.mul1"), std::vector<uint32_t>{0x83DCD12Du});
}

TEST_F(SyntheticExl3, TrellisBytesDoNotDependOnChunksOrThreadsAndSeedsDiffer) {
  SyntheticOptions opt{.seed = 3};
  opt.chunk_bytes = 3000;  // fewer than one tile row of most trellises
  opt.threads = 3;
  const fs::path other = write("exl3-chunked", SyntheticFormat::exl3, opt);
  EXPECT_TRUE(file_bytes(dir_ / "model.safetensors") == file_bytes(other / "model.safetensors"));
  const Checkpoint a(dir_), b(write("exl3-seed4", SyntheticFormat::exl3, {.seed = 4}));
  const std::vector<int16_t> ta = read_all<int16_t>(a, "head.trellis"),
                             tb = read_all<int16_t>(b, "head.trellis");
  size_t same = 0;
  for (size_t i = 0; i < ta.size(); ++i) same += ta[i] == tb[i];
  EXPECT_LT(same, ta.size() / 1000);  // uniform 16-bit values agree 1 in 65536
}

TEST(SyntheticExl3Options, RoleBitsAndTheCodebookAreHonoured) {
  const Checkpoint ck(
      write("exl3-mcg", SyntheticFormat::exl3, {}, "mcg", {{"main_proj", 3}, {"ffn.experts", 1}}));
  EXPECT_EQ(ck.get("mtp.0.main_proj.trellis").shape, (Shape{48, 16, 48}));
  EXPECT_EQ(ck.get("mtp.1.ffn.experts.2.w1.trellis").shape, (Shape{16, 32, 16}));
  EXPECT_EQ(ck.get("mtp.1.attn.wq_a.trellis").shape, (Shape{16, 8, 64}));  // the seed's 4 bits
  EXPECT_TRUE(ck.has("head.mcg"));
  EXPECT_FALSE(ck.has("head.mul1"));
  const ModelConfig cfg = load_model_config(ck.config_path());
  EXPECT_EQ(cfg.exl3.codebook, "mcg");
  CpuBackend be;
  const DrafterWeights w = load_drafter_weights(ck, cfg, make_shard_plan(cfg, 0, 2), be);
  EXPECT_EQ(w.main_proj.bits, 3);
  EXPECT_EQ(w.head.codebook, Exl3Codebook::mcg);
  const Checkpoint plain(write("exl3-3inst", SyntheticFormat::exl3, {}, "3inst"));
  EXPECT_FALSE(plain.has("head.mcg") || plain.has("head.mul1"));
}

// The hidden state after each stage, its RMS, with the checkpoint's weights and fixed context rows.
std::map<std::string, double> stage_rms(const fs::path& dir) {
  const Checkpoint ck(dir);
  const ModelConfig cfg = load_model_config(ck.config_path());
  CpuBackend be;
  LocalCommunicator comm;
  const ShardPlan plan = make_shard_plan(cfg, 0, 1);
  DrafterOptions opt;
  opt.slots = 1;
  opt.max_batch = 1;
  Drafter d(cfg, load_drafter_weights(ck, cfg, plan, be), plan, be, comm, opt);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<bf16_t> rows(static_cast<size_t>(20 * cfg.row_dim()));
  for (auto& v : rows) v = float_to_bf16(normal(rng));
  d.insert(0, 0, rows.data(), 20);
  std::map<std::string, double> rms;
  d.set_trace([&](const std::string& name, const Tensor& t) {
    if (!name.ends_with("after_ffn") && name != "base_logits") return;
    double s = 0;
    const std::vector<float> v = test::to_floats(be, t);
    for (float x : v) s += double(x) * x;
    rms[name] = std::sqrt(s / static_cast<double>(v.size()));
  });
  const std::vector<DraftRequest> reqs = {{0, 17, 20, -1, 0}};
  const DraftResult r = d.draft(reqs);
  for (size_t i = 0; i < r.conf.size(); ++i) EXPECT_TRUE(std::isfinite(r.conf[i])) << i;
  return rms;
}

TEST(SyntheticExl3Drafts, ActivationsStayAtTheDenseCheckpointsScale) {
  // The same synthetic model in bf16 and in EXL3 (other weights, the same scale rules): each stage's output
  // and the logits within a factor 2 of the bf16 model's RMS.
  const std::map<std::string, double> dense = stage_rms(write("scale-bf16", SyntheticFormat::bf16));
  const std::map<std::string, double> exl3 = stage_rms(write("scale-exl3", SyntheticFormat::exl3));
  ASSERT_EQ(dense.size(), 4u);
  for (const auto& [name, v] : dense) {
    ASSERT_TRUE(exl3.contains(name)) << name;
    EXPECT_GT(exl3.at(name), v / 2) << name;
    EXPECT_LT(exl3.at(name), v * 2) << name;
  }
}

}  // namespace
}  // namespace dspark
