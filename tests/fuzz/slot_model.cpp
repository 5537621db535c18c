#include "tests/fuzz/slot_model.hpp"

#include <algorithm>

namespace dspark::fuzz {

SlotModel::SlotModel(const Shape& shape)
    : shape_(shape), max_model_len_(shape.max_model_len), log_(static_cast<size_t>(shape.slots)) {}

Expected SlotModel::expect(const StepPlan& p, bool sets_max_model_len) const {
  Expected e;
  const auto slot_ok = [&](int64_t s) { return 0 <= s && s < shape_.slots; };
  // max_model_len: 0 keeps the current one; otherwise 1 .. the configured limit.
  if (p.max_model_len < (sets_max_model_len ? 1 : 0) || p.max_model_len > shape_.max_model_len)
    e.invalid = true;
  const int64_t mml = p.max_model_len > 0 ? p.max_model_len : max_model_len_;
  for (int32_t s : p.resets) e.invalid |= !slot_ok(s);
  int64_t rows = 0;
  for (const ContextBlock& c : p.contexts) {
    e.invalid |=
        !slot_ok(c.slot) || c.rows < 1 || c.first_pos < 0 || int64_t{c.first_pos} + int64_t{c.rows} > mml;
    rows += c.rows;
  }
  e.exhausted |= rows > shape_.max_context_rows;
  if (static_cast<int64_t>(p.rows.size()) != rows * shape_.row_dim) e.invalid = true;
  for (bf16_t v : p.rows) e.invalid |= (v & 0x7f80) == 0x7f80;  // NaN or Inf
  e.exhausted |= static_cast<int64_t>(p.drafts.size()) > shape_.max_batch;
  int64_t distributions = 0;
  for (const DraftRequest& r : p.drafts) {
    e.invalid |= !slot_ok(r.slot) || r.anchor_token < 0 || r.anchor_token >= shape_.vocab ||
                 r.anchor_pos < 0 || r.anchor_pos >= mml || r.outputs < 0 || r.outputs > shape_.k ||
                 r.window_low < -1 || r.window_low > r.anchor_pos || r.accepted < -1 || r.accepted > shape_.k;
    // SPEC §4: a temperature of 0 (greedy) or in (0, 100]; the whole distribution only of a sampled draft.
    e.invalid |=
        !(r.temperature >= 0.0f && r.temperature <= 100.0f) || (r.distribution && r.temperature == 0.0f);
    distributions += r.distribution ? 1 : 0;
  }
  e.exhausted |= distributions > shape_.max_distributions;
  return e;
}

void SlotModel::apply(const StepPlan& p) {
  if (p.max_model_len > 0) max_model_len_ = p.max_model_len;
  for (int32_t s : p.resets) log_[static_cast<size_t>(s)].clear();
  size_t row = 0;
  for (const ContextBlock& c : p.contexts)
    for (int32_t i = 0; i < c.rows; ++i, ++row)
      log_[static_cast<size_t>(c.slot)].emplace_back(
          int64_t{c.first_pos} + i,
          row_digest(p.rows.data() + row * static_cast<size_t>(shape_.row_dim), shape_.row_dim));
}

DrafterState SlotModel::drafter_state() const {
  DrafterState s;
  const auto n = static_cast<size_t>(shape_.slots * shape_.window);
  s.pos.assign(n, -1);
  s.digest.assign(n, 0);
  s.max_model_len = max_model_len_;
  for (int64_t slot = 0; slot < shape_.slots; ++slot)
    for (const auto& [pos, digest] : log_[static_cast<size_t>(slot)]) {  // later rows overwrite earlier ones
      const auto at = static_cast<size_t>(slot * shape_.window + pos % shape_.window);
      s.pos[at] = static_cast<int32_t>(pos);
      s.digest[at] = digest;
    }
  return s;
}

DraftResult SlotModel::expected_draft(const StepPlan& p) const {
  const DrafterState s = drafter_state();
  DraftResult d;
  d.batch = static_cast<int64_t>(p.drafts.size());
  d.k = shape_.k;
  d.ids.assign(static_cast<size_t>(d.batch * d.k), 0);
  for (int64_t b = 0; b < d.batch; ++b) {
    const DraftRequest& r = p.drafts[static_cast<size_t>(b)];
    const int64_t low = std::max<int64_t>({0, r.anchor_pos - shape_.window, r.window_low});
    const uint64_t ctx = context_digest(s.pos, s.digest, shape_.window, r.slot, low, r.anchor_pos);
    for (int64_t j = 0; j < (r.outputs == 0 ? shape_.k : r.outputs); ++j)
      d.ids[static_cast<size_t>(b * d.k + j)] = answer_id(ctx, r.anchor_token, r.anchor_pos, j, shape_.vocab);
  }
  return d;
}

void SlotModel::resync(const DrafterState& s) {
  max_model_len_ = s.max_model_len;
  for (int64_t slot = 0; slot < shape_.slots; ++slot) {
    auto& log = log_[static_cast<size_t>(slot)];
    log.clear();
    for (int64_t i = 0; i < shape_.window; ++i) {
      const auto at = static_cast<size_t>(slot * shape_.window + i);
      if (s.pos[at] >= 0) log.emplace_back(s.pos[at], s.digest[at]);
    }
  }
}

}  // namespace dspark::fuzz
