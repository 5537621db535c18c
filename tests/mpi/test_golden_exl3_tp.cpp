// The golden case in the seed's EXL3 mix (shared/golden/tiny-v41-exl3) on the CPU backend at tp = N under
// mpirun -np N: each rank loads its 128-aligned shard of every trellis, scale vector and fp8 block weight,
// and every rank's drafts meet the README's rule (ids where the margins are clear, confidences within 2e-2)
// and agree bit for bit across the ranks.
#include <gtest/gtest.h>
#include <mpi.h>

#include <memory>

#include "comm/mpi_communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/config/model_config.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/golden_exl3_rule.hpp"

namespace dspark {
namespace {

class GoldenExl3Tp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_golden(dir_)) GTEST_SKIP() << "no golden case at " << dir_;
    const Checkpoint ckpt(dir_ / "ckpt");
    cfg_ = load_model_config(ckpt.config_path());
    plan_ = make_shard_plan(cfg_, comm_.rank(), comm_.size());
    DrafterOptions opt;
    opt.slots = 2;
    opt.max_batch = 4;
    weights_ = load_drafter_weights(ckpt, cfg_, plan_, backend_);
    drafter_ = std::make_unique<Drafter>(cfg_, weights_, plan_, backend_, comm_, opt);
    test::insert_golden_rows(*drafter_, 2, dir_);
    result_ = drafter_->draft(test::golden_requests(dir_));
    expected_ = test::golden_expected(dir_);
  }

  const std::filesystem::path dir_ = test::golden_case_dir("tiny-v41-exl3");
  MpiCommunicator comm_{MPI_COMM_WORLD};
  CpuBackend backend_;
  ModelConfig cfg_;
  ShardPlan plan_;
  DrafterWeights weights_;
  std::unique_ptr<Drafter> drafter_;
  DraftResult result_;
  nlohmann::json expected_;
};

TEST_F(GoldenExl3Tp, DraftsMeetTheGoldenRuleOnEveryRank) {
  test::expect_exl3_golden_rule(result_, expected_);
}

TEST_F(GoldenExl3Tp, EveryRankHasTheSameAnswer) {
  const size_t n = result_.ids.size();
  std::vector<int32_t> ids(n * static_cast<size_t>(comm_.size()));
  std::vector<float> conf(ids.size());
  comm_.all_gather(result_.ids.data(), ids.data(), n * sizeof(int32_t));
  comm_.all_gather(result_.conf.data(), conf.data(), n * sizeof(float));
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(ids[i], result_.ids[i % n]) << i;
    EXPECT_EQ(conf[i], result_.conf[i % n]) << i;
  }
}

}  // namespace
}  // namespace dspark
