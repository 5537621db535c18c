// The golden case in the released format (shared/golden/tiny-v41-fp8): fp8 block linears and fp4 routed
// experts, read as stored and computed by SPEC §3's quantised numerics on the CPU reference. Drafts must
// match by its README's rule, including its one routing near-tie (stage 2, request 1, position 2).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/core/error.hpp"
#include "lib/core/npy.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/golden_fp8_rule.hpp"
#include "tests/support/golden_run.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark {
namespace {

class GoldenFp8 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_golden(dir_)) GTEST_SKIP() << "no golden case at " << dir_;
    test::run_golden(dir_, backend_, comm_, g_);
  }

  double relative_error(const std::string& name) {
    return test::golden_relative_error(name, g_.trace.at(name), dir_);
  }

  const std::filesystem::path dir_ = test::golden_case_dir("tiny-v41-fp8");
  CpuBackend backend_;
  LocalCommunicator comm_;
  test::GoldenRun g_;  // last: the weights and drafter go before the backend
};

// Largest |got - want| over rows `rows` of a traced [B * k, ...] tensor, relative to the tensor's largest
// |want|.
double rows_error(const std::vector<float>& got, const std::vector<float>& want, const std::vector<int>& rows,
                  int64_t n_rows) {
  const size_t row = want.size() / static_cast<size_t>(n_rows);
  double diff = 0, scale = 0;
  for (float v : want) scale = std::max(scale, double(std::fabs(v)));
  for (int r : rows)
    for (size_t c = 0; c < row; ++c) {
      const size_t i = static_cast<size_t>(r) * row + c;
      diff = std::max(diff, double(std::fabs(got[i] - want[i])));
    }
  return diff / scale;
}

constexpr int kNearTieRow = test::kFp8NearTieRow;

TEST_F(GoldenFp8, StageZeroWithinTheReferencesOwnSpread) {
  // Measured for the reference on another GEMM order: stage 0 within 3e-3 of max.
  for (const char* part : {"block_kv", "attn_out", "after_attn", "route_w", "moe_out", "after_ffn"}) {
    const std::string name = fmt::format("stage0.{}", part);
    EXPECT_LE(relative_error(name), 4e-3) << name;
  }
}

TEST_F(GoldenFp8, RoutingMatchesExceptTheNamedNearTie) {
  test::expect_fp8_routing(g_.trace, g_.cfg.n_mtp_layers, dir_);
}

TEST_F(GoldenFp8, LaterStagesWithinAFewPercent) {
  // README: from stage 1 on, one e4m3 step (2^-3 relative) in a few elements spreads; later intermediates
  // within a few percent of their largest value. The near-tie's row is left out after stage 2's routing.
  std::vector<int> all(10), no_tie;
  for (int r = 0; r < 10; ++r) {
    all[static_cast<size_t>(r)] = r;
    if (r != kNearTieRow) no_tie.push_back(r);
  }
  auto err = [&](const std::string& name, const std::vector<int>& rows) {
    return rows_error(g_.trace.at(name), read_npy(dir_ / "trace" / (name + ".npy")).to_float(), rows, 10);
  };
  for (int64_t i = 1; i < g_.cfg.n_mtp_layers; ++i)
    for (const char* part : {"attn_out", "after_attn", "moe_out", "after_ffn"}) {
      const std::string name = fmt::format("stage{}.{}", i, part);
      EXPECT_LE(
          err(name,
              i == 2 && std::string(part) != "attn_out" && std::string(part) != "after_attn" ? no_tie : all),
          0.08)
          << name;
    }
  for (const char* name : {"head_hidden", "base_logits"}) EXPECT_LE(err(name, no_tie), 0.06) << name;
  // The confidence reads the drafted token: only where the drafts agree (request 0, request 1's first).
  EXPECT_LE(err("conf_logit", {0, 1, 2, 3, 4, 5}), 0.06);
}

TEST_F(GoldenFp8, IdsMatchWhereMarginsAreClearOfTheLogitSpread) {
  test::expect_fp8_ids(g_.result, g_.expected, dir_);
}

TEST_F(GoldenFp8, ConfidenceWithinToleranceWhereTheChainAgrees) {
  const test::Fp8Routing routing = test::expect_fp8_routing(g_.trace, g_.cfg.n_mtp_layers, dir_);
  test::expect_fp8_conf(g_.result, g_.expected, routing, dir_);
}

TEST_F(GoldenFp8, FormatsAreTheReleasedOnes) {
  EXPECT_EQ(g_.weights.stages[0].wq_a.format, WeightFormat::fp8_block);
  EXPECT_EQ(g_.weights.stages[0].wo_a.format, WeightFormat::fp8_block);
  EXPECT_EQ(g_.weights.stages[1].shared.w2.format, WeightFormat::fp8_block);
  EXPECT_EQ(g_.weights.main_proj.format, WeightFormat::fp8_block);
  EXPECT_EQ(g_.weights.stages[2].experts[7].w1.format, WeightFormat::fp4);
  EXPECT_EQ(g_.weights.head.format, WeightFormat::dense);
  // 25 fp8 tensors (weight + scale bytes) and 72 fp4 ones, as the README counts them, plus the dense rest.
  EXPECT_EQ(g_.weights.stages[0].wq_b.scale.shape, (Shape{32, 4}));
}

TEST(GoldenFp8Split, Tp3IsRefusedByTheSplitRule) {
  // 8 heads do not split evenly over 3 ranks (SPEC §5), so no rank gets a plan (tp = 2 and 4:
  // tests/mpi/test_golden_fp8_tp.cpp).
  const std::filesystem::path dir = test::golden_case_dir("tiny-v41-fp8");
  if (!test::have_golden(dir)) GTEST_SKIP() << "no golden case at " << dir;
  const ModelConfig cfg = load_model_config(dir / "ckpt" / "config.json");
  for (int r = 0; r < 3; ++r) {
    try {
      make_shard_plan(cfg, r, 3);
      ADD_FAILURE() << "rank " << r << " of 3 got a plan";
    } catch (const Error& e) {
      EXPECT_STREQ(e.what(), "cannot split 8 attention heads evenly over 3 ranks");
    }
  }
}

}  // namespace
}  // namespace dspark
