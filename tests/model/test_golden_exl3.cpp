// The golden case in the seed's EXL3 mix (shared/golden/tiny-v41-exl3): EXL3 trellis linears (the head,
// main_proj, attention, shared and routed experts, codebook MUL1), wo_a in fp8 block, the rest dense, read as
// stored and computed by SPEC §9's forward on the CPU reference. Its README's rule: ids wherever the margins
// (all above 0.08 here) are clear, confidences within 2e-2, routing identical (no near-tie closer than
// 5.9e-3), stage 0 within a few bf16 ulps, later stages within a few percent.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/npy.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/golden_exl3_rule.hpp"
#include "tests/support/golden_run.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark {
namespace {

class GoldenExl3 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_golden(dir_)) GTEST_SKIP() << "no golden case at " << dir_;
    test::run_golden(dir_, backend_, comm_, g_);
  }

  const std::filesystem::path dir_ = test::golden_case_dir("tiny-v41-exl3");
  CpuBackend backend_;
  LocalCommunicator comm_;
  test::GoldenRun g_;  // last: the weights and drafter go before the backend
};

TEST_F(GoldenExl3, EveryFormatOfTheMixIsReadAsStored) {
  EXPECT_EQ(g_.weights.head.format, WeightFormat::exl3);
  EXPECT_EQ(g_.weights.head.bits, 6);
  EXPECT_EQ(g_.weights.main_proj.bits, 5);
  const StageWeights& s = g_.weights.stages[1];
  for (const LinearWeight* l :
       {&s.wq_a, &s.wkv, &s.wq_b, &s.wo_b, &s.shared.w1, &s.shared.w3, &s.shared.w2}) {
    EXPECT_EQ(l->format, WeightFormat::exl3) << l->name;
    EXPECT_EQ(l->bits, 4) << l->name;
    EXPECT_EQ(l->codebook, Exl3Codebook::mul1) << l->name;
  }
  EXPECT_EQ(s.experts[3].w2.bits, 2);
  EXPECT_EQ(s.experts[3].w2.weight.shape, (Shape{512 / 16, 256 / 16, 32}));  // [in/16, out/16, 16K]
  EXPECT_EQ(s.wo_a.format, WeightFormat::fp8_block);
  EXPECT_EQ(s.gate.dtype, DType::bf16);
}

TEST_F(GoldenExl3, RoutingIsTheExpectedOneInEveryStage) {
  for (int64_t i = 0; i < g_.cfg.n_mtp_layers; ++i) {
    const std::string name = fmt::format("stage{}.route_ids", i);
    const std::vector<int64_t> want = read_npy(dir_ / "trace" / (name + ".npy")).to_int64();
    const std::vector<float>& got = g_.trace.at(name);
    ASSERT_EQ(got.size(), want.size()) << name;
    for (size_t n = 0; n < want.size(); ++n)
      EXPECT_EQ(static_cast<int64_t>(got[n]), want[n]) << name << " " << n;
  }
}

TEST_F(GoldenExl3, StageZeroWithinAFewBf16UlpsAndLaterStagesWithinAFewPercent) {
  // README, measured for the reference on another GEMM order: stage 0 within 6e-3 of max (this
  // backend: 7.8e-3 in moe_out, two bf16 ulps); stage 2's block_kv off by up to 7 % of max in 15 % of its
  // elements; base logits within 0.7 %.
  for (const char* part : {"block_kv", "attn_out", "after_attn", "route_w", "moe_out", "after_ffn"}) {
    const std::string name = fmt::format("stage0.{}", part);
    EXPECT_LE(test::golden_relative_error(name, g_.trace.at(name), dir_), 1e-2) << name;
  }
  for (int64_t i = 1; i < g_.cfg.n_mtp_layers; ++i)
    for (const char* part : {"block_kv", "attn_out", "after_attn", "moe_out", "after_ffn"}) {
      const std::string name = fmt::format("stage{}.{}", i, part);
      EXPECT_LE(test::golden_relative_error(name, g_.trace.at(name), dir_), 0.08) << name;
    }
  for (const char* name : {"head_hidden", "base_logits", "conf_logit"})
    EXPECT_LE(test::golden_relative_error(name, g_.trace.at(name), dir_), 0.03) << name;
}

TEST_F(GoldenExl3, IdsAndConfidencesMeetTheReadmesRule) {
  test::expect_exl3_golden_rule(g_.result, g_.expected);
}

}  // namespace
}  // namespace dspark
