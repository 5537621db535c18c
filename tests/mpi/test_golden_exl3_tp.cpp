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
#include "tests/support/golden_run.hpp"

namespace dspark {
namespace {

class GoldenExl3Tp : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!test::have_golden(dir_)) GTEST_SKIP() << "no golden case at " << dir_;
    test::run_golden(dir_, backend_, comm_, g_);
  }

  const std::filesystem::path dir_ = test::golden_case_dir("tiny-v41-exl3");
  MpiCommunicator comm_{MPI_COMM_WORLD};
  CpuBackend backend_;
  test::GoldenRun g_;  // last: the weights and drafter go before the backend
};

TEST_F(GoldenExl3Tp, DraftsMeetTheGoldenRuleOnEveryRank) {
  test::expect_exl3_golden_rule(g_.result, g_.expected);
}

TEST_F(GoldenExl3Tp, EveryRankHasTheSameAnswer) {
  test::expect_every_rank_answers_alike(comm_, g_.result);
}

}  // namespace
}  // namespace dspark
