// What one step of the step loop runs against: context inserts, resets, a draft batch. Drafter implements it;
// tests put a cheap test double behind the step loop instead (the host-message fuzz, tests/fuzz/).
#pragma once

#include <cstdint>
#include <span>

#include "lib/api/draft_types.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {

class DraftEngine {
 public:
  virtual ~DraftEngine() = default;
  // bf16 values per context row (3H).
  virtual int64_t row_dim() const = 0;
  // Context rows [n, row_dim] of slot at positions first_pos .. first_pos + n - 1.
  virtual void insert(int64_t slot, int64_t first_pos, const bf16_t* rows, int64_t n) = 0;
  // One batch of requests; throws dspark::Error on an invalid request (nothing changes).
  virtual DraftResult draft(std::span<const DraftRequest> requests, bool with_margin) = 0;
  virtual void reset(int64_t slot) = 0;
  // The checks draft() starts with, on their own.
  virtual void validate(std::span<const DraftRequest> requests) const = 0;
  virtual void set_max_model_len(int64_t n) = 0;
};

}  // namespace dspark
