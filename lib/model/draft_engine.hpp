// What one step of the step loop runs against: context inserts, resets, a draft batch. Drafter implements it;
// tests put a cheap test double behind the step loop instead (the host-message fuzz, tests/fuzz/).
#pragma once

#include <climits>
#include <cstdint>
#include <span>

#include "lib/api/draft_types.hpp"
#include "lib/api/step_plan.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"

namespace dspark {

class DraftEngine {
 public:
  virtual ~DraftEngine() = default;
  // bf16 values per context row (3H).
  virtual int64_t row_dim() const = 0;
  // A step's context blocks, their rows [sum of rows, row_dim] in block order, as if inserted one after the
  // other. Every block is checked before anything is written (dspark::Error naming the block: nothing
  // changes).
  virtual void insert_blocks(std::span<const ContextBlock> blocks, const bf16_t* rows) = 0;
  // The checks insert_blocks starts with, on their own.
  virtual void validate_inserts(std::span<const ContextBlock> blocks) const = 0;
  // One batch of requests; throws dspark::Error on an invalid request (nothing changes).
  virtual DraftResult draft(std::span<const DraftRequest> requests, bool with_margin) = 0;
  // A step's inserts and then its draft (the Drafter runs both as one recording where it holds one).
  virtual DraftResult insert_and_draft(std::span<const ContextBlock> blocks, const bf16_t* rows,
                                       std::span<const DraftRequest> requests, bool with_margin) {
    insert_blocks(blocks, rows);
    return draft(requests, with_margin);
  }
  virtual void reset(int64_t slot) = 0;
  // The checks draft() starts with, on their own.
  virtual void validate(std::span<const DraftRequest> requests) const = 0;
  virtual void set_max_model_len(int64_t n) = 0;

  // Context rows [n, row_dim] of slot at positions first_pos .. first_pos + n - 1: one block.
  void insert(int64_t slot, int64_t first_pos, const bf16_t* rows, int64_t n) {
    constexpr int64_t kMax = INT32_MAX;
    if (slot < 0 || slot > kMax || first_pos < 0 || first_pos > kMax || n < 0 || n > kMax)
      fail("insert: slot {}, first position {} and {} rows must each be in [0, {}]", slot, first_pos, n,
           kMax);
    const ContextBlock b{static_cast<int32_t>(slot), static_cast<int32_t>(first_pos),
                         static_cast<int32_t>(n)};
    insert_blocks(std::span(&b, 1), rows);
  }
};

}  // namespace dspark
