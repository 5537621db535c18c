// A DraftEngine that hands every call to a Drafter: a wrapper derives from it to change or observe one call
// (the bench's step stamps; in tests a rank that stalls, a step that ends in an error) while the rest stays
// the drafter's.
#pragma once

#include <span>

#include "lib/model/drafter.hpp"

namespace dspark {

class ForwardingEngine : public DraftEngine {
 public:
  explicit ForwardingEngine(Drafter& d) : d_(d) {}
  int64_t row_dim() const override { return d_.row_dim(); }
  void insert_blocks(std::span<const ContextBlock> b, const bf16_t* rows) override {
    d_.insert_blocks(b, rows);
  }
  void validate_inserts(std::span<const ContextBlock> b) const override { d_.validate_inserts(b); }
  DraftResult draft(std::span<const DraftRequest> r, bool m) override { return d_.draft(r, m); }
  DraftResult insert_and_draft(std::span<const ContextBlock> b, const bf16_t* rows,
                               std::span<const DraftRequest> r, bool m) override {
    return d_.insert_and_draft(b, rows, r, m);
  }
  void reset(int64_t slot) override { d_.reset(slot); }
  void validate(std::span<const DraftRequest> r) const override { d_.validate(r); }
  void set_max_model_len(int64_t n) override { d_.set_max_model_len(n); }

 protected:
  Drafter& d_;
};

}  // namespace dspark
