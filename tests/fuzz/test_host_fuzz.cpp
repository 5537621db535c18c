// The host-message fuzz in its reduced form (20k messages, a few seconds): no failure of any kind, and every
// outcome reached often enough that the run means something. The long form is dspark_fuzz_host
// (docs/robustness.md).
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include "tests/fuzz/host_fuzz.hpp"

namespace dspark::fuzz {
namespace {

TEST(HostFuzz, TwentyThousandMessagesChangeNothingWhenRejectedAndMatchTheModelWhenAccepted) {
  spdlog::set_level(spdlog::level::off);
  FuzzOptions o;
  o.messages = 20000;
  o.seed = 20240;
  const FuzzReport r = run_host_fuzz(o);
  RecordProperty("summary", r.summary());
  EXPECT_EQ(r.failures(), 0) << r.first_failure << "\n" << r.summary();
  EXPECT_EQ(r.messages, 20000);
  EXPECT_EQ(r.decode_rejected + r.answered + r.accepted + r.rejected_invalid + r.rejected_exhausted,
            r.messages)
      << r.summary();
  // Each outcome is reached: the mutations are neither all caught by the codec nor all harmless.
  EXPECT_GT(r.accepted, r.messages / 5) << r.summary();
  EXPECT_GT(r.rejected_invalid, r.messages / 10) << r.summary();
  EXPECT_GT(r.rejected_exhausted, r.messages / 100) << r.summary();
  EXPECT_GT(r.decode_rejected, r.messages / 10) << r.summary();
  EXPECT_GT(r.drafts_checked, r.messages / 5) << r.summary();
}

TEST(HostFuzz, TheSameSeedGivesTheSameRun) {
  spdlog::set_level(spdlog::level::off);
  FuzzOptions o;
  o.messages = 3000;
  o.seed = 99;
  const FuzzReport a = run_host_fuzz(o), b = run_host_fuzz(o);
  EXPECT_EQ(a.accepted, b.accepted);
  EXPECT_EQ(a.rejected_invalid, b.rejected_invalid);
  EXPECT_EQ(a.decode_rejected, b.decode_rejected);
  EXPECT_EQ(a.drafts_checked, b.drafts_checked);
}

}  // namespace
}  // namespace dspark::fuzz
