// The fixture of the golden cases on the CUDA backend (tests/gpu/test_cuda_golden_*.cpp): the case's drafter
// on the CPU reference and on the GPU (tp 1, 2 slots of its rows, eager), its requests and expected answer,
// and the check that graph replays give the eager bits.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/gpu/draft_compare.hpp"
#include "tests/support/golden_case.hpp"

namespace dspark::test {

// The case's drafter on `be` at tp 1, graphs recorded for batch 2 when `graphs`, the case's rows inserted.
inline std::unique_ptr<Drafter> golden_drafter(const std::filesystem::path& dir, Backend& be,
                                               Communicator& comm, bool graphs) {
  const Checkpoint ckpt(dir / "ckpt");
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const ShardPlan plan = make_shard_plan(cfg, 0, 1);
  DrafterOptions opt;
  opt.slots = 2;
  opt.max_batch = 4;
  opt.use_graphs = graphs;
  opt.graph_batch_sizes = {2};
  auto d = std::make_unique<Drafter>(cfg, load_drafter_weights(ckpt, cfg, plan, be), plan, be, comm, opt);
  d->capture_graphs();
  insert_golden_rows(*d, 2, dir);
  return d;
}

class CudaGoldenCase : public ::testing::Test {
 protected:
  explicit CudaGoldenCase(const char* name) : dir_(golden_case_dir(name)) {}

  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
    if (!have_golden(dir_)) GTEST_SKIP() << "no golden case at " << dir_;
    gpu_ = std::make_unique<CudaBackend>(0);
    cfg_ = load_model_config(Checkpoint(dir_ / "ckpt").config_path());
    cpu_d_ = golden_drafter(dir_, cpu_, local_, false);
    gpu_d_ = golden_drafter(dir_, *gpu_, local_, false);
    requests_ = golden_requests(dir_);
    expected_ = golden_expected(dir_);
  }

  // The GPU's drafts and traced intermediates against the CPU's by draft_compare.hpp's `rule`.
  void expect_drafts_agree_with_the_cpu(const AgreeRule& rule) {
    expect_drafters_agree(cfg_, *cpu_d_, cpu_, *gpu_d_, *gpu_, requests_, rule);
  }

  // Two replays of a graphed drafter of the case answer the eager GPU drafter's bits.
  void expect_graph_replays_equal_eager() {
    auto graphed = golden_drafter(dir_, *gpu_, local_, true);
    const DraftResult eager = gpu_d_->draft(requests_);
    for (int round = 0; round < 2; ++round) {
      const DraftResult g = graphed->draft(requests_);
      EXPECT_EQ(g.ids, eager.ids) << "round " << round;
      EXPECT_EQ(g.conf, eager.conf) << "round " << round;
      EXPECT_EQ(g.margin, eager.margin) << "round " << round;
    }
    EXPECT_EQ(graphed->graph_counts().draft_replays, 2);
  }

  const std::filesystem::path dir_;
  CpuBackend cpu_;
  std::unique_ptr<CudaBackend> gpu_;
  LocalCommunicator local_;
  ModelConfig cfg_;
  std::unique_ptr<Drafter> cpu_d_, gpu_d_;
  std::vector<DraftRequest> requests_;
  nlohmann::json expected_;
};

}  // namespace dspark::test
