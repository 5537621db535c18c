// Sharded checkpoints through model.safetensors.index.json, as the release ships them: an fp8 weight and its
// scale in different shard files load to the same weights and drafts as the single file; an index that also
// lists thousands of the target's tensors, in a shard file that is not there, loads too, reading only the
// drafter's tensors (SPEC §3).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <random>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/core/error.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/sharded_checkpoint.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

const char* const kShard1 = "model-00001-of-00003.safetensors";
const char* const kShard2 = "model-00002-of-00003.safetensors";
const char* const kShard3 = "model-00003-of-00003.safetensors";  // never written

// Every .scale in the second shard, every other tensor in the first: no fp8 / fp4 weight shares a file with
// its scale.
std::string scales_apart(const std::string& name) {
  return name.ends_with(".scale") ? kShard2 : kShard1;
}

// The bytes of every tensor one rank holds, in a fixed order.
std::vector<std::vector<uint8_t>> held_bytes(Backend& be, const DrafterWeights& w) {
  std::vector<std::vector<uint8_t>> out;
  auto add = [&](const Tensor& t) {
    out.emplace_back(t.nbytes());
    if (!t.empty()) be.download(out.back().data(), t);
  };
  auto lin = [&](const LinearWeight& l) {
    add(l.weight);
    add(l.scale);
  };
  add(w.embed);
  lin(w.main_proj);
  add(w.main_norm);
  for (const StageWeights& s : w.stages) {
    for (const Tensor* t :
         {&s.attn_norm, &s.ffn_norm, &s.hc_attn.fn, &s.hc_attn.base, &s.hc_attn.scale, &s.hc_ffn.fn,
          &s.hc_ffn.base, &s.hc_ffn.scale, &s.q_norm, &s.kv_norm, &s.attn_sink, &s.gate, &s.gate_bias})
      add(*t);
    for (const LinearWeight* l : {&s.wq_a, &s.wq_b, &s.wkv, &s.wo_a, &s.wo_b}) lin(*l);
    for (const ExpertWeights* e : {&s.shared}) lin(e->w1), lin(e->w3), lin(e->w2);
    for (const ExpertWeights& e : s.experts) lin(e.w1), lin(e.w3), lin(e.w2);
  }
  add(w.final_norm);
  lin(w.head);
  add(w.markov_embed);
  add(w.markov_head);
  add(w.confidence_proj);
  return out;
}

// One rank's load of `dir` as the worker opens it (drafter tensors only), with the bytes it read and the
// drafts of two seeded requests on it (tp = 1 only: the drafter needs all ranks otherwise).
struct Loaded {
  std::vector<std::vector<uint8_t>> held;
  uint64_t bytes_read = 0;
  DraftResult drafts;
};

Loaded load(const fs::path& dir, int rank, int ranks) {
  const Checkpoint ckpt(dir, is_drafter_tensor);
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const ShardPlan plan = make_shard_plan(cfg, rank, ranks);
  CpuBackend be;
  Loaded out;
  DrafterWeights w = load_drafter_weights(ckpt, cfg, plan, be);
  out.bytes_read = ckpt.bytes_read();
  out.held = held_bytes(be, w);
  if (ranks == 1) {
    LocalCommunicator comm;
    DrafterOptions opt;
    opt.slots = 2;
    opt.max_batch = 2;
    Drafter d(cfg, std::move(w), plan, be, comm, opt);
    std::mt19937 rng(9);
    std::normal_distribution<float> normal;
    for (int s = 0; s < 2; ++s) {
      std::vector<bf16_t> rows(static_cast<size_t>(12 * cfg.row_dim()));
      for (auto& v : rows) v = float_to_bf16(normal(rng));
      d.insert(s, 0, rows.data(), 12);
    }
    const std::vector<DraftRequest> reqs = {{0, 5, 12, -1, 0}, {1, 600, 12, -1, 0}};
    out.drafts = d.draft(reqs);
  }
  return out;
}

void expect_same(const Loaded& a, const Loaded& b) {
  EXPECT_EQ(a.bytes_read, b.bytes_read);
  ASSERT_EQ(a.held.size(), b.held.size());
  for (size_t i = 0; i < a.held.size(); ++i) EXPECT_EQ(a.held[i], b.held[i]) << "tensor " << i;
  EXPECT_EQ(a.drafts.ids, b.drafts.ids);
  EXPECT_EQ(a.drafts.conf, b.drafts.conf);
  EXPECT_EQ(a.drafts.margin, b.drafts.margin);
}

TEST(CheckpointIndex, AWeightAndItsScaleInDifferentShardsLoadAsFromOneFile) {
  const fs::path one = test::tiny_fp8_checkpoint();
  const fs::path split = test::sharded_copy(one, "scales-apart", scales_apart);
  const Checkpoint ck(split);
  EXPECT_EQ(ck.get("mtp.0.attn.wq_b.weight").file.filename(), kShard1);
  EXPECT_EQ(ck.get("mtp.0.attn.wq_b.scale").file.filename(), kShard2);
  EXPECT_EQ(ck.get("mtp.1.ffn.experts.2.w2.scale").file.filename(), kShard2);
  for (const auto& [rank, ranks] : {std::pair{0, 1}, std::pair{0, 2}, std::pair{1, 2}}) {
    SCOPED_TRACE(fmt::format("rank {} of {}", rank, ranks));
    const Loaded a = load(one, rank, ranks), b = load(split, rank, ranks);
    EXPECT_EQ(a.held.size(), 45u + 2 * 98u);  // plain tensors; linears (the head too) as weight + scale
    expect_same(a, b);
  }
}

TEST(CheckpointIndex, TheTargetsTensorsInTheIndexAreNeitherOpenedNorRead) {
  // Like the release: the index lists the target's tensors too (here 6000, all in a shard file that is not
  // there), and a drafter shard also holds one of the target's tensors.
  std::map<std::string, std::string> target;
  for (int l = 0; l < 40; ++l)
    for (int e = 0; e < 50; ++e)
      for (const char* w : {"w1", "w2", "w3"})
        target[fmt::format("layers.{}.ffn.experts.{}.{}.weight", l, e, w)] = kShard3;
  ASSERT_EQ(target.size(), 6000u);
  const std::vector<test::ExtraTensor> beside = {
      {{"layers.0.attn.wkv.weight", DType::bf16, {512, 256}}, kShard1}};
  const fs::path one = test::tiny_fp8_checkpoint();
  const fs::path dir = test::sharded_copy(one, "with-target", scales_apart, beside, target);

  const Checkpoint ck(dir, is_drafter_tensor);
  EXPECT_EQ(ck.names().size(), 240u);  // the drafter's 143 tensors and its 97 scales
  EXPECT_FALSE(ck.has("layers.0.attn.wkv.weight"));
  for (const auto& [rank, ranks] : {std::pair{0, 1}, std::pair{1, 2}}) {
    SCOPED_TRACE(fmt::format("rank {} of {}", rank, ranks));
    expect_same(load(one, rank, ranks), load(dir, rank, ranks));
  }

  // Taken whole (no filter), the same checkpoint names the missing shard.
  try {
    const Checkpoint whole(dir);
    ADD_FAILURE() << "opened";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(std::string("names file '") + kShard3 + "'"));
  }
}

TEST(CheckpointIndex, ADrafterTensorInAMissingShardIsStillAnError) {
  const fs::path dir = test::sharded_copy(
      test::tiny_fp8_checkpoint(), "drafter-missing",
      [](const std::string& n) { return n == "mtp.2.attn.wkv.scale" ? kShard3 : kShard1; });
  std::filesystem::remove(dir / kShard3);
  try {
    const Checkpoint ck(dir, is_drafter_tensor);
    ADD_FAILURE() << "opened";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), HasSubstr(kShard3));
    EXPECT_THAT(e.what(), HasSubstr("'mtp.2.attn.wkv.scale'"));
  }
}

TEST(CheckpointIndex, TheDrafterFilterTakesTheSpecsPrefixes) {
  EXPECT_TRUE(is_drafter_tensor("embed.weight"));
  EXPECT_TRUE(is_drafter_tensor("head.weight"));
  EXPECT_TRUE(is_drafter_tensor("mtp.0.attn.wq_a.scale"));
  EXPECT_FALSE(is_drafter_tensor("layers.3.attn.wq_a.weight"));
  EXPECT_FALSE(is_drafter_tensor("norm.weight"));
  EXPECT_FALSE(is_drafter_tensor("embedding.weight"));
  EXPECT_FALSE(is_drafter_tensor("mtp_head.weight"));
}

}  // namespace
}  // namespace dspark
