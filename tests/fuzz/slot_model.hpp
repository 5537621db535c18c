// The naive model the host-message fuzz holds the step loop to: every slot's context as a plain log of the
// rows inserted since its last reset, and the rules of SPEC §7 for which plans are accepted, written out on
// their own (not check_plan's code).
#pragma once

#include <utility>
#include <vector>

#include "lib/api/step_plan.hpp"
#include "tests/fuzz/fake_drafter.hpp"

namespace dspark::fuzz {

// Which kinds of problem a plan has; accepted when neither.
struct Expected {
  bool invalid = false;    // a slot, token, position, k', window, count or value out of range
  bool exhausted = false;  // more rows or requests than the limits
  bool accepted() const { return !invalid && !exhausted; }
};

class SlotModel {
 public:
  explicit SlotModel(const Shape& shape);

  // `sets_max_model_len`: the plan of a set_max_model_len message, whose value must be 1 .. the limit (0 is
  // not "no change" there).
  Expected expect(const StepPlan& plan, bool sets_max_model_len) const;
  // An accepted plan: max_model_len, then the resets, then the contexts in order.
  void apply(const StepPlan& plan);
  // The drafter state the log implies: for each ring index, the last row logged at a position of that index.
  DrafterState drafter_state() const;
  // The answer the fake must give to the plan's drafts (after apply), from the model's own ring.
  DraftResult expected_draft(const StepPlan& plan) const;
  // Follows the drafter where the model cannot (after a failed step).
  void resync(const DrafterState& s);
  int64_t max_model_len() const { return max_model_len_; }

 private:
  Shape shape_;
  int64_t max_model_len_;
  std::vector<std::vector<std::pair<int64_t, uint64_t>>> log_;  // per slot: (position, row digest)
};

}  // namespace dspark::fuzz
