// End-to-end properties of the drafter on the tiny synthetic checkpoint, each checked against a second way of
// getting the same answer (a fresh slot, a single request, another k').
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "comm/communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/core/error.hpp"
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "tests/support/tiny_checkpoint.hpp"

namespace dspark {
namespace {

class DrafterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const Checkpoint ckpt(test::tiny_checkpoint());
    cfg_ = load_model_config(ckpt.config_path());
    const ShardPlan plan = make_shard_plan(cfg_, 0, 1);
    DrafterOptions opt;
    opt.slots = 6;
    opt.max_batch = 6;
    opt.max_insert_rows = 8;  // smaller than most inserts below: chunking is exercised too
    drafter_ = std::make_unique<Drafter>(cfg_, load_drafter_weights(ckpt, cfg_, plan, backend_), plan,
                                         backend_, comm_, opt);
    std::mt19937 rng(11);
    std::normal_distribution<float> normal;
    rows_.resize(static_cast<size_t>(kRows * cfg_.row_dim()));
    for (auto& v : rows_) v = float_to_bf16(normal(rng));
  }

  const bf16_t* row(int64_t p) const { return rows_.data() + p * cfg_.row_dim(); }
  DraftResult one(const DraftRequest& r) { return drafter_->draft(std::span(&r, 1)); }

  static constexpr int64_t kRows = 48;
  CpuBackend backend_;
  LocalCommunicator comm_;
  ModelConfig cfg_;
  std::unique_ptr<Drafter> drafter_;
  std::vector<bf16_t> rows_;  // position p's row for every slot
};

void expect_same(const DraftResult& a, const DraftResult& b, const char* what) {
  EXPECT_EQ(a.ids, b.ids) << what;
  EXPECT_EQ(a.conf, b.conf) << what;
  EXPECT_EQ(a.margin, b.margin) << what;
}

TEST_F(DrafterTest, Deterministic) {
  drafter_->insert(0, 0, row(0), 20);
  const DraftRequest r{0, 17, 20, -1, 0};
  const DraftResult a = one(r), b = one(r);
  expect_same(a, b, "same call twice");
  for (float c : a.conf) {
    EXPECT_GT(c, 0.0f);
    EXPECT_LT(c, 1.0f);
  }
}

TEST_F(DrafterTest, PrefixIdenticalForEveryKOut) {
  drafter_->insert(0, 0, row(0), 20);
  const int64_t k = cfg_.block_size;
  const DraftResult full = one({0, 42, 20, -1, static_cast<int32_t>(k)});
  for (int32_t kout = 1; kout <= k; ++kout) {
    const DraftResult part = one({0, 42, 20, -1, kout});
    for (int64_t j = 0; j < k; ++j) {
      if (j < kout) {
        EXPECT_EQ(part.ids[j], full.ids[j]) << "k' " << kout << " j " << j;
        EXPECT_EQ(part.conf[j], full.conf[j]) << "k' " << kout << " j " << j;
        EXPECT_EQ(part.margin[j], full.margin[j]) << "k' " << kout << " j " << j;
      } else {
        EXPECT_EQ(part.ids[j], 0);
        EXPECT_EQ(part.conf[j], 0.0f);
        EXPECT_EQ(part.margin[j], 0.0f);
      }
    }
  }
}

TEST_F(DrafterTest, BatchEqualsSingleDrafts) {
  drafter_->insert(0, 0, row(0), 20);
  drafter_->insert(1, 0, row(0), 9);
  drafter_->insert(2, 0, row(5), 33);
  const std::vector<DraftRequest> batch = {
      {0, 3, 20, -1, 5}, {1, 900, 9, -1, 2}, {2, 77, 33, -1, 4}, {0, 8, 20, 15, 3}};
  const DraftResult all = drafter_->draft(batch);
  const int64_t k = cfg_.block_size;
  for (size_t b = 0; b < batch.size(); ++b) {
    const DraftResult single = one(batch[b]);
    for (int64_t j = 0; j < k; ++j) {
      EXPECT_EQ(all.ids[b * k + j], single.ids[j]) << b << "," << j;
      EXPECT_EQ(all.conf[b * k + j], single.conf[j]) << b << "," << j;
      EXPECT_EQ(all.margin[b * k + j], single.margin[j]) << b << "," << j;
    }
  }
}

TEST_F(DrafterTest, RingWraparoundKeepsOnlyTheWindow) {
  // 40 rows into a W = 16 ring equal the last 16 rows alone: older entries were overwritten.
  const int64_t W = cfg_.window_size, P = 40;
  drafter_->insert(0, 0, row(0), P);
  drafter_->insert(1, P - W, row(P - W), W);
  expect_same(one({0, 5, static_cast<int32_t>(P), -1, 0}), one({1, 5, static_cast<int32_t>(P), -1, 0}),
              "wrapped ring vs window only");
  // Sanity: the window matters (a slot with fewer rows drafts differently).
  drafter_->insert(2, P - 4, row(P - 4), 4);
  EXPECT_NE(one({0, 5, static_cast<int32_t>(P), -1, 0}).conf,
            one({2, 5, static_cast<int32_t>(P), -1, 0}).conf);
}

TEST_F(DrafterTest, WindowLowMasksOlderEntries) {
  const int32_t P = 30, low = 26;
  drafter_->insert(0, 0, row(0), P);
  drafter_->insert(1, low, row(low), P - low);
  expect_same(one({0, 99, P, low, 0}), one({1, 99, P, -1, 0}), "window low vs only the rows from low");
}

TEST_F(DrafterTest, EntriesAtOrPastTheAnchorAreIgnored) {
  // Rows for positions >= P (a rejected continuation not yet overwritten) must not be attended. Slot 0's ring
  // holds 17..32 (30..32 overwrote 14..16), so the live window [14, 29] is 17..29: slot 1 holds just those.
  const int32_t P = 30;
  drafter_->insert(0, 0, row(0), P + 3);
  drafter_->insert(1, 17, row(17), P - 17);
  expect_same(one({0, 99, P, -1, 0}), one({1, 99, P, -1, 0}), "stale future entries");
}

TEST_F(DrafterTest, InsertInTwoCallsEqualsOne) {
  drafter_->insert(0, 0, row(0), 13);
  drafter_->insert(0, 13, row(13), 7);
  drafter_->insert(1, 0, row(0), 20);
  expect_same(one({0, 1, 20, -1, 0}), one({1, 1, 20, -1, 0}), "two inserts vs one");
}

TEST_F(DrafterTest, OneInsertOfSeveralBlocksEqualsTheirSeparateInserts) {
  // Slot 0: positions 0..11, then 12..19 (W = 16: 0..3 are overwritten); slot 1: 0..5 from other rows.
  const int64_t D = cfg_.row_dim();
  ASSERT_EQ(cfg_.window_size, 16);
  std::vector<bf16_t> rows(row(0), row(12));
  rows.insert(rows.end(), row(10), row(16));
  rows.insert(rows.end(), row(12), row(20));
  const std::vector<ContextBlock> blocks = {{0, 0, 12}, {1, 0, 6}, {0, 12, 8}};
  ASSERT_EQ(static_cast<int64_t>(rows.size()), 26 * D);
  drafter_->insert_blocks(blocks, rows.data());
  // 16 + 6 surviving rows in chunks of max_insert_rows = 8.
  EXPECT_EQ(drafter_->graph_counts().insert_eager, 3);

  const Checkpoint ckpt(test::tiny_checkpoint());
  const ShardPlan plan = make_shard_plan(cfg_, 0, 1);
  Drafter separate(cfg_, load_drafter_weights(ckpt, cfg_, plan, backend_), plan, backend_, comm_,
                   drafter_->options());
  separate.insert(0, 0, row(0), 12);
  separate.insert(1, 0, row(10), 6);
  separate.insert(0, 12, row(12), 8);
  const std::vector<DraftRequest> batch = {{0, 9, 20, -1, 0}, {1, 400, 6, -1, 0}};
  expect_same(drafter_->draft(batch), separate.draft(batch), "one packed insert vs three");
  expect_same(drafter_->insert_and_draft({}, nullptr, batch, true), separate.draft(batch), "no rows");
}

TEST_F(DrafterTest, CountsTheDraftShapesItRan) {
  drafter_->insert(0, 0, row(0), 20);
  one({0, 1, 20, -1, 0});
  one({0, 2, 20, -1, 0});
  drafter_->draft(std::vector<DraftRequest>{{0, 3, 20, -1, 3}, {1, 4, 9, -1, 2}});
  drafter_->insert_and_draft({}, nullptr, std::vector<DraftRequest>{{0, 3, 20, -1, 3}, {1, 4, 9, -1, 2}},
                             true);
  using Shapes = std::map<std::pair<int64_t, int64_t>, Drafter::ShapeCount>;
  const Shapes& s = drafter_->draft_shapes();
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s.at({1, cfg_.block_size}).steps, 2);  // k' 0 is k
  EXPECT_EQ(s.at({2, 3}).steps, 2);                // the largest k' of the batch
  EXPECT_EQ(s.at({2, 3}).replayed, 0);             // the cpu backend records nothing
}

TEST_F(DrafterTest, AnInvalidBlockWritesNoBlock) {
  const DraftResult fresh = one({0, 250, 12, -1, 0});
  const std::vector<ContextBlock> blocks = {{0, 0, 12}, {6, 0, 1}};
  try {
    drafter_->insert_blocks(blocks, row(0));
    ADD_FAILURE() << "slot 6 was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("context block 1: insert: slot 6"), std::string::npos) << e.what();
  }
  expect_same(one({0, 250, 12, -1, 0}), fresh, "block 0 was written");
  EXPECT_EQ(drafter_->graph_counts().insert_eager, 0);
}

TEST_F(DrafterTest, ResetClearsTheSlot) {
  const DraftResult fresh = one({0, 250, 12, -1, 0});  // slot 0 never written
  drafter_->insert(0, 0, row(0), 12);
  const DraftResult with_context = one({0, 250, 12, -1, 0});
  EXPECT_NE(with_context.conf, fresh.conf);
  drafter_->reset(0);
  expect_same(one({0, 250, 12, -1, 0}), fresh, "after reset");
}

TEST_F(DrafterTest, SlotsAreIndependent) {
  drafter_->insert(0, 0, row(0), 20);
  const DraftResult before = one({0, 4, 20, -1, 0});
  drafter_->insert(1, 0, row(10), 30);
  drafter_->reset(2);
  expect_same(one({0, 4, 20, -1, 0}), before, "other slots changed");
}

TEST_F(DrafterTest, PositionsClampToMaxModelLen) {
  // A drafter whose max_model_len is P + 2: block rows 2.. sit at position P + 1. Drafting at that edge works
  // and differs from the unclamped draft only through the positions of rows >= 2.
  const Checkpoint ckpt(test::tiny_checkpoint());
  const ShardPlan plan = make_shard_plan(cfg_, 0, 1);
  DrafterOptions opt;
  opt.slots = 1;
  opt.max_batch = 1;
  opt.max_model_len = 22;
  Drafter clamped(cfg_, load_drafter_weights(ckpt, cfg_, plan, backend_), plan, backend_, comm_, opt);
  clamped.insert(0, 0, row(0), 20);
  drafter_->insert(0, 0, row(0), 20);
  const DraftRequest r{0, 31, 20, -1, 0};
  const DraftResult a = clamped.draft(std::span(&r, 1)), b = one(r);
  EXPECT_NE(a.conf, b.conf);
  EXPECT_THROW(clamped.draft(std::vector<DraftRequest>{{0, 31, 22, -1, 0}}), Error);  // P past the limit
}

TEST_F(DrafterTest, InvalidRequestsAreRejectedWithReasons) {
  auto message = [&](std::vector<DraftRequest> rs) -> std::string {
    try {
      drafter_->draft(rs);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(message({{6, 1, 1, -1, 0}}).find("slot 6"), std::string::npos);
  EXPECT_NE(message({{0, 1024, 1, -1, 0}}).find("token 1024"), std::string::npos);
  EXPECT_NE(message({{0, 1, -1, -1, 0}}).find("position -1"), std::string::npos);
  EXPECT_NE(message({{0, 1, 5, -1, 6}}).find("k' = 6"), std::string::npos);
  EXPECT_NE(message({{0, 1, 5, 9, 0}}).find("window low 9"), std::string::npos);
  EXPECT_NE(message(std::vector<DraftRequest>(7, DraftRequest{0, 1, 5, -1, 0})).find("max_batch"),
            std::string::npos);
  EXPECT_NE(message({}).find("empty"), std::string::npos);
  EXPECT_THROW(drafter_->insert(6, 0, row(0), 1), Error);
  EXPECT_THROW(drafter_->reset(-1), Error);
  const auto sampled = [](float tau, bool distribution = false) {
    DraftRequest r{0, 1, 5, -1, 0};
    r.temperature = tau;
    r.distribution = distribution;
    return r;
  };
  EXPECT_NE(message({sampled(-0.5f)}).find("temperature -0.5 is negative"), std::string::npos);
  EXPECT_NE(message({sampled(std::nanf(""))}).find("temperature is NaN"), std::string::npos);
  EXPECT_NE(message({sampled(1e6f)}).find("above 100"), std::string::npos);
  EXPECT_NE(message({sampled(0.0f, true)}).find("needs a temperature > 0"), std::string::npos);
  // One request per batch may ask for its whole distribution (DrafterOptions::max_distributions).
  EXPECT_NE(message({sampled(1.0f, true), sampled(1.0f, true)}).find("max_distributions 1"),
            std::string::npos);
}

// A sampled request beside greedy ones leaves theirs bit for bit; at tau -> 0 it drafts the greedy tokens
// wherever the margin dwarfs the noise (|g| < 25, so a margin above 25 tau); its q and whole distribution
// are consistent (q at the token, rows summing to 1); the same seed repeats, another seed differs.
TEST_F(DrafterTest, SampledRequestsBesideGreedyOnes) {
  for (int32_t s = 0; s < 3; ++s) drafter_->insert(s, 0, row(0), 30);
  const std::vector<DraftRequest> greedy = {{0, 17, 30, -1, 0}, {1, 5, 30, -1, 0}, {2, 9, 30, -1, 0}};
  const DraftResult g = drafter_->draft(greedy);
  std::vector<DraftRequest> mixed = greedy;
  mixed[1].temperature = 0.8f;
  mixed[1].seed = 99;
  mixed[1].distribution = true;
  mixed[2].temperature = 1e-4f;
  mixed[2].seed = 5;
  const DraftResult m = drafter_->draft(mixed);
  const int64_t k = g.k, V = cfg_.vocab_size;
  for (int64_t j = 0; j < k; ++j) {
    EXPECT_EQ(m.ids[j], g.ids[j]);
    EXPECT_EQ(m.conf[j], g.conf[j]);
    EXPECT_EQ(m.margin[j], g.margin[j]);
    EXPECT_EQ(m.q[j], 1.0f);
  }
  for (int64_t j = 0; j < k && g.margin[2 * k + j] > 25 * 1e-4f; ++j) {
    EXPECT_EQ(m.ids[2 * k + j], g.ids[2 * k + j]) << j;
    EXPECT_NEAR(m.q[2 * k + j], 1.0f, 1e-4f) << j;
  }
  ASSERT_EQ(m.distribution.size(), static_cast<size_t>(k * V));
  for (int64_t j = 0; j < k; ++j) {
    EXPECT_EQ(m.distribution_rows[static_cast<size_t>(j)], k + j);
    const float* q = m.distribution.data() + j * V;
    double total = 0;
    for (int64_t v = 0; v < V; ++v) total += q[v];
    EXPECT_NEAR(total, 1.0, 1e-5) << j;
    EXPECT_EQ(q[m.ids[k + j]], m.q[k + j]) << j;
    EXPECT_GT(m.q[k + j], 0.0f);
    EXPECT_LT(m.q[k + j], 1.0f);
  }
  const DraftResult again = drafter_->draft(mixed);
  EXPECT_EQ(again.ids, m.ids);
  EXPECT_EQ(again.q, m.q);
  EXPECT_EQ(again.distribution, m.distribution);
  int differ = 0;
  for (uint64_t seed = 100; seed < 110; ++seed) {
    mixed[1].seed = seed;
    const DraftResult o = drafter_->draft(mixed);
    differ += std::equal(o.ids.begin() + k, o.ids.begin() + 2 * k, m.ids.begin() + k) ? 0 : 1;
  }
  EXPECT_GE(differ, 5);
}

}  // namespace
}  // namespace dspark
