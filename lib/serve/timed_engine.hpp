// Rank 0's drafter behind the step loop, timing each context insert and each draft batch for the metrics.
// The times are this host thread's: on the cuda backend an insert returns once its work is queued, and its
// GPU time ends inside the draft that follows (which waits for its answer).
#pragma once

#include "lib/model/draft_engine.hpp"
#include "lib/serve/metrics.hpp"

namespace dspark {

class TimedEngine final : public DraftEngine {
 public:
  TimedEngine(DraftEngine& inner, Metrics& metrics) : inner_(inner), metrics_(metrics) {}

  int64_t row_dim() const override { return inner_.row_dim(); }
  void insert(int64_t slot, int64_t first_pos, const bf16_t* rows, int64_t n) override;
  DraftResult draft(std::span<const DraftRequest> requests, bool with_margin) override;
  void reset(int64_t slot) override { inner_.reset(slot); }
  void validate(std::span<const DraftRequest> requests) const override { inner_.validate(requests); }
  void set_max_model_len(int64_t n) override { inner_.set_max_model_len(n); }

 private:
  DraftEngine& inner_;
  Metrics& metrics_;
};

}  // namespace dspark
