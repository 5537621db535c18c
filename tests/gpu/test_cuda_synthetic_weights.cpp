// The bench's GPU-generated synthetic weights (lib/bench/device_weights.cpp, kernels/cuda/fill_random.cu)
// against dspark_make_ckpt's generator (synthetic_values, lib/checkpoint/synthetic.cpp): the same bits for
// one seed, whole (tp 1) and as a rank's rows or columns of the whole tensor (tp 2).
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/bench/cuda/device_weights.hpp"
#include "lib/checkpoint/synthetic.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/error.hpp"
#include "lib/model/shard_plan.hpp"
#include "lib/model/tensor_split.hpp"
#include "lib/model/weights.hpp"

namespace dspark {
namespace {

constexpr uint64_t kSeed = 7;

const DrafterTensor& table_entry(const std::vector<DrafterTensor>& table, const std::string& name) {
  for (const DrafterTensor& t : table)
    if (t.name == name) return t;
  fail("no tensor '{}' in the table", name);
}

// synthetic_values() of this rank's part of t, each element at its row-major index in the whole tensor:
// replicated or rows [begin, begin + count) (1-D: elements) in one run, columns [begin, begin + count) row by
// row.
std::vector<uint8_t> cpu_part(const DrafterTensor& t, const TensorSplit& s) {
  const size_t esz = dtype_size(t.dense_dtype);
  const int64_t rows = t.shape[0], cols = t.shape.size() == 2 ? t.shape[1] : 1;
  std::vector<uint8_t> out(static_cast<size_t>(split_numel(t, s)) * esz);
  if (s.kind == TensorSplit::Kind::cols) {
    for (int64_t r = 0; r < rows; ++r)
      synthetic_values(t, kSeed, r * cols + s.begin, s.count,
                       out.data() + static_cast<size_t>(r * s.count) * esz);
  } else {
    synthetic_values(t, kSeed, s.begin * cols, s.count * cols, out.data());
  }
  return out;
}

// The tensors compared, by table name, and where DrafterWeights holds them: bf16 and f32, whole, cut into
// rows and into columns, with gains near 1 and with 3 elements.
struct Picked {
  std::string name;
  const Tensor* tensor;
};
std::vector<Picked> picked(const ModelConfig& cfg, const DrafterWeights& w) {
  const StageWeights &s0 = w.stages.at(0), &s1 = w.stages.at(1), &last = w.stages.back();
  const std::string p0 = stage_prefix(0), pl = stage_prefix(cfg.n_mtp_layers - 1);
  return {
      {"embed.weight", &w.embed},                                 // bf16, replicated
      {"head.weight", &w.head.weight},                            // bf16, vocabulary rows
      {p0 + "attn.wq_b", &s0.wq_b.weight},                        // bf16, head rows
      {p0 + "attn.wo_b", &s0.wo_b.weight},                        // bf16, group columns
      {p0 + "attn_norm.weight", &s0.attn_norm},                   // bf16, mean 1
      {p0 + "hc_attn_fn", &s0.hc_attn.fn},                        // f32 matrix
      {p0 + "hc_ffn_scale", &s0.hc_ffn.scale},                    // f32, 3 elements
      {p0 + "ffn.gate.bias", &s0.gate_bias},                      // f32 vector
      {expert_prefix(1, 3) + "w2", &s1.experts.at(3).w2.weight},  // bf16, intermediate columns
      {shared_expert_prefix(1) + "w1", &s1.shared.w1.weight},     // bf16, intermediate rows
      {pl + "attn.attn_sink", &last.attn_sink},                   // f32, head elements
      {pl + "markov_head.embed.weight", &w.markov_embed},         // bf16, replicated
      {pl + "markov_head.head.weight", &w.markov_head},           // bf16, vocabulary rows
      {pl + "confidence_head.proj.weight", &w.confidence_proj},   // bf16 [1, H + R]
  };
}

class CudaSyntheticWeights : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
    gpu_ = std::make_unique<CudaBackend>(0);
  }

  // Rank `rank` of `ranks`' weights from generate_device_weights, against the CPU generator's values of the
  // same parts.
  void expect_same_bits(const ModelConfig& cfg, int rank, int ranks) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " of " + std::to_string(ranks));
    const ShardPlan plan = make_shard_plan(cfg, rank, ranks);
    const DrafterWeights w = bench::generate_device_weights(cfg, plan, *gpu_, kSeed);
    const std::vector<DrafterTensor> table = drafter_tensors(cfg);
    for (const Picked& p : picked(cfg, w)) {
      SCOPED_TRACE(p.name);
      const DrafterTensor& t = table_entry(table, p.name);
      const TensorSplit split = tensor_split(t, cfg, plan);
      const std::vector<uint8_t> want = cpu_part(t, split);
      ASSERT_EQ(p.tensor->dtype, t.dense_dtype);
      ASSERT_EQ(p.tensor->nbytes(), want.size());
      std::vector<uint8_t> got(want.size());
      gpu_->download(got.data(), *p.tensor);
      const size_t esz = dtype_size(t.dense_dtype);
      size_t differ = 0, first = 0;
      for (size_t i = 0; i < want.size(); i += esz)
        if (std::memcmp(want.data() + i, got.data() + i, esz) != 0 && differ++ == 0) first = i / esz;
      EXPECT_EQ(differ, 0u) << differ << " of " << want.size() / esz << " elements differ, the first at "
                            << first;
    }
  }

  std::unique_ptr<CudaBackend> gpu_;
};

TEST_F(CudaSyntheticWeights, WholeTensorsHaveTheCheckpointGeneratorsBits) {
  expect_same_bits(tiny_model_config(), 0, 1);
}

TEST_F(CudaSyntheticWeights, RankPartsHoldTheWholeTensorsBitsAtTheirOffsets) {
  // An odd vocabulary and Markov rank: at tp 2 the vocabulary splits 512 + 489 rows, so markov_embed
  // [1001, 33], rank 1's markov_head [489, 33] and confidence_proj [1, 289] have odd element counts.
  ModelConfig cfg = tiny_model_config();
  cfg.vocab_size = 1001;
  cfg.markov_rank = 33;
  expect_same_bits(cfg, 0, 2);
  expect_same_bits(cfg, 1, 2);
}

}  // namespace
}  // namespace dspark
