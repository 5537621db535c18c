#include "lib/runtime/engine_sim.hpp"

#include <algorithm>

#include "lib/core/error.hpp"

namespace dspark {
namespace {
constexpr int64_t kMaxFixedRows = 64;  // dspark_bench --accepted-rows' range
}  // namespace

void EngineSim::fill_row(bf16_t* row, int64_t n, uint64_t seed, int64_t slot, int64_t pos) {
  std::mt19937_64 g(seed ^ (static_cast<uint64_t>(slot) << 40) ^
                    static_cast<uint64_t>(pos) * 0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) row[i] = float_to_bf16(normal(g));
}

EngineSim::EngineSim(const EngineShape& shape, const EngineSimOptions& options)
    : shape_(shape), opt_(options), rng_(options.seed) {
  const int64_t n = std::min({opt_.sequences, shape.slots, shape.max_batch});
  if (n < 1)
    fail("engine simulation: no sequences (sequences {}, slots {}, max_batch {})", opt_.sequences,
         shape.slots, shape.max_batch);
  if (opt_.prefill_rows < 1) fail("engine simulation: prefill rows must be positive");
  if (opt_.accept_prob < 0 || opt_.accept_prob > 1) fail("engine simulation: acceptance must be in [0, 1]");
  if (opt_.accepted_rows < 0 || opt_.accepted_rows > kMaxFixedRows)
    fail("engine simulation: accepted rows {} outside [0, {}]", opt_.accepted_rows, kMaxFixedRows);
  for (int64_t i = 0; i < n; ++i) seqs_.push_back({static_cast<int32_t>(i), 0, 0, 0, true});
}

void EngineSim::append_rows(StepPlan& plan, const Sequence& s, int64_t first, int64_t n) const {
  const size_t at = plan.rows.size();
  plan.rows.resize(at + static_cast<size_t>(n * shape_.row_dim));
  for (int64_t i = 0; i < n; ++i)
    fill_row(plan.rows.data() + at + i * shape_.row_dim, shape_.row_dim, opt_.seed, s.slot, first + i);
  plan.contexts.push_back({s.slot, static_cast<int32_t>(first), static_cast<int32_t>(n)});
}

StepPlan EngineSim::next_step() {
  StepPlan plan;
  plan.id = steps_++;
  const int64_t k = shape_.block_size;
  int64_t rows_left = shape_.max_context_rows;
  for (Sequence& s : seqs_) {
    // A sequence about to run past max_model_len starts over (reset + a new prefill).
    if (!s.fresh && s.pos + s.pending + k >= shape_.max_model_len) {
      plan.resets.push_back(s.slot);
      s = {s.slot, 0, 0, 0, true};
    }
    if (s.fresh) {
      const int64_t n = std::min(opt_.prefill_rows, shape_.max_model_len - k - 1);
      if (n > rows_left) continue;  // no room this step: this sequence waits
      append_rows(plan, s, 0, n);
      rows_left -= n;
      s.pos = n;
      s.anchor = static_cast<int32_t>(rng_() % static_cast<uint64_t>(shape_.vocab_size));
      s.fresh = false;
    } else if (s.pending > 0) {
      if (s.pending > rows_left) continue;
      append_rows(plan, s, s.pos, s.pending);
      rows_left -= s.pending;
      s.pos += s.pending;
      s.pending = 0;
    }
    plan.drafts.push_back({s.slot, s.anchor, static_cast<int32_t>(s.pos), -1, 0});
  }
  return plan;
}

void EngineSim::step_done(const StepPlan& plan, bool ok) {
  auto restart = [&](int32_t slot) {
    for (Sequence& s : seqs_)
      if (s.slot == slot) s = {slot, 0, 0, 0, true};
  };
  if (!ok) {
    for (const DraftRequest& r : plan.drafts) restart(r.slot);
    for (const ContextBlock& c : plan.contexts) restart(c.slot);
    return;
  }
  const int64_t k = shape_.block_size;
  for (const DraftRequest& r : plan.drafts) {
    // Seeded verification: accepted prefix length and the target's next token, independent of the drafts.
    std::bernoulli_distribution accept(opt_.accept_prob);
    int64_t a = 0;
    if (opt_.accepted_rows == 0)
      while (a < k && accept(rng_)) ++a;
    for (Sequence& s : seqs_) {
      if (s.slot != r.slot) continue;
      // The anchor's row and the accepted tokens' rows, or the fixed count.
      s.pending = opt_.accepted_rows > 0 ? opt_.accepted_rows : a + 1;
      s.anchor = static_cast<int32_t>(rng_() % static_cast<uint64_t>(shape_.vocab_size));
    }
  }
}

}  // namespace dspark
