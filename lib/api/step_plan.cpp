#include "lib/api/step_plan.hpp"

#include <fmt/format.h>

#include "lib/core/error.hpp"
#include "lib/core/non_finite.hpp"
#include "lib/core/sampling.hpp"

namespace dspark {
namespace {

StatusOr invalid(std::string m) {
  return {Status::invalid_argument, std::move(m)};
}
StatusOr exhausted(std::string m) {
  return {Status::resource_exhausted, std::move(m)};
}

}  // namespace

StatusOr check_plan(const StepPlan& p, const StepLimits& l, PlanCheck what) {
  if (p.shutdown) return {};
  if (p.max_model_len < 0 || p.max_model_len > l.max_model_len_limit)
    return invalid(fmt::format("max_model_len {} outside [1, {}]", p.max_model_len, l.max_model_len_limit));
  const int64_t mml = p.max_model_len > 0 ? p.max_model_len : l.max_model_len;
  for (int32_t s : p.resets)
    if (s < 0 || s >= l.slots) return invalid(fmt::format("reset: slot {} out of range [0, {})", s, l.slots));
  int64_t total = 0;
  for (size_t i = 0; i < p.contexts.size(); ++i) {
    const ContextBlock& c = p.contexts[i];
    if (c.slot < 0 || c.slot >= l.slots)
      return invalid(fmt::format("context {}: slot {} out of range [0, {})", i, c.slot, l.slots));
    if (c.rows < 1) return invalid(fmt::format("context {}: {} rows", i, c.rows));
    if (c.first_pos < 0 || int64_t{c.first_pos} + c.rows > mml)
      return invalid(fmt::format("context {}: positions [{}, {}) outside [0, max_model_len = {})", i,
                                 c.first_pos, int64_t{c.first_pos} + c.rows, mml));
    total += c.rows;
  }
  if (what == PlanCheck::message && total > l.max_context_rows)
    return exhausted(fmt::format("{} context rows over max_context_rows {}", total, l.max_context_rows));
  if (what == PlanCheck::message && static_cast<int64_t>(p.rows.size()) != total * l.row_dim)
    return invalid(
        fmt::format("context rows carry {} values, expected {} rows of {}", p.rows.size(), total, l.row_dim));
  if (what == PlanCheck::message) {
    // A NaN or Inf (bf16 exponent all ones) in a context row would reach every later draft of its slot. The
    // vectorised scan: a step's rows are up to megabytes, scanned on the step's critical path.
    const int64_t at =
        p.rows_first_non_finite != kRowsNotScanned
            ? p.rows_first_non_finite
            : first_non_finite(DType::bf16, p.rows.data(), static_cast<int64_t>(p.rows.size()));
    if (at >= 0) {
      const int64_t row = at / l.row_dim;
      int64_t block = 0, first = 0;
      while (first + p.contexts[static_cast<size_t>(block)].rows <= row) first += p.contexts[block++].rows;
      return invalid(fmt::format("context {}: row {} holds a non-finite value (NaN or Inf) at element {}",
                                 block, row - first, at % l.row_dim));
    }
  }
  const int64_t B = static_cast<int64_t>(p.drafts.size());
  if (B > l.max_batch) return exhausted(fmt::format("batch of {} over max_batch {}", B, l.max_batch));
  for (int64_t b = 0; b < B; ++b) {
    const DraftRequest& r = p.drafts[static_cast<size_t>(b)];
    if (r.slot < 0 || r.slot >= l.slots)
      return invalid(fmt::format("request {}: slot {} out of range [0, {})", b, r.slot, l.slots));
    if (r.anchor_token < 0 || r.anchor_token >= l.vocab_size)
      return invalid(
          fmt::format("request {}: token {} out of range [0, {})", b, r.anchor_token, l.vocab_size));
    if (r.anchor_pos < 0 || r.anchor_pos >= mml)
      return invalid(
          fmt::format("request {}: position {} outside [0, max_model_len = {})", b, r.anchor_pos, mml));
    if (r.outputs < 0 || r.outputs > l.block_size)
      return invalid(fmt::format("request {}: k' = {} outside [0, k = {}]", b, r.outputs, l.block_size));
    if (r.window_low < -1 || r.window_low > r.anchor_pos)
      return invalid(
          fmt::format("request {}: window low {} outside [-1, {}]", b, r.window_low, r.anchor_pos));
    if (r.accepted < -1 || r.accepted > l.block_size)
      return invalid(fmt::format("request {}: accepted {} outside [-1 (no report), k = {}]", b, r.accepted,
                                 l.block_size));
    if (const std::string why = sampling_problem(r); !why.empty())
      return invalid(fmt::format("request {}: {}", b, why));
  }
  if (const int64_t n = distributions_asked(p.drafts); n > l.max_distributions)
    return exhausted(fmt::format("{} requests ask for the whole distribution, over max_distributions {}", n,
                                 l.max_distributions));
  return {};
}

void validate_draft_batch(std::span<const DraftRequest> requests, const DraftLimits& limits) {
  const auto B = static_cast<int64_t>(requests.size());
  if (B < 1) fail("draft: empty batch");
  if (B > limits.max_batch) fail("draft: batch of {} over max_batch {}", B, limits.max_batch);
  for (int64_t b = 0; b < B; ++b) {
    const DraftRequest& r = requests[static_cast<size_t>(b)];
    if (r.slot < 0 || r.slot >= limits.slots)
      fail("draft request {}: slot {} out of range [0, {})", b, r.slot, limits.slots);
    if (r.anchor_token < 0 || r.anchor_token >= limits.vocab)
      fail("draft request {}: token {} out of range [0, {})", b, r.anchor_token, limits.vocab);
    if (r.anchor_pos < 0 || r.anchor_pos >= limits.max_model_len)
      fail("draft request {}: position {} outside [0, max_model_len = {})", b, r.anchor_pos,
           limits.max_model_len);
    if (r.outputs < 0 || r.outputs > limits.k)
      fail("draft request {}: k' = {} outside [0, k = {}]", b, r.outputs, limits.k);
    if (r.window_low > r.anchor_pos)
      fail("draft request {}: window low {} above the anchor position {}", b, r.window_low, r.anchor_pos);
    if (const std::string why = sampling_problem(r); !why.empty()) fail("draft request {}: {}", b, why);
  }
  if (const int64_t n = distributions_asked(requests); n > limits.max_distributions)
    fail("draft: {} requests ask for the whole distribution, over max_distributions {}", n,
         limits.max_distributions);
}

std::string sampling_problem(const DraftRequest& r) {
  if (std::string why = temperature_problem(r.temperature); !why.empty()) return why;
  if (r.distribution && r.temperature == 0.0f)
    return "the whole distribution needs a temperature > 0 (a greedy draft's is its token)";
  return {};
}

int64_t distributions_asked(std::span<const DraftRequest> requests) {
  int64_t n = 0;
  for (const DraftRequest& r : requests) n += r.distribution ? 1 : 0;
  return n;
}

void validate_insert(int64_t slot, int64_t first_pos, int64_t n, int64_t slots, int64_t max_model_len) {
  if (slot < 0 || slot >= slots) fail("insert: slot {} out of range [0, {})", slot, slots);
  if (first_pos < 0 || n < 0 || first_pos + n > max_model_len)
    fail("insert: positions [{}, {}) outside [0, max_model_len = {})", first_pos, first_pos + n,
         max_model_len);
}

void validate_context_blocks(std::span<const ContextBlock> blocks, int64_t slots, int64_t max_model_len) {
  for (size_t i = 0; i < blocks.size(); ++i) {
    const ContextBlock& b = blocks[i];
    try {
      validate_insert(b.slot, b.first_pos, b.rows, slots, max_model_len);
    } catch (const Error& e) {
      fail("context block {}: {}", i, e.what());
    }
  }
}

}  // namespace dspark
