#include "tests/fuzz/fake_drafter.hpp"

#include <algorithm>

#include "lib/api/step_plan.hpp"
#include "lib/core/error.hpp"

namespace dspark::fuzz {

FakeDrafter::FakeDrafter(const Shape& shape) : shape_(shape) {
  const auto n = static_cast<size_t>(shape.slots * shape.window);
  state_.pos.assign(n, -1);
  state_.digest.assign(n, 0);
  state_.max_model_len = shape.max_model_len;
}

void FakeDrafter::reset(int64_t slot) {
  if (slot < 0 || slot >= shape_.slots) fail("reset: slot {} out of range [0, {})", slot, shape_.slots);
  const auto at = static_cast<size_t>(slot * shape_.window);
  std::fill_n(state_.pos.begin() + static_cast<std::ptrdiff_t>(at), shape_.window, -1);
  std::fill_n(state_.digest.begin() + static_cast<std::ptrdiff_t>(at), shape_.window, 0);
}

void FakeDrafter::set_max_model_len(int64_t n) {
  if (n < 1) fail("max_model_len {} must be positive", n);
  state_.max_model_len = n;
}

void FakeDrafter::validate_inserts(std::span<const ContextBlock> blocks) const {
  validate_context_blocks(blocks, shape_.slots, state_.max_model_len);
}

// Block after block, row after row: the sequential semantics the Drafter's packed insert must keep.
void FakeDrafter::insert_blocks(std::span<const ContextBlock> blocks, const bf16_t* rows) {
  validate_inserts(blocks);
  for (const ContextBlock& b : blocks) {
    for (int64_t i = 0; i < b.rows; ++i) {
      const int64_t p = b.first_pos + i;
      const auto at = static_cast<size_t>(b.slot * shape_.window + p % shape_.window);
      state_.pos[at] = static_cast<int32_t>(p);
      state_.digest[at] = row_digest(rows + i * shape_.row_dim, shape_.row_dim);
    }
    rows += static_cast<int64_t>(b.rows) * shape_.row_dim;
  }
}

void FakeDrafter::validate(std::span<const DraftRequest> requests) const {
  validate_draft_batch(requests, {shape_.max_batch, shape_.slots, shape_.vocab, state_.max_model_len,
                                  shape_.k, shape_.max_batch});
}

DraftResult FakeDrafter::draft(std::span<const DraftRequest> requests, bool with_margin) {
  validate(requests);
  DraftResult d;
  d.batch = static_cast<int64_t>(requests.size());
  d.k = shape_.k;
  const auto n = static_cast<size_t>(d.batch * d.k);
  d.ids.assign(n, 0);
  d.conf.assign(n, 0.0f);
  d.conf_logit.assign(n, 0.0f);
  d.margin.assign(n, 0.0f);
  d.q.assign(n, 0.0f);
  for (int64_t b = 0; b < d.batch; ++b) {
    const DraftRequest& r = requests[static_cast<size_t>(b)];
    const int64_t low = std::max<int64_t>(std::max<int64_t>(0, r.anchor_pos - shape_.window), r.window_low);
    const uint64_t ctx = context_digest(state_.pos, state_.digest, shape_.window, r.slot, low, r.anchor_pos);
    const int64_t outputs = r.outputs == 0 ? shape_.k : r.outputs;
    for (int64_t j = 0; j < outputs; ++j) {
      const auto at = static_cast<size_t>(b * d.k + j);
      d.ids[at] = answer_id(ctx, r.anchor_token, r.anchor_pos, j, shape_.vocab);
      d.conf_logit[at] = static_cast<float>(d.ids[at] % 7) - 3.0f;
      d.conf[at] = 0.5f;
      d.q[at] = 1.0f;  // greedy
      if (with_margin) d.margin[at] = 0.25f * static_cast<float>(j + 1);
    }
  }
  return d;
}

uint64_t context_digest(const std::vector<int32_t>& ring_pos, const std::vector<uint64_t>& ring_digest,
                        int64_t W, int64_t slot, int64_t low, int64_t pos) {
  uint64_t h = 0;
  for (int64_t i = 0; i < W; ++i) {  // order-free: a sum over the positions seen
    const auto at = static_cast<size_t>(slot * W + i);
    const int32_t p = ring_pos[at];
    if (p >= low && p < pos) h += mix(static_cast<uint64_t>(p), ring_digest[at]);
  }
  return h;
}

}  // namespace dspark::fuzz
