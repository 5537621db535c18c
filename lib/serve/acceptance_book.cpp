#include "lib/serve/acceptance_book.hpp"

#include "lib/core/error.hpp"

namespace dspark {

int temperature_class(float tau) {
  if (!(tau > 0.0f)) return 0;
  if (tau <= 0.5f) return 1;
  if (tau <= 1.0f) return 2;
  return tau <= 2.0f ? 3 : 4;
}

const char* temperature_class_name(int c) {
  static constexpr const char* kNames[kTemperatureClasses] = {"0", "(0,0.5]", "(0.5,1]", "(1,2]", "(2,100]"};
  if (c < 0 || c >= kTemperatureClasses)
    fail("temperature class {}: outside [0, {})", c, kTemperatureClasses);
  return kNames[c];
}

AcceptanceBook::AcceptanceBook(int64_t slots, int64_t k)
    : k_(k), last_(static_cast<size_t>(slots)), tallies_(static_cast<size_t>(k * kTemperatureClasses)) {
  for (int c = 0; c < kTemperatureClasses; ++c)
    for (int64_t kp = 1; kp <= k; ++kp) {
      Tally& t = tallies_[static_cast<size_t>(c * k + kp - 1)];
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
    const LastDraft last = last_[static_cast<size_t>(r.slot)];
    const int32_t kp = last.k;
    if (kp == 0 || r.accepted > kp) {
      ++out.unmatched;
      continue;
    }
    Tally& t = tallies_[static_cast<size_t>(last.temperature_class * k_ + kp - 1)];
    ++t.reports;
    t.accepted_tokens += static_cast<uint64_t>(r.accepted);
    for (int32_t j = 0; j < kp && j <= r.accepted; ++j) {
      ++t.reached[static_cast<size_t>(j)];
      if (j < r.accepted) ++t.accepted[static_cast<size_t>(j)];
    }
    out.counted.push_back({kp, r.accepted, last.temperature_class});
  }
  for (const int32_t slot : plan.resets) last_[static_cast<size_t>(slot)] = {};
  for (const DraftRequest& r : plan.drafts)
    last_[static_cast<size_t>(r.slot)] =
        s == Status::ok ? LastDraft{r.outputs == 0 ? static_cast<int32_t>(k_) : r.outputs,
                                    temperature_class(r.temperature)}
                        : LastDraft{};
  if (s == Status::internal)
    for (const ContextBlock& c : plan.contexts) last_[static_cast<size_t>(c.slot)] = {};
  return out;
}

void AcceptanceBook::forget_all() {
  std::fill(last_.begin(), last_.end(), LastDraft{});
}

const AcceptanceBook::Tally& AcceptanceBook::tally(int64_t k_prime, int temperature_class) const {
  if (k_prime < 1 || k_prime > k_) fail("acceptance tally of k' = {}: outside [1, {}]", k_prime, k_);
  if (temperature_class < 0 || temperature_class >= kTemperatureClasses)
    fail("acceptance tally of temperature class {}: outside [0, {})", temperature_class, kTemperatureClasses);
  return tallies_[static_cast<size_t>(temperature_class * k_ + k_prime - 1)];
}

}  // namespace dspark
