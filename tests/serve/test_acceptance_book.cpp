// AcceptanceBook: reports counted against each slot's last answered draft, by hand-worked cases.
#include "lib/serve/acceptance_book.hpp"

#include <gtest/gtest.h>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

StepPlan drafts(std::vector<DraftRequest> d, std::vector<int32_t> resets = {}) {
  StepPlan p;
  p.drafts = std::move(d);
  p.resets = std::move(resets);
  return p;
}

TEST(AcceptanceBook, ReportsCountPositionsReachedAndAcceptedOfTheSlotsLastDraft) {
  AcceptanceBook book(4, 5);
  // Slot 0 drafts k' = 5 (outputs 0), slot 1 k' = 3; no reports yet.
  EXPECT_TRUE(book.take(drafts({{0, 1, 10, -1, 0}, {1, 1, 10, -1, 3}}), Status::ok).counted.empty());
  // Slot 0 accepted 2 of 5: positions 0, 1, 2 reached, 0 and 1 accepted. Slot 1 accepted all 3.
  const AcceptanceBook::Taken t = book.take(drafts({{0, 1, 13, -1, 0, 2}, {1, 1, 14, -1, 0, 3}}), Status::ok);
  ASSERT_EQ(t.counted.size(), 2u);
  EXPECT_EQ(t.counted[0].k, 5);
  EXPECT_EQ(t.counted[0].accepted, 2);
  EXPECT_EQ(t.counted[1].k, 3);
  EXPECT_EQ(t.unmatched, 0);
  const AcceptanceBook::Tally& five = book.tally(5);
  EXPECT_EQ(five.reports, 1u);
  EXPECT_EQ(five.accepted_tokens, 2u);
  EXPECT_EQ(five.reached, (std::vector<uint64_t>{1, 1, 1, 0, 0}));
  EXPECT_EQ(five.accepted, (std::vector<uint64_t>{1, 1, 0, 0, 0}));
  const AcceptanceBook::Tally& three = book.tally(3);
  EXPECT_EQ(three.reached, (std::vector<uint64_t>{1, 1, 1}));
  EXPECT_EQ(three.accepted, (std::vector<uint64_t>{1, 1, 1}));
  // Both slots drafted k' = 5 in that step: 0 of 5 accepted on slot 0 reaches position 0 only.
  book.take(drafts({{0, 1, 16, -1, 0, 0}}), Status::ok);
  EXPECT_EQ(book.tally(5).reached, (std::vector<uint64_t>{2, 1, 1, 0, 0}));
  EXPECT_EQ(book.tally(5).accepted, (std::vector<uint64_t>{1, 1, 0, 0, 0}));
  EXPECT_EQ(book.tally(5).reports, 2u);
}

TEST(AcceptanceBook, TemperatureClassesHaveTheirEdgesWhereTheNamesSay) {
  EXPECT_EQ(temperature_class(0.0f), 0);
  EXPECT_EQ(temperature_class(1e-30f), 1);
  EXPECT_EQ(temperature_class(0.5f), 1);
  EXPECT_EQ(temperature_class(0.50001f), 2);
  EXPECT_EQ(temperature_class(1.0f), 2);
  EXPECT_EQ(temperature_class(2.0f), 3);
  EXPECT_EQ(temperature_class(2.5f), 4);
  EXPECT_EQ(temperature_class(100.0f), 4);
  EXPECT_STREQ(temperature_class_name(0), "0");
  EXPECT_STREQ(temperature_class_name(2), "(0.5,1]");
  EXPECT_STREQ(temperature_class_name(4), "(2,100]");
  EXPECT_THROW(temperature_class_name(5), Error);
}

// A report counts in the class of the draft it concerns, not of the request carrying it.
TEST(AcceptanceBook, ReportsCountInTheTemperatureClassOfTheirDraft) {
  AcceptanceBook book(4, 5);
  DraftRequest sampled{0, 1, 10, -1, 3};
  sampled.temperature = 0.8f;
  book.take(drafts({sampled, {1, 1, 10, -1, 3}}), Status::ok);
  // Slot 0's k' = 3 draft at 0.8 took 1 token; slot 1's greedy one all 3. The carrying requests' own
  // temperatures (1.5 on slot 1) do not matter.
  DraftRequest report1{1, 1, 13, -1, 0, 3};
  report1.temperature = 1.5f;
  const AcceptanceBook::Taken t = book.take(drafts({{0, 1, 13, -1, 0, 1}, report1}), Status::ok);
  ASSERT_EQ(t.counted.size(), 2u);
  EXPECT_EQ(t.counted[0].temperature_class, 2);
  EXPECT_EQ(t.counted[1].temperature_class, 0);
  EXPECT_EQ(book.tally(3, 2).reports, 1u);
  EXPECT_EQ(book.tally(3, 2).reached, (std::vector<uint64_t>{1, 1, 0}));
  EXPECT_EQ(book.tally(3, 2).accepted, (std::vector<uint64_t>{1, 0, 0}));
  EXPECT_EQ(book.tally(3, 0).reports, 1u);
  EXPECT_EQ(book.tally(3, 0).accepted_tokens, 3u);
  EXPECT_EQ(book.tally(3, 3).reports, 0u);
  // Slot 1's new draft was at 1.5: its report counts in (1, 2].
  book.take(drafts({{1, 1, 16, -1, 0, 2}}), Status::ok);
  EXPECT_EQ(book.tally(5, 3).reports, 1u);
  EXPECT_EQ(book.tally(5, 3).accepted_tokens, 2u);
  EXPECT_THROW(book.tally(5, 5), Error);
}

TEST(AcceptanceBook, ReportsWithoutAMatchingDraftAreNotCounted) {
  AcceptanceBook book(4, 5);
  // No draft yet on slot 2; -1 is no report at all.
  AcceptanceBook::Taken t = book.take(drafts({{2, 1, 10, -1, 2, 1}, {3, 1, 10, -1, 0, -1}}), Status::ok);
  EXPECT_EQ(t.unmatched, 1);
  EXPECT_TRUE(t.counted.empty());
  // Slot 2 drafted k' = 2 above: a report of 3 is more than it drafted.
  t = book.take(drafts({{2, 1, 12, -1, 0, 3}}), Status::ok);
  EXPECT_EQ(t.unmatched, 1);
  // A reset forgets the slot's draft; the report in the resetting step still concerns the old one.
  book.take(drafts({{1, 1, 10, -1, 4}}), Status::ok);
  t = book.take(drafts({{1, 1, 14, -1, 0, 4}}, {1}), Status::ok);
  EXPECT_EQ(t.counted.size(), 1u);
  book.take(drafts({}, {1}), Status::ok);
  EXPECT_EQ(book.take(drafts({{1, 1, 0, -1, 0, 1}}), Status::ok).unmatched, 1);
  // A failed step resets the slots it drafted; a rejected one changes nothing.
  book.take(drafts({{0, 1, 10, -1, 1}}), Status::internal);
  EXPECT_EQ(book.take(drafts({{0, 1, 10, -1, 0, 1}}), Status::invalid_argument).unmatched, 0);
  EXPECT_EQ(book.take(drafts({{0, 1, 10, -1, 0, 1}}), Status::ok).unmatched, 1);
  // The host left: nothing of it is matched any more.
  book.forget_all();
  EXPECT_EQ(book.take(drafts({{0, 1, 10, -1, 0, 1}}), Status::ok).unmatched, 1);
  EXPECT_EQ(book.tally(4).reports, 1u);
  EXPECT_THROW(book.tally(0), Error);
  EXPECT_THROW(book.tally(6), Error);
}

}  // namespace
}  // namespace dspark
