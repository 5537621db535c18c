// The draft with its exchanges replaced by local copies (dspark_bench --exchange-cost) on the CUDA backend at
// one rank: learned from eager drafts, the copies recorded into the draft graphs and replayed, the drafts
// are the plain drafter's, bit for bit, and every exchange of a replayed step is a copy.
#include <gtest/gtest.h>

#include <memory>
#include <random>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/bench/local_exchanges.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

TEST(CudaLocalExchanges, ReplayedDraftsWithLocalCopiesAreThePlainDrafts) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  CudaBackend gpu(0);
  const Checkpoint ckpt(test::tiny_checkpoint());
  const ModelConfig cfg = load_model_config(ckpt.config_path());
  const ShardPlan plan = make_shard_plan(cfg, 0, 1);
  LocalCommunicator local;
  bench::LocalExchangeCommunicator lx(local, gpu);
  DrafterOptions opt;
  opt.slots = 4;
  opt.max_batch = 4;
  opt.use_graphs = true;
  opt.graph_batch_sizes = {2, 4};
  Drafter plain(cfg, load_drafter_weights(ckpt, cfg, plan, gpu), plan, gpu, local, opt);
  Drafter copies(cfg, load_drafter_weights(ckpt, cfg, plan, gpu), plan, gpu, lx, opt);
  plain.capture_graphs();

  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  std::vector<bf16_t> rows(static_cast<size_t>(4 * 12 * cfg.row_dim()));
  for (auto& v : rows) v = float_to_bf16(normal(rng));
  std::vector<DraftRequest> four;
  for (int32_t s = 0; s < 4; ++s) {
    plain.insert(s, 0, rows.data() + s * 12 * cfg.row_dim(), 12);
    copies.insert(s, 0, rows.data() + s * 12 * cfg.row_dim(), 12);
    four.push_back({s, static_cast<int32_t>(rng() % cfg.vocab_size), 12, -1, 0});
  }
  const std::vector<DraftRequest> two(four.begin(), four.begin() + 2);

  // Learned eagerly (a trace turns the recordings off), then recorded with the copies.
  copies.set_trace([](const std::string&, const Tensor&) {});
  (void)copies.draft(two);
  (void)copies.draft(four);
  copies.set_trace({});
  const int64_t exchanges = 2 * cfg.n_mtp_layers + cfg.block_size;
  ASSERT_EQ(lx.learned(), 2 * exchanges);
  lx.set_mode(bench::LocalExchangeCommunicator::Mode::local);
  copies.capture_graphs();
  const int64_t copied_while_recording = lx.copied();

  const std::vector<DraftRequest>* const order[] = {&four, &two, &four};
  for (const std::vector<DraftRequest>* reqs : order) {
    const DraftResult want = plain.draft(*reqs), got = copies.draft(*reqs);
    EXPECT_EQ(got.ids, want.ids) << reqs->size() << " requests";
    EXPECT_EQ(got.margin, want.margin) << reqs->size() << " requests";
    EXPECT_EQ(got.conf_logit, want.conf_logit) << reqs->size() << " requests";
  }
  EXPECT_EQ(copies.graph_counts().draft_replays, 3);  // replays: no call reaches the communicator
  EXPECT_EQ(lx.copied(), copied_while_recording);
  EXPECT_EQ(lx.learned(), 2 * exchanges);
}

}  // namespace
}  // namespace dspark
