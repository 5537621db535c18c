// check_plan: every field of a step is range-checked before the broadcast, with the status of SPEC §7.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "lib/api/step_plan.hpp"

namespace dspark {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kRowDim = 6;
const StepLimits kLimits{/*slots*/ 4,
                         /*max_batch*/ 3,
                         /*max_context_rows*/ 10,
                         /*max_model_len*/ 100,
                         /*limit*/ 200,
                         /*vocab*/ 50,
                         /*k*/ 5,
                         kRowDim};

StepPlan valid_plan() {
  StepPlan p;
  p.resets = {1};
  p.contexts = {{0, 0, 4}, {2, 90, 10 - 4}};
  p.rows.assign(10 * kRowDim, bf16_t{0});  // row memory is not zeroed by resize
  p.drafts = {{0, 7, 4, -1, 5}, {2, 49, 96, 92, 1}};
  return p;
}

TEST(CheckPlan, AValidPlanPasses) {
  EXPECT_TRUE(check_plan(valid_plan(), kLimits).ok());
}

TEST(CheckPlan, ShutdownNeedsNothing) {
  StepPlan p;
  p.shutdown = true;
  EXPECT_TRUE(check_plan(p, kLimits).ok());
}

struct Case {
  const char* what;
  void (*edit)(StepPlan&);
  Status status;
  const char* message;
};

TEST(CheckPlan, EachBadFieldIsNamed) {
  const Case cases[] = {
      {"reset slot", [](StepPlan& p) { p.resets = {4}; }, Status::invalid_argument, "reset: slot 4"},
      {"context slot", [](StepPlan& p) { p.contexts[0].slot = -1; }, Status::invalid_argument,
       "context 0: slot -1"},
      {"context past max_model_len", [](StepPlan& p) { p.contexts[1].first_pos = 95; },
       Status::invalid_argument, "positions [95, 101)"},
      {"empty context", [](StepPlan& p) { p.contexts[0].rows = 0; }, Status::invalid_argument,
       "context 0: 0 rows"},
      {"rows over the limit",
       [](StepPlan& p) {
         p.contexts[0].rows = 5;
         p.rows.resize(11 * kRowDim);
       },
       Status::resource_exhausted, "11 context rows over max_context_rows 10"},
      {"row payload size", [](StepPlan& p) { p.rows.pop_back(); }, Status::invalid_argument,
       "expected 10 rows of 6"},
      {"batch over the limit", [](StepPlan& p) { p.drafts.resize(4, p.drafts[0]); },
       Status::resource_exhausted, "batch of 4 over max_batch 3"},
      {"draft slot", [](StepPlan& p) { p.drafts[1].slot = 4; }, Status::invalid_argument,
       "request 1: slot 4"},
      {"token", [](StepPlan& p) { p.drafts[0].anchor_token = 50; }, Status::invalid_argument, "token 50"},
      {"position", [](StepPlan& p) { p.drafts[0].anchor_pos = 100; }, Status::invalid_argument,
       "position 100"},
      {"k'", [](StepPlan& p) { p.drafts[0].outputs = 6; }, Status::invalid_argument, "k' = 6"},
      {"window low", [](StepPlan& p) { p.drafts[1].window_low = 97; }, Status::invalid_argument,
       "window low 97"},
      {"accepted below -1", [](StepPlan& p) { p.drafts[0].accepted = -2; }, Status::invalid_argument,
       "request 0: accepted -2 outside [-1 (no report), k = 5]"},
      {"accepted above k", [](StepPlan& p) { p.drafts[1].accepted = 6; }, Status::invalid_argument,
       "request 1: accepted 6 outside"},
      {"max_model_len over the limit", [](StepPlan& p) { p.max_model_len = 201; }, Status::invalid_argument,
       "max_model_len 201"},
  };
  for (const Case& c : cases) {
    StepPlan p = valid_plan();
    c.edit(p);
    const StatusOr r = check_plan(p, kLimits);
    EXPECT_EQ(r.status, c.status) << c.what;
    EXPECT_THAT(r.message, HasSubstr(c.message)) << c.what;
  }
}

TEST(CheckPlan, FieldsOnlyForAStepSentInSeveralMessages) {
  // A client checks a step it will split before sending: no per-message row limit and no payload yet, every
  // field still checked.
  StepPlan p = valid_plan();
  p.contexts[0].rows = 40;
  p.rows.clear();
  EXPECT_EQ(check_plan(p, kLimits).status, Status::resource_exhausted);
  EXPECT_TRUE(check_plan(p, kLimits, PlanCheck::fields).ok());
  p.drafts[0].outputs = 6;
  EXPECT_EQ(check_plan(p, kLimits, PlanCheck::fields).status, Status::invalid_argument);
}

TEST(CheckPlan, NonFiniteContextValuesAreInvalid) {
  // bf16 bits: +Inf 0x7f80, -Inf 0xff80, a NaN 0x7fc1; the largest finite 0x7f7f passes.
  StepPlan p = valid_plan();
  p.rows[5] = 0x7f7f;
  EXPECT_TRUE(check_plan(p, kLimits).ok());
  for (const bf16_t bad : {bf16_t{0x7f80}, bf16_t{0xff80}, bf16_t{0x7fc1}}) {
    p = valid_plan();
    p.rows[(4 + 2) * kRowDim + 3] = bad;  // context 1 (after context 0's 4 rows), its row 2, element 3
    const StatusOr r = check_plan(p, kLimits);
    EXPECT_EQ(r.status, Status::invalid_argument) << bad;
    EXPECT_THAT(r.message, HasSubstr("context 1: row 2 holds a non-finite value (NaN or Inf) at element 3"));
  }
  // A step checked before it is split carries no rows yet: nothing to scan.
  p.rows.clear();
  EXPECT_TRUE(check_plan(p, kLimits, PlanCheck::fields).ok());
}

TEST(CheckPlan, ARowScanDoneWhileDecodingIsNotRepeated) {
  // The decode's result is what counts (it scanned the rows as it copied them): a place it found is refused
  // with the same message, and -1 is taken as found clean.
  StepPlan p = valid_plan();
  p.rows_first_non_finite = (4 + 2) * kRowDim + 3;
  const StatusOr r = check_plan(p, kLimits);
  EXPECT_EQ(r.status, Status::invalid_argument);
  EXPECT_THAT(r.message, HasSubstr("context 1: row 2 holds a non-finite value (NaN or Inf) at element 3"));
  p = valid_plan();
  p.rows[7] = 0x7f80;
  EXPECT_EQ(check_plan(p, kLimits).status, Status::invalid_argument);  // not scanned yet: the scan finds it
  p.rows_first_non_finite = -1;
  EXPECT_TRUE(check_plan(p, kLimits).ok());
}

TEST(CheckPlan, ANewMaxModelLenAppliesToTheSameStep) {
  StepPlan p = valid_plan();
  p.max_model_len = 150;
  p.drafts[0].anchor_pos = 120;
  p.contexts[0].rows = 4;
  EXPECT_TRUE(check_plan(p, kLimits).ok());
  p.max_model_len = 90;  // shrinks below context 1's positions
  EXPECT_EQ(check_plan(p, kLimits).status, Status::invalid_argument);
}

}  // namespace
}  // namespace dspark
