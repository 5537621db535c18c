// One step of the SPMD loop (SPEC §6) as plain data: what rank 0 took from the host and checks against the
// limits before broadcasting it (runtime/plan_broadcast.hpp). The host codec and the client use it too.
#pragma once

#include <cstdint>
#include <memory>
#include <new>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "lib/api/draft_types.hpp"
#include "lib/api/status.hpp"
#include "lib/core/numeric.hpp"
#include "lib/core/row_memory.hpp"

namespace dspark {

// The allocator of a plan's rows. Its memory comes from the row memory pool (lib/core/row_memory.hpp):
// page-locked and mapped where the backend installed a provider, so that an insert reads a plan's rows where
// they were decoded or received. resize() leaves the new elements uninitialised: the rows are always written
// whole once sized (decoded, broadcast, generated), so zeroing them first would be one more pass over a
// step's largest data.
template <typename T>
struct RowAllocator {
  using value_type = T;
  RowAllocator() = default;
  template <typename U>
  RowAllocator(const RowAllocator<U>&) noexcept {}
  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_array_new_length();
    return static_cast<T*>(allocate_row_memory(n * sizeof(T)));
  }
  void deallocate(T* p, size_t) noexcept { release_row_memory(p); }
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... A>
  void construct(U* p, A&&... a) {
    ::new (static_cast<void*>(p)) U(std::forward<A>(a)...);
  }
};
template <typename T, typename U>
bool operator==(const RowAllocator<T>&, const RowAllocator<U>&) noexcept {
  return true;
}
// The context rows of a plan, [total rows, 3H] bf16.
using RowVector = std::vector<bf16_t, RowAllocator<bf16_t>>;

struct ContextBlock {
  int32_t slot = 0;
  int32_t first_pos = 0;
  int32_t rows = 0;  // this block's rows, in order, in StepPlan::rows
};

constexpr int64_t kRowsNotScanned = -2;

struct StepPlan {
  uint64_t id = 0;
  bool shutdown = false;      // every rank leaves the loop
  int64_t max_model_len = 0;  // > 0: set the drafter's max_model_len before the step
  std::vector<int32_t> resets;
  std::vector<ContextBlock> contexts;
  RowVector rows;  // [total rows, 3H]
  // The index in `rows` of their first NaN or Inf (-1: none) where the code that filled them found it on
  // the way (the host message's decode); kRowsNotScanned makes check_plan scan them.
  int64_t rows_first_non_finite = kRowsNotScanned;
  std::vector<DraftRequest> drafts;
  bool margin = true;
};

// The limits a plan is checked against (from the worker config and the model).
struct StepLimits {
  int64_t slots = 0;
  int64_t max_batch = 0;
  int64_t max_context_rows = 0;
  int64_t max_model_len = 0;        // the current one
  int64_t max_model_len_limit = 0;  // the largest the worker accepts (its configured value)
  int64_t vocab_size = 0;
  int64_t block_size = 0;
  int64_t row_dim = 0;
  int64_t max_distributions = 0;  // draft requests per step that may ask for their whole distribution
};

// What check_plan looks at: a whole message (everything), or only the fields of a step a client is about to
// send in several messages (no per-message row limit, no row payload yet).
enum class PlanCheck { message, fields };

// invalid_argument / resource_exhausted with a message naming the field, or ok. Checked on rank 0 before the
// broadcast, so a rejected plan changes nothing anywhere; the client runs the same checks before a split
// send.
StatusOr check_plan(const StepPlan& plan, const StepLimits& limits, PlanCheck what = PlanCheck::message);

// A draft batch against the drafter's own limits (batch size, slots, vocabulary, positions, k' and window):
// throws dspark::Error naming the request and the field. What a drafter checks before it runs a batch.
struct DraftLimits {
  int64_t max_batch, slots, vocab, max_model_len, k, max_distributions;
};
void validate_draft_batch(std::span<const DraftRequest> requests, const DraftLimits& limits);
// Empty when a request's temperature and distribution flag are valid (SPEC §4), else why not.
std::string sampling_problem(const DraftRequest& r);
// The requests of a batch that ask for their whole distribution.
int64_t distributions_asked(std::span<const DraftRequest> requests);
// A context insert of n rows at first_pos into `slot`, against `slots` and the current max_model_len: throws
// dspark::Error naming what is out of range.
void validate_insert(int64_t slot, int64_t first_pos, int64_t n, int64_t slots, int64_t max_model_len);
// validate_insert for every block, the message naming the block's index.
void validate_context_blocks(std::span<const ContextBlock> blocks, int64_t slots, int64_t max_model_len);

}  // namespace dspark
