#include "lib/serve/acceptance_book.hpp"

#include "lib/core/error.hpp"

namespace dspark {

AcceptanceBook::AcceptanceBook(int64_t slots, int64_t k)
    : k_(k), last_(static_cast<size_t>(slots), 0), tallies_(static_cast<size_t>(k)) {
  for (int64_t kp = 1; kp <= k; ++kp) {
    Tally& t = tallies_[static_cast<size_t>(kp - 1)];
    t.reached.assign(static_cast<size_t>(kp), 0);
    t.accepted.assign(static_cast<size_t>(kp), 0);
  }
}

AcceptanceBook::Taken AcceptanceBook::take(const StepPlan& plan, Status s) {
  Taken out;
  if (s != Status::ok && s != Status::internal) return out;  // rejected before the ranks: nothing happened
  // The reports concern the drafts answered before this step (the step loop runs this step's resets first,
  // but a report names the draft the host already has).
  for (const DraftRequest& r : plan.drafts) {
    if (r.accepted < 0) continue;
    const int32_t kp = last_[static_cast<size_t>(r.slot)];
    if (kp == 0 || r.accepted > kp) {
      ++out.unmatched;
      continue;
    }
    Tally& t = tallies_[static_cast<size_t>(kp - 1)];
    ++t.reports;
    t.accepted_tokens += static_cast<uint64_t>(r.accepted);
    for (int32_t j = 0; j < kp && j <= r.accepted; ++j) {
      ++t.reached[static_cast<size_t>(j)];
      if (j < r.accepted) ++t.accepted[static_cast<size_t>(j)];
    }
    out.counted.push_back({kp, r.accepted});
  }
  for (const int32_t slot : plan.resets) last_[static_cast<size_t>(slot)] = 0;
  for (const DraftRequest& r : plan.drafts)
    last_[static_cast<size_t>(r.slot)] =
        s == Status::ok ? (r.outputs == 0 ? static_cast<int32_t>(k_) : r.outputs) : 0;
  if (s == Status::internal)
    for (const ContextBlock& c : plan.contexts) last_[static_cast<size_t>(c.slot)] = 0;
  return out;
}

void AcceptanceBook::forget_all() {
  std::fill(last_.begin(), last_.end(), 0);
}

const AcceptanceBook::Tally& AcceptanceBook::tally(int64_t k_prime) const {
  if (k_prime < 1 || k_prime > k_) fail("acceptance tally of k' = {}: outside [1, {}]", k_prime, k_);
  return tallies_[static_cast<size_t>(k_prime - 1)];
}

}  // namespace dspark
