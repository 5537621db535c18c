// The whole Drafter on the CUDA backend against the CPU reference (tiny synthetic checkpoint, same inserts,
// one batch of 4 requests; rule in draft_compare.hpp), its determinism, and the golden case
// (shared/golden/tiny-v41) through the CUDA backend by the golden README's rule.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include <nlohmann/json.hpp>

#include "kernels/cpu/cpu_backend.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/api/step_plan.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/npy.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/gpu/draft_compare.hpp"
#include "tests/support/golden_case.hpp"
#include "tests/support/sampled_draws.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

// Every drafter has the same buckets (graphs or not, the CUDA backend runs an insert chunk as its bucket, so
// eager and replayed inserts compute the same shapes): drafts of B = 2 and 4 are recorded, inserts run as 8
// or 32 rows (7 -> 8, 16, 23 and 25 -> 32; 15 -> 32).
std::unique_ptr<Drafter> make_drafter(const Checkpoint& ckpt, const ModelConfig& cfg, Backend& be,
                                      Communicator& comm, int64_t slots, bool graphs = false,
                                      std::vector<std::pair<int64_t, int64_t>> step_pairs = {},
                                      std::vector<int32_t> markov_cache_tokens = {}) {
  const ShardPlan plan = make_shard_plan(cfg, 0, 1);
  DrafterOptions opt;
  opt.slots = slots;
  opt.max_batch = 4;
  opt.max_insert_rows = 32;
  opt.use_graphs = graphs;
  opt.graph_batch_sizes = {2, 4};
  opt.insert_row_buckets = {8, 32};
  opt.step_graph_pairs = std::move(step_pairs);
  opt.markov_cache_tokens = std::move(markov_cache_tokens);
  auto d = std::make_unique<Drafter>(cfg, load_drafter_weights(ckpt, cfg, plan, be), plan, be, comm, opt);
  d->capture_graphs();
  return d;
}

class CudaDrafter : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
    gpu_ = std::make_unique<CudaBackend>(0);
    const Checkpoint ckpt(test::tiny_checkpoint());
    cfg_ = load_model_config(ckpt.config_path());
    cpu_d_ = make_drafter(ckpt, cfg_, cpu_, local_, 4);
    gpu_d_ = make_drafter(ckpt, cfg_, *gpu_, local_, 4);
    std::mt19937 rng(5);
    std::normal_distribution<float> normal;
    for (int s = 0; s < 4; ++s) {
      rows_[s].resize(static_cast<size_t>(kRows[s] * cfg_.row_dim()));
      for (auto& v : rows_[s]) v = float_to_bf16(normal(rng));
    }
    insert_context(*cpu_d_);
    insert_context(*gpu_d_);
    // Request 1 drafts k' = 3; request 2 raises its window's low end.
    for (int s = 0; s < 4; ++s)
      batch_.push_back({s, static_cast<int32_t>(rng() % cfg_.vocab_size), static_cast<int32_t>(kRows[s]),
                        s == 2 ? 12 : -1, s == 1 ? 3 : 0});
  }

  // Slot 3's 40 rows (more than W = 16: the ring wraps) arrive in two inserts.
  void insert_context(Drafter& d) const {
    for (int s = 0; s < 4; ++s) {
      const int64_t first = s == 3 ? 25 : kRows[s];
      d.insert(s, 0, rows_[s].data(), first);
      if (first < kRows[s]) d.insert(s, first, rows_[s].data() + first * cfg_.row_dim(), kRows[s] - first);
    }
  }

  static constexpr int64_t kRows[4] = {7, 16, 23, 40};
  std::vector<bf16_t> rows_[4];
  CpuBackend cpu_;
  std::unique_ptr<CudaBackend> gpu_;
  LocalCommunicator local_;
  ModelConfig cfg_;
  std::unique_ptr<Drafter> cpu_d_, gpu_d_;
  std::vector<DraftRequest> batch_;
};

TEST_F(CudaDrafter, DraftsAgreeWithTheCpuOutsideNearTies) {
  test::expect_drafters_agree(cfg_, *cpu_d_, cpu_, *gpu_d_, *gpu_, batch_);
}

TEST_F(CudaDrafter, GraphReplaysEqualEagerDrafts) {
  // A second GPU drafter that recorded its buckets at construction and replays them, fed the same inserts.
  const Checkpoint ckpt(test::tiny_checkpoint());
  auto graphed = make_drafter(ckpt, cfg_, *gpu_, local_, 4, true);
  const GraphCounts recorded = graphed->graph_counts();
  EXPECT_EQ(recorded.draft_graphs, 2 * 2 * cfg_.block_size);  // B = 2, 4 x k' = 1 .. k, greedy and sampled
  EXPECT_EQ(recorded.insert_graphs, 2);
  insert_context(*graphed);
  EXPECT_EQ(graphed->graph_counts().insert_replays, 5);  // every chunk fits a bucket
  EXPECT_EQ(graphed->graph_counts().insert_eager, 0);
  EXPECT_EQ(gpu_d_->graph_counts().insert_replays, 0);  // the eager drafter recorded nothing
  EXPECT_EQ(gpu_d_->graph_counts().insert_eager, 5);

  const DraftResult eager = gpu_d_->draft(batch_);
  for (int round = 0; round < 3; ++round) {
    const DraftResult g = graphed->draft(batch_);
    EXPECT_EQ(g.ids, eager.ids) << "round " << round;
    EXPECT_EQ(g.conf, eager.conf) << "round " << round;
    EXPECT_EQ(g.margin, eager.margin) << "round " << round;
  }
  EXPECT_EQ(graphed->graph_counts().draft_replays, 3);
  // Another batch size and k' replays its own recording; different request data replays it correctly.
  std::vector<DraftRequest> two(batch_.begin(), batch_.begin() + 2);
  two[0].anchor_token = 77;
  const DraftResult e2 = gpu_d_->draft(two), g2 = graphed->draft(two);
  EXPECT_EQ(g2.ids, e2.ids);
  EXPECT_EQ(g2.conf, e2.conf);
  two[0].anchor_token = 78;
  EXPECT_EQ(graphed->draft(two).ids, gpu_d_->draft(two).ids);
  EXPECT_EQ(graphed->graph_counts().draft_replays, 5);
  // B = 3 has no recording: it runs eagerly, with the eager drafter's bits.
  const std::vector<DraftRequest> three(batch_.begin(), batch_.begin() + 3);
  const DraftResult e3 = gpu_d_->draft(three), g3 = graphed->draft(three);
  EXPECT_EQ(g3.ids, e3.ids);
  EXPECT_EQ(g3.conf, e3.conf);
  EXPECT_EQ(graphed->graph_counts().draft_replays, 5);
  EXPECT_EQ(graphed->graph_counts().draft_eager, 1);
}

TEST_F(CudaDrafter, MarkovCacheGivesTheComputedDraftsBitsEagerAndReplayed) {
  // Drafters with a Markov bias cache (every token: no position reads markov_head; and the batch's anchors
  // only), eager and from recordings, against the eager drafter without one.
  const Checkpoint ckpt(test::tiny_checkpoint());
  std::vector<int32_t> every(static_cast<size_t>(cfg_.vocab_size)), anchors;
  for (size_t t = 0; t < every.size(); ++t) every[t] = static_cast<int32_t>(t);
  for (const DraftRequest& r : batch_)
    if (std::find(anchors.begin(), anchors.end(), r.anchor_token) == anchors.end())
      anchors.push_back(r.anchor_token);
  const DraftResult plain = gpu_d_->draft(batch_);
  for (const std::vector<int32_t>* tokens : {&every, &anchors})
    for (const bool graphs : {false, true}) {
      SCOPED_TRACE(testing::Message() << tokens->size() << " cached tokens, graphs " << graphs);
      auto cached = make_drafter(ckpt, cfg_, *gpu_, local_, 4, graphs, {}, *tokens);
      insert_context(*cached);
      const DraftResult r = cached->draft(batch_);
      EXPECT_EQ(r.ids, plain.ids);
      EXPECT_EQ(r.conf, plain.conf);
      EXPECT_EQ(r.margin, plain.margin);
      EXPECT_GE(r.markov_hits, static_cast<int64_t>(batch_.size()));
      if (tokens == &every) {
        EXPECT_EQ(r.markov_hits, r.markov_lookups);
      }
    }
}

// Sampled requests (tau 0.9, 1.3 and 0.6; one greedy; one asking for its whole distribution): the CPU's
// draws are Gumbel-max over its traced logits (test::recompute_draws); the GPU draws the same tokens
// wherever the perturbed scores' top two are further apart than the backends' logit difference, with q and
// the distribution within rounding, its distribution holding its own q at the token bit for bit; and its
// recordings replay its eager draws bit for bit.
TEST_F(CudaDrafter, SampledDraftsAgreeWithTheCpuAndReplayTheirEagerBits) {
  std::vector<DraftRequest> batch = batch_;
  const float taus[4] = {0.9f, 0.0f, 1.3f, 0.6f};
  for (size_t r = 0; r < batch.size(); ++r) {
    batch[r].temperature = taus[r];
    batch[r].seed = 7 + 1000 * r;
  }
  batch[0].distribution = true;
  test::Trace tc;
  cpu_d_->set_trace(test::record_into(cpu_, tc));
  const DraftResult a = cpu_d_->draft(batch), b = gpu_d_->draft(batch);
  cpu_d_->set_trace({});
  const int64_t k = a.k, V = cfg_.vocab_size;
  const auto draws = test::recompute_draws(cpu_, cpu_d_->weights(), V, batch, a, tc.at("base_logits"));
  int compared = 0;
  for (size_t r = 0; r < batch.size(); ++r) {
    if (taus[r] == 0.0f) continue;
    const int64_t outputs = batch[r].outputs == 0 ? k : batch[r].outputs;
    for (int64_t j = 0; j < outputs; ++j) {
      const size_t t = r * k + static_cast<size_t>(j);
      const test::SampledPosition& p = draws[r][static_cast<size_t>(j)];
      ASSERT_EQ(a.ids[t], p.token) << "cpu request " << r << " position " << j;
      if (r == 0) {
        const float* qg = b.distribution.data() + j * V;
        EXPECT_EQ(qg[b.ids[t]], b.q[t]) << j;
      }
      if (p.gap <= test::kMarginThreshold / taus[r]) break;  // a near-tie: later positions may differ
      EXPECT_EQ(b.ids[t], a.ids[t]) << "request " << r << " position " << j;
      EXPECT_NEAR(b.q[t], a.q[t], 0.15 * a.q[t] + 1e-4);
      if (r == 0) {
        for (int64_t v = 0; v < V; ++v) {
          ASSERT_NEAR(b.distribution[static_cast<size_t>(j * V + v)], p.dist[static_cast<size_t>(v)],
                      0.15 * p.dist[static_cast<size_t>(v)] + 1e-4)
              << j << " " << v;
        }
      }
      ++compared;
    }
  }
  EXPECT_GE(compared, 5);
  // The greedy request is the greedy batch's.
  const DraftResult g = gpu_d_->draft(batch_);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(b.ids[k + j], g.ids[k + j]) << j;
  // Recordings replay the eager bits, the distribution pass included.
  const Checkpoint ckpt(test::tiny_checkpoint());
  auto graphed = make_drafter(ckpt, cfg_, *gpu_, local_, 4, true);
  insert_context(*graphed);
  const DraftResult replayed = graphed->draft(batch);
  EXPECT_EQ(graphed->graph_counts().draft_replays, 1);
  EXPECT_EQ(replayed.ids, b.ids);
  EXPECT_EQ(replayed.q, b.q);
  EXPECT_EQ(replayed.margin, b.margin);
  EXPECT_EQ(replayed.distribution, b.distribution);
}

TEST_F(CudaDrafter, StepRecordingsEqualEagerInsertsAndDrafts) {
  // A drafter recording (8 rows, B = 2) steps: a step of 4 + 3 rows of two slots and their draft is one
  // replay, with the bits of the eager drafter's separate insert and draft.
  const Checkpoint ckpt(test::tiny_checkpoint());
  auto graphed = make_drafter(ckpt, cfg_, *gpu_, local_, 4, true, {{8, 2}});
  EXPECT_EQ(graphed->graph_counts().step_graphs, 2 * cfg_.block_size);  // greedy and sampled
  insert_context(*graphed);
  std::mt19937 rng(9);
  std::normal_distribution<float> normal;
  std::vector<bf16_t> rows(static_cast<size_t>(7 * cfg_.row_dim()));
  for (int round = 0; round < 3; ++round) {
    for (auto& v : rows) v = float_to_bf16(normal(rng));
    const int32_t p0 = static_cast<int32_t>(kRows[0] + 4 * round),
                  p1 = static_cast<int32_t>(kRows[1] + 3 * round);
    const std::vector<ContextBlock> blocks = {{0, p0, 4}, {1, p1, 3}};
    const std::vector<DraftRequest> two = {{0, 5, p0 + 4, -1, 0}, {1, 6, p1 + 3, -1, 0}};
    const DraftResult e = gpu_d_->insert_and_draft(blocks, rows.data(), two, true);
    const DraftResult g = graphed->insert_and_draft(blocks, rows.data(), two, true);
    EXPECT_EQ(g.ids, e.ids) << "round " << round;
    EXPECT_EQ(g.conf, e.conf) << "round " << round;
    EXPECT_EQ(g.margin, e.margin) << "round " << round;
    // Rows of that step only: a later draft sees the same rings.
    EXPECT_EQ(graphed->draft(batch_).conf, gpu_d_->draft(batch_).conf) << "round " << round;
  }
  EXPECT_EQ(graphed->graph_counts().step_replays, 3);
  EXPECT_EQ(gpu_d_->graph_counts().step_replays, 0);
  // 12 rows (bucket 32) have no step recording: an insert replay and a draft replay.
  const GraphCounts before = graphed->graph_counts();
  std::vector<bf16_t> more(static_cast<size_t>(12 * cfg_.row_dim()), float_to_bf16(0.5f));
  const std::vector<ContextBlock> big = {{2, static_cast<int32_t>(kRows[2]), 12}};
  const std::vector<DraftRequest> two = {{2, 5, static_cast<int32_t>(kRows[2] + 12), -1, 0},
                                         {3, 6, 40, -1, 0}};
  EXPECT_EQ(graphed->insert_and_draft(big, more.data(), two, true).ids,
            gpu_d_->insert_and_draft(big, more.data(), two, true).ids);
  EXPECT_EQ(graphed->graph_counts().step_replays, before.step_replays);
  EXPECT_EQ(graphed->graph_counts().insert_replays, before.insert_replays + 1);
  EXPECT_EQ(graphed->graph_counts().draft_replays, before.draft_replays + 1);
}

TEST_F(CudaDrafter, RowsInPageLockedMemoryAreReadInPlaceWithTheBitsOfStagedRows) {
  // Rows in row memory (page-locked and mapped: the CUDA backend installed its provider) are read where they
  // lie; rows in a plain vector are copied into the staging buffer first. Two
  // blocks of 20 rows past W = 16 keep two runs of 16 (each block's last 16), so a third drafter given only
  // those rows must agree too; then a step recording (insert + draft) from each kind of memory.
  ASSERT_EQ(cfg_.window_size, 16);
  const Checkpoint ckpt(test::tiny_checkpoint());
  auto in_place = make_drafter(ckpt, cfg_, *gpu_, local_, 4, true, {{8, 2}});
  auto staged = make_drafter(ckpt, cfg_, *gpu_, local_, 4, true, {{8, 2}});
  auto windowed = make_drafter(ckpt, cfg_, *gpu_, local_, 4, true, {{8, 2}});
  const int64_t D = cfg_.row_dim();
  std::mt19937 rng(11);
  std::normal_distribution<float> normal;
  std::vector<bf16_t> plain(static_cast<size_t>(40 * D));
  for (auto& v : plain) v = float_to_bf16(normal(rng));
  const RowVector locked(plain.begin(), plain.end());
  EXPECT_TRUE(gpu_->reads_in_place(locked.data()));
  EXPECT_FALSE(gpu_->reads_in_place(plain.data()));
  const std::vector<ContextBlock> blocks = {{0, 0, 20}, {1, 0, 20}};
  in_place->insert_blocks(blocks, locked.data());
  staged->insert_blocks(blocks, plain.data());
  std::vector<bf16_t> kept(plain.begin() + 4 * D, plain.begin() + 20 * D);
  kept.insert(kept.end(), plain.begin() + 24 * D, plain.end());
  const std::vector<ContextBlock> last16 = {{0, 4, 16}, {1, 4, 16}};
  windowed->insert_blocks(last16, kept.data());
  const std::vector<DraftRequest> two = {{0, 5, 20, -1, 0}, {1, 6, 20, -1, 0}};
  const DraftResult a = in_place->draft(two), b = staged->draft(two), c = windowed->draft(two);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(a.conf, b.conf);
  EXPECT_EQ(a.margin, b.margin);
  EXPECT_EQ(a.ids, c.ids);
  EXPECT_EQ(a.conf, c.conf);

  std::vector<bf16_t> step_plain(static_cast<size_t>(7 * D));
  for (auto& v : step_plain) v = float_to_bf16(normal(rng));
  const RowVector step_locked(step_plain.begin(), step_plain.end());
  const std::vector<ContextBlock> step = {{0, 20, 4}, {1, 20, 3}};
  const std::vector<DraftRequest> next = {{0, 7, 24, -1, 0}, {1, 8, 23, -1, 0}};
  const DraftResult d = in_place->insert_and_draft(step, step_locked.data(), next, true);
  const DraftResult e = staged->insert_and_draft(step, step_plain.data(), next, true);
  EXPECT_EQ(d.ids, e.ids);
  EXPECT_EQ(d.conf, e.conf);
  EXPECT_EQ(d.margin, e.margin);
  EXPECT_EQ(in_place->graph_counts().step_replays, 1);
  EXPECT_EQ(staged->graph_counts().step_replays, 1);
}

TEST_F(CudaDrafter, DraftsOfTwoRequestsAgreeWithTheCpu) {
  // T = 10 rows: the linear layers run in the tensor-core kernel's two-column-tile form (the batch of 4 has
  // 20 rows and goes to cuBLAS).
  const std::vector<DraftRequest> two(batch_.begin(), batch_.begin() + 2);
  test::expect_drafters_agree(cfg_, *cpu_d_, cpu_, *gpu_d_, *gpu_, two);
}

TEST_F(CudaDrafter, RepeatedDraftsGiveIdenticalBits) {
  const DraftResult a = gpu_d_->draft(batch_), b = gpu_d_->draft(batch_);
  EXPECT_EQ(a.ids, b.ids);
  EXPECT_EQ(0, std::memcmp(a.conf.data(), b.conf.data(), a.conf.size() * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(a.margin.data(), b.margin.data(), a.margin.size() * sizeof(float)));
}

// ---- the golden case

class CudaGolden : public ::testing::Test {
 protected:
  void SetUp() override {
    if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
    if (!test::have_golden()) GTEST_SKIP() << "no golden case at " << test::golden_dir();
    gpu_ = std::make_unique<CudaBackend>(0);
    const Checkpoint ckpt(test::golden_dir() / "ckpt");
    cfg_ = load_model_config(ckpt.config_path());
    drafter_ = make_drafter(ckpt, cfg_, *gpu_, local_, 2);
    test::insert_golden_rows(*drafter_);
    requests_ = test::golden_requests();
    expected_ = test::golden_expected();
    drafter_->set_trace(test::record_into(*gpu_, trace_));
    result_ = drafter_->draft(requests_);
  }

  double relative_error(const std::string& name) {
    return test::golden_relative_error(name, trace_.at(name));
  }

  std::unique_ptr<CudaBackend> gpu_;
  LocalCommunicator local_;
  ModelConfig cfg_;
  std::unique_ptr<Drafter> drafter_;
  std::vector<DraftRequest> requests_;
  nlohmann::json expected_;
  test::Trace trace_;
  DraftResult result_;
};

TEST_F(CudaGolden, IdsConfidenceAndMarginByTheReadmeRule) {
  const int64_t k = result_.k;
  for (size_t b = 0; b < requests_.size(); ++b) {
    bool clear = true;
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = b * static_cast<size_t>(k) + static_cast<size_t>(j);
      EXPECT_NEAR(result_.conf[i], expected_["conf"][b][j].get<double>(), 2e-2) << b << "," << j;
      EXPECT_NEAR(result_.margin[i], expected_["margin"][b][j].get<double>(), 2e-2) << b << "," << j;
      clear = clear && expected_["margin"][b][j].get<double>() > 1e-3;
      if (clear) {
        EXPECT_EQ(result_.ids[i], expected_["ids"][b][j].get<int32_t>())
            << "request " << b << " position " << j;
      }
    }
  }
}

TEST_F(CudaGolden, RoutingAndStageTraceWithinFewBf16Ulps) {
  for (int64_t i = 0; i < cfg_.n_mtp_layers; ++i) {
    const std::string ids = fmt::format("stage{}.route_ids", i);
    const std::vector<int64_t> want = read_npy(test::golden_dir() / "trace" / (ids + ".npy")).to_int64();
    const std::vector<float>& got = trace_.at(ids);
    ASSERT_EQ(got.size(), want.size());
    for (size_t n = 0; n < want.size(); ++n)
      EXPECT_EQ(static_cast<int64_t>(got[n]), want[n]) << ids << " [" << n << "]";
    for (const char* part : {"attn_out", "after_attn", "route_w", "moe_out", "after_ffn"}) {
      const std::string name = fmt::format("stage{}.{}", i, part);
      EXPECT_LE(relative_error(name), test::kHiddenTol) << name;
    }
  }
  for (const char* name : {"head_hidden", "base_logits", "conf_logit"})
    EXPECT_LE(relative_error(name), test::kHiddenTol) << name;
}

}  // namespace
}  // namespace dspark
