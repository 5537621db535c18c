// The planner that splits a step into messages (client/step_split.*), against byte and row limits.
#include <gtest/gtest.h>

#include "client/step_split.hpp"

namespace dspark::client {
namespace {

// Checks the plan's invariants and returns, per message, its row count.
std::vector<int64_t> check_plan(const std::vector<MessagePlan>& plan,
                                std::span<const dspark_context_block> ctx, size_t n_resets, size_t n_drafts,
                                const SplitLimits& lim) {
  std::vector<int64_t> rows_per_msg;
  std::vector<int32_t> next(ctx.size(), 0);
  uint32_t cur_ctx = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    const MessagePlan& m = plan[i];
    EXPECT_EQ(m.resets, i == 0);
    EXPECT_EQ(m.drafts, i + 1 == plan.size());
    int64_t rows = 0;
    for (const Piece& p : m.pieces) {
      // Pieces run through the contexts in order, each continuing where the last stopped.
      if (p.ctx != cur_ctx) {
        EXPECT_EQ(next[cur_ctx], ctx[cur_ctx].rows);
        cur_ctx = p.ctx;
      }
      EXPECT_EQ(p.offset, next[p.ctx]);
      EXPECT_GE(p.rows, 1);
      next[p.ctx] += p.rows;
      rows += p.rows;
    }
    EXPECT_LE(rows, lim.max_rows);
    EXPECT_LE(step_message_bytes(m.resets ? n_resets : 0, m.pieces.size(), m.drafts ? n_drafts : 0,
                                 static_cast<uint64_t>(rows), lim.row_bytes),
              lim.max_bytes);
    rows_per_msg.push_back(rows);
  }
  for (size_t c = 0; c < ctx.size(); ++c) EXPECT_EQ(next[c], ctx[c].rows);
  return rows_per_msg;
}

TEST(StepSplit, FitsOneMessage) {
  const dspark_context_block ctx[2] = {{0, 0, 5, nullptr}, {1, 0, 3, nullptr}};
  const SplitLimits lim{1 << 16, 16, 48};
  std::vector<MessagePlan> plan;
  ASSERT_TRUE(split_step(2, ctx, 4, lim, plan).ok());
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_EQ(check_plan(plan, ctx, 2, 4, lim), std::vector<int64_t>({8}));
}

TEST(StepSplit, EmptyStepIsOneMessage) {
  const SplitLimits lim{1 << 16, 16, 48};
  std::vector<MessagePlan> plan;
  ASSERT_TRUE(split_step(0, {}, 0, lim, plan).ok());
  ASSERT_EQ(plan.size(), 1u);
  EXPECT_TRUE(plan[0].resets && plan[0].drafts && plan[0].pieces.empty());
}

TEST(StepSplit, ByRows) {
  const dspark_context_block ctx[3] = {{0, 0, 20, nullptr}, {1, 0, 3, nullptr}, {2, 0, 17, nullptr}};
  const SplitLimits lim{1 << 20, 16, 48};
  std::vector<MessagePlan> plan;
  ASSERT_TRUE(split_step(1, ctx, 3, lim, plan).ok());
  EXPECT_EQ(check_plan(plan, ctx, 1, 3, lim), std::vector<int64_t>({16, 16, 8}));
}

TEST(StepSplit, ByBytes) {
  // 1000-byte rows, 4096-byte messages: the wires leave room for 4 rows (3 in the first, beside 100 resets).
  const dspark_context_block ctx[2] = {{0, 0, 9, nullptr}, {1, 0, 2, nullptr}};
  const SplitLimits lim{4096, 128, 1000};
  std::vector<MessagePlan> plan;
  ASSERT_TRUE(split_step(100, ctx, 8, lim, plan).ok());
  const auto rows = check_plan(plan, ctx, 100, 8, lim);
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  EXPECT_EQ(total, 11);
  EXPECT_EQ(rows.front(), 3);
  EXPECT_GE(plan.size(), 3u);
}

TEST(StepSplit, DraftsMoveToTheirOwnMessageWhenTheLastIsFull) {
  // Exactly full with rows: the draft wires no longer fit beside them.
  const SplitLimits lim{4096, 1000, 8};
  const uint64_t fit = (4096 - step_message_bytes(0, 1, 0, 0, 8)) / 8;
  const dspark_context_block ctx{0, 0, static_cast<int32_t>(fit), nullptr};
  std::vector<MessagePlan> plan;
  ASSERT_TRUE(split_step(0, {&ctx, 1}, 4, lim, plan).ok());
  ASSERT_EQ(plan.size(), 2u);
  EXPECT_TRUE(plan[1].pieces.empty() && plan[1].drafts);
  check_plan(plan, {&ctx, 1}, 0, 4, lim);
}

TEST(StepSplit, RefusesWhatCannotFitAnyMessage) {
  const SplitLimits lim{256, 16, 48};
  std::vector<MessagePlan> plan;
  EXPECT_EQ(split_step(100, {}, 0, lim, plan).status, DSPARK_RESOURCE_EXHAUSTED);
  EXPECT_EQ(split_step(0, {}, 100, lim, plan).status, DSPARK_RESOURCE_EXHAUSTED);
  const SplitLimits tiny_ring{64, 16, 48};  // not even one row beside the header
  const dspark_context_block ctx{0, 0, 1, nullptr};
  EXPECT_EQ(split_step(0, {&ctx, 1}, 0, tiny_ring, plan).status, DSPARK_RESOURCE_EXHAUSTED);
}

}  // namespace
}  // namespace dspark::client
