// A test double of the Drafter for the host-message fuzz (not a model): it keeps each slot's KV ring as the
// real one does (W positions, position p at ring index p % W, an insert longer than W keeps its last W rows),
// but stores a digest per row instead of K/V, and answers a draft with ids derived from the digests of the
// positions the request sees. Its checks are the Drafter's (the same exceptions for the same arguments), so
// the step loop runs against it exactly as against the real drafter, about a million times faster.
#pragma once

#include <vector>

#include "lib/model/draft_engine.hpp"
#include "tests/fuzz/fuzz_shape.hpp"

namespace dspark::fuzz {

// What a rejected message must leave unchanged: every slot's ring and the max_model_len in force.
struct DrafterState {
  std::vector<int32_t> pos;      // [slots, W]: the position held, -1 for none
  std::vector<uint64_t> digest;  // [slots, W]: its row's digest
  int64_t max_model_len = 0;
  bool operator==(const DrafterState&) const = default;
};

class FakeDrafter final : public DraftEngine {
 public:
  explicit FakeDrafter(const Shape& shape);

  int64_t row_dim() const override { return shape_.row_dim; }
  void insert_blocks(std::span<const ContextBlock> blocks, const bf16_t* rows) override;
  void validate_inserts(std::span<const ContextBlock> blocks) const override;
  DraftResult draft(std::span<const DraftRequest> requests, bool with_margin) override;
  void reset(int64_t slot) override;
  void validate(std::span<const DraftRequest> requests) const override;
  void set_max_model_len(int64_t n) override;

  const DrafterState& state() const { return state_; }
  // Replaces the state (the fuzz re-synchronises after a failed step, which the naive model does not follow).
  void set_state(const DrafterState& s) { state_ = s; }

 private:
  Shape shape_;
  DrafterState state_;
};

// The context digest a draft of `slot` sees: the ring entries at positions [low, pos) combined, where low is
// the request's window low or max(0, pos - W).
uint64_t context_digest(const std::vector<int32_t>& ring_pos, const std::vector<uint64_t>& ring_digest,
                        int64_t W, int64_t slot, int64_t low, int64_t pos);

}  // namespace dspark::fuzz
