// EngineSim: the prefill, then the seeded acceptance's rows or a fixed count per sequence, by hand.
#include "lib/runtime/engine_sim.hpp"

#include <gtest/gtest.h>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

EngineShape shape() {
  EngineShape s;
  s.vocab_size = 100;
  s.block_size = 5;
  s.row_dim = 6;
  s.slots = 8;
  s.max_batch = 8;
  s.max_context_rows = 256;
  s.max_model_len = 4096;
  return s;
}

TEST(EngineSim, AFixedRowCountIsSentByEverySequenceAfterItsPrefill) {
  EngineSimOptions o;
  o.sequences = 3;
  o.prefill_rows = 16;
  o.accepted_rows = 4;
  EngineSim sim(shape(), o);
  StepPlan p = sim.next_step();
  ASSERT_EQ(p.contexts.size(), 3u);
  for (const ContextBlock& c : p.contexts) EXPECT_EQ(c.rows, 16);
  ASSERT_EQ(p.drafts.size(), 3u);
  EXPECT_EQ(p.drafts[0].anchor_pos, 16);
  sim.step_done(p, true);
  for (int step = 0; step < 5; ++step) {
    p = sim.next_step();
    ASSERT_EQ(p.contexts.size(), 3u) << step;
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(p.contexts[i].rows, 4) << step;
      EXPECT_EQ(p.contexts[i].first_pos, 16 + 4 * step) << step;  // consecutive positions
      EXPECT_EQ(p.drafts[i].anchor_pos, 16 + 4 * (step + 1)) << step;
    }
    EXPECT_EQ(p.rows.size(), 3u * 4u * 6u);
    sim.step_done(p, true);
  }
}

TEST(EngineSim, TheSeededAcceptanceSendsTheAnchorAndTheAcceptedTokens) {
  EngineSimOptions o;
  o.sequences = 2;
  o.accept_prob = 1.0;  // every token accepted: k + 1 rows
  EngineSim all(shape(), o);
  all.step_done(all.next_step(), true);
  const StepPlan every = all.next_step();
  ASSERT_EQ(every.contexts.size(), 2u);
  for (const ContextBlock& c : every.contexts) EXPECT_EQ(c.rows, 6);
  o.accept_prob = 0.0;  // none: the anchor's row alone
  EngineSim none(shape(), o);
  none.step_done(none.next_step(), true);
  const StepPlan anchors = none.next_step();
  ASSERT_EQ(anchors.contexts.size(), 2u);
  for (const ContextBlock& c : anchors.contexts) EXPECT_EQ(c.rows, 1);
}

TEST(EngineSim, AFixedRowCountOutsideItsRangeIsRefused) {
  EngineSimOptions o;
  o.accepted_rows = 65;
  EXPECT_THROW(EngineSim(shape(), o), Error);
  o.accepted_rows = -1;
  EXPECT_THROW(EngineSim(shape(), o), Error);
}

}  // namespace
}  // namespace dspark
