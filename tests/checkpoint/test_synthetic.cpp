// Synthetic checkpoints: complete and readable by Checkpoint, deterministic per seed and independent of
// chunking, weights at the intended scale, sharding with an index, and the refusal to overwrite.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string file_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

class SyntheticTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            fmt::format("dspark_test_synthetic_{}_{}", ::getpid(),
                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }
  fs::path dir(const std::string& name) const { return root_ / name; }

  fs::path root_;
};

// Mean and standard deviation of a bf16 or f32 tensor.
std::pair<double, double> moments(const Checkpoint& ck, const std::string& name) {
  const TensorInfo& info = ck.get(name);
  std::vector<uint8_t> raw(info.nbytes);
  ck.read(name, raw.data());
  const int64_t n = shape_numel(info.shape);
  double sum = 0, sq = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double v = info.dtype == DType::bf16 ? bf16_to_float(reinterpret_cast<const bf16_t*>(raw.data())[i])
                                               : reinterpret_cast<const float*>(raw.data())[i];
    sum += v;
    sq += v * v;
  }
  const double mean = sum / n;
  return {mean, std::sqrt(sq / n - mean * mean)};
}

TEST_F(SyntheticTest, TinyHasEveryTensorWithItsShapeAndDtype) {
  const ModelConfig cfg = tiny_model_config();
  const SyntheticResult r = write_synthetic_checkpoint(cfg, dir("tiny"));
  ASSERT_EQ(r.files.size(), 1u);
  EXPECT_EQ(r.files[0].filename(), "model.safetensors");
  EXPECT_FALSE(fs::exists(dir("tiny") / "model.safetensors.index.json"));

  const Checkpoint ck(dir("tiny"));
  const std::vector<DrafterTensor> tensors = drafter_tensors(cfg);
  EXPECT_EQ(ck.names().size(), tensors.size());
  EXPECT_EQ(r.tensors, tensors.size());
  uint64_t bytes = 0;
  for (const DrafterTensor& t : tensors) {
    const TensorInfo* info = ck.find(t.weight_name());
    ASSERT_NE(info, nullptr) << t.weight_name();
    EXPECT_EQ(info->shape, t.shape) << t.weight_name();
    EXPECT_EQ(info->dtype, t.dense_dtype) << t.weight_name();
    bytes += info->nbytes;
  }
  EXPECT_EQ(r.bytes, bytes);
  EXPECT_TRUE(load_model_config(ck.config_path()) == cfg);
}

TEST_F(SyntheticTest, SameSeedSameBytesWhateverTheChunking) {
  const ModelConfig cfg = tiny_model_config();
  write_synthetic_checkpoint(cfg, dir("a"), {.seed = 7});
  SyntheticOptions small_chunks{.seed = 7};
  small_chunks.chunk_bytes = 4098;  // not a multiple of any tensor's row
  small_chunks.threads = 3;
  write_synthetic_checkpoint(cfg, dir("b"), small_chunks);
  write_synthetic_checkpoint(cfg, dir("c"), {.seed = 8});
  const std::string a = file_bytes(dir("a") / "model.safetensors");
  EXPECT_GT(a.size(), 1000000u);
  EXPECT_TRUE(a == file_bytes(dir("b") / "model.safetensors"));
  EXPECT_FALSE(a == file_bytes(dir("c") / "model.safetensors"));
  EXPECT_EQ(file_bytes(dir("a") / "config.json"), file_bytes(dir("c") / "config.json"));
}

TEST_F(SyntheticTest, DifferentSeedsGiveDifferentValuesEverywhere) {
  const ModelConfig cfg = tiny_model_config();
  write_synthetic_checkpoint(cfg, dir("a"), {.seed = 1});
  write_synthetic_checkpoint(cfg, dir("b"), {.seed = 2});
  const Checkpoint a(dir("a")), b(dir("b"));
  for (const std::string& name : a.names()) {
    std::vector<uint8_t> x(a.get(name).nbytes), y(b.get(name).nbytes);
    a.read(name, x.data());
    b.read(name, y.data());
    EXPECT_NE(x, y) << name;
  }
}

TEST_F(SyntheticTest, ValuesOfASliceDoNotDependOnTheRange) {
  const DrafterTensor t = drafter_tensors(tiny_model_config()).at(0);
  std::vector<bf16_t> whole(1000), parts(1000);
  synthetic_values(t, 3, 500, 1000, whole.data());
  synthetic_values(t, 3, 500, 333, parts.data());
  synthetic_values(t, 3, 833, 667, parts.data() + 333);
  EXPECT_EQ(whole, parts);
}

TEST_F(SyntheticTest, WeightsHaveTheIntendedScale) {
  const ModelConfig cfg = tiny_model_config();
  write_synthetic_checkpoint(cfg, dir("tiny"));
  const Checkpoint ck(dir("tiny"));
  // wq_b is [1024, 128]: 131072 samples, so the sample std is within ~0.2% of 1/sqrt(128); 3% is a safe
  // bound.
  const auto [mean, sd] = moments(ck, "mtp.0.attn.wq_b.weight");
  EXPECT_NEAR(sd * std::sqrt(128.0), 1.0, 0.03);
  EXPECT_NEAR(mean, 0.0, 0.002);
  const auto [w2_mean, w2_sd] = moments(ck, "mtp.1.ffn.experts.3.w2.weight");  // [256, 512]
  EXPECT_NEAR(w2_sd * std::sqrt(512.0), 1.0, 0.03);
  EXPECT_NEAR(w2_mean, 0.0, 0.002);
  const auto [norm_mean, norm_sd] = moments(ck, "mtp.2.norm.weight");
  EXPECT_NEAR(norm_mean, 1.0, 0.01);
  EXPECT_LT(norm_sd, 0.05);
  const auto [emb_mean, emb_sd] = moments(ck, "embed.weight");
  EXPECT_NEAR(emb_sd, 1.0, 0.03);
  const auto [hc_mean, hc_sd] = moments(ck, "mtp.0.hc_attn_fn");  // f32 [24, 1024]
  EXPECT_NEAR(hc_sd * std::sqrt(1024.0), 1.0, 0.1);
}

TEST_F(SyntheticTest, ShardedOutputHasAnIndexCheckpointOpens) {
  const ModelConfig cfg = tiny_model_config();
  write_synthetic_checkpoint(cfg, dir("one"), {.seed = 5});
  SyntheticOptions opt{.seed = 5};
  opt.max_shard_bytes = 5'000'000;
  const SyntheticResult r = write_synthetic_checkpoint(cfg, dir("sharded"), opt);
  ASSERT_GT(r.files.size(), 2u);
  EXPECT_EQ(r.files.front().filename(), fmt::format("model-00001-of-{:05d}.safetensors", r.files.size()));
  EXPECT_TRUE(fs::exists(dir("sharded") / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir("sharded") / "model.safetensors"));
  for (const fs::path& f : r.files)
    EXPECT_LE(fs::file_size(f), 5'000'000u + 1'000'000u) << f;  // + header, one tensor

  const Checkpoint one(dir("one")), sharded(dir("sharded"));
  ASSERT_EQ(sharded.names(), one.names());
  for (const std::string& name : one.names()) {
    std::vector<uint8_t> x(one.get(name).nbytes), y(sharded.get(name).nbytes);
    one.read(name, x.data());
    sharded.read(name, y.data());
    EXPECT_EQ(x, y) << name;
  }
}

TEST_F(SyntheticTest, RefusesANonEmptyDirectoryUnlessForced) {
  const ModelConfig cfg = tiny_model_config();
  SyntheticOptions sharded;
  sharded.max_shard_bytes = 5'000'000;
  write_synthetic_checkpoint(cfg, dir("out"), sharded);
  std::ofstream(dir("out") / "notes.txt") << "kept";
  try {
    write_synthetic_checkpoint(cfg, dir("out"));
    ADD_FAILURE() << "overwrote a non-empty directory";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("not empty"));
  }
  // Forced: the old shards and index go, so the single-file checkpoint is what Checkpoint sees.
  write_synthetic_checkpoint(cfg, dir("out"), {.force = true});
  EXPECT_FALSE(fs::exists(dir("out") / "model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(dir("out") / "model-00001-of-00002.safetensors"));
  EXPECT_TRUE(fs::exists(dir("out") / "notes.txt"));
  EXPECT_EQ(Checkpoint(dir("out")).names().size(), drafter_tensors(cfg).size());
}

TEST_F(SyntheticTest, InvalidConfigIsRejectedBeforeWriting) {
  ModelConfig cfg = tiny_model_config();
  cfg.o_groups = 3;
  try {
    write_synthetic_checkpoint(cfg, dir("bad"));
    ADD_FAILURE() << "no error for o_groups 3";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr("o_groups"));
  }
  EXPECT_FALSE(fs::exists(dir("bad")));
}

}  // namespace
}  // namespace dspark
