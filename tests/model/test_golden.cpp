// The golden case (shared/golden/tiny-v41): a checkpoint, context rows and one draft batch computed by an
// independent implementation of DeepSeek's V4.1 numerics. Drafts must match by the README's rule, and the
// per-stage trace localises an op at fault when they do not.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
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
#include "tests/support/tensor_host.hpp"

namespace dspark {
namespace {

class Golden : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_golden()) GTEST_SKIP() << "no golden case at " << test::golden_dir();
    Checkpoint ckpt(test::golden_dir() / "ckpt");
    cfg_ = load_model_config(ckpt.config_path());
    const ShardPlan plan = make_shard_plan(cfg_, 0, 1);
    DrafterOptions opt;
    opt.slots = 2;
    opt.max_batch = 4;
    drafter_ = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan, backend_), plan,
                                         backend_, comm_, opt);
    test::insert_golden_rows(*drafter_);
    requests_ = test::golden_requests();
    expected_ = test::golden_expected();
    drafter_->set_trace(
        [this](const std::string& name, const Tensor& t) { trace_[name] = test::to_floats(backend_, t); });
    result_ = drafter_->draft(requests_);
  }

  double relative_error(const std::string& name) {
    return test::golden_relative_error(name, trace_.at(name));
  }

  CpuBackend backend_;
  LocalCommunicator comm_;
  ModelConfig cfg_;
  std::unique_ptr<Drafter> drafter_;
  std::vector<DraftRequest> requests_;
  nlohmann::json expected_;
  std::map<std::string, std::vector<float>> trace_;
  DraftResult result_;
};

TEST_F(Golden, IdsMatchWhereMarginsAreClear) {
  const int64_t k = result_.k;
  for (size_t b = 0; b < requests_.size(); ++b) {
    bool clear = true;
    for (int64_t j = 0; j < k; ++j) {
      clear = clear && expected_["margin"][b][j].get<double>() > 1e-3;
      if (!clear) break;  // a near-tie here frees every later position
      EXPECT_EQ(result_.ids[b * k + j], expected_["ids"][b][j].get<int32_t>())
          << "request " << b << " position " << j;
    }
  }
}

TEST_F(Golden, ConfidenceAndMarginWithinTolerance) {
  const int64_t k = result_.k;
  for (size_t b = 0; b < requests_.size(); ++b)
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_NEAR(result_.conf[b * k + j], expected_["conf"][b][j].get<double>(), 2e-2) << b << "," << j;
      EXPECT_NEAR(result_.margin[b * k + j], expected_["margin"][b][j].get<double>(), 2e-2) << b << "," << j;
    }
}

TEST_F(Golden, RoutingMatchesEveryStage) {
  for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i) {
    const std::string name = fmt::format("stage{}.route_ids", i);
    const std::vector<int64_t> want = read_npy(test::golden_dir() / "trace" / (name + ".npy")).to_int64();
    const std::vector<float>& got = trace_.at(name);
    ASSERT_EQ(got.size(), want.size());
    for (size_t n = 0; n < want.size(); ++n)
      EXPECT_EQ(static_cast<int64_t>(got[n]), want[n]) << name << " [" << n << "]";
  }
}

TEST_F(Golden, BlockKvWithinOneFp8Step) {
  // kv_qdq snaps to fp8: the few-ulp upstream differences of the other intermediates (relative to the block's
  // largest value) may move a value across a rounding boundary, adding one e4m3 step (3 mantissa bits) at the
  // element's magnitude. Most elements must be identical.
  const int64_t block = cfg_.weight_block_size;
  for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i) {
    const std::string name = fmt::format("stage{}.block_kv", i);
    const std::vector<float> want = read_npy(test::golden_dir() / "trace" / (name + ".npy")).to_float();
    const std::vector<float>& got = trace_.at(name);
    ASSERT_EQ(got.size(), want.size());
    size_t differ = 0;
    for (size_t n = 0; n < want.size(); ++n) {
      if (got[n] == want[n]) continue;
      ++differ;
      const size_t b0 = n / block * block;
      float block_max = 0;
      for (size_t m = b0; m < b0 + block; ++m) block_max = std::max(block_max, std::fabs(want[m]));
      const float mag = std::max(std::fabs(got[n]), std::fabs(want[n]));
      const float bound = std::ldexp(1.0f, std::ilogb(mag) - 3) + 4.0f / 256.0f * block_max;
      EXPECT_LE(std::fabs(got[n] - want[n]), bound) << name << " [" << n << "]";
    }
    EXPECT_LE(differ, want.size() / 10) << name;  // measured: 0 / 4 / 74 of 1280 per stage
  }
}

TEST_F(Golden, StageTraceWithinFewBf16Ulps) {
  // One bf16 ulp is 2^-8 relative: a few ulps of the tensor's scale bound each intermediate.
  constexpr double kTol = 4.0 / 256.0;
  for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i)
    for (const char* part : {"attn_out", "after_attn", "route_w", "moe_out", "after_ffn"}) {
      const std::string name = fmt::format("stage{}.{}", i, part);
      EXPECT_LE(relative_error(name), kTol) << name;
    }
  EXPECT_LE(relative_error("head_hidden"), kTol);
  EXPECT_LE(relative_error("base_logits"), kTol);
  EXPECT_LE(relative_error("conf_logit"), kTol);
}

}  // namespace
}  // namespace dspark
