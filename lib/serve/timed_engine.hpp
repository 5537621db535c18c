// Rank 0's drafter behind the step loop, timing a step's context inserts and its draft for the metrics. The
// times are this host thread's: a step with both runs them as one call (one replay where the drafter holds
// the recording), observed as the draft; a step with context rows alone observes the insert, which on the
// cuda backend returns once its work is queued.
#pragma once

#include "lib/model/draft_engine.hpp"
#include "lib/serve/metrics.hpp"

namespace dspark {

class TimedEngine final : public DraftEngine {
 public:
  TimedEngine(DraftEngine& inner, Metrics& metrics) : inner_(inner), metrics_(metrics) {}

  int64_t row_dim() const override { return inner_.row_dim(); }
  void insert_blocks(std::span<const ContextBlock> blocks, const bf16_t* rows) override;
  void validate_inserts(std::span<const ContextBlock> blocks) const override {
    inner_.validate_inserts(blocks);
  }
  DraftResult draft(std::span<const DraftRequest> requests, bool with_margin) override;
  DraftResult insert_and_draft(std::span<const ContextBlock> blocks, const bf16_t* rows,
                               std::span<const DraftRequest> requests, bool with_margin) override;
  void reset(int64_t slot) override { inner_.reset(slot); }
  void validate(std::span<const DraftRequest> requests) const override { inner_.validate(requests); }
  void set_max_model_len(int64_t n) override { inner_.set_max_model_len(n); }

 private:
  DraftEngine& inner_;
  Metrics& metrics_;
};

}  // namespace dspark
