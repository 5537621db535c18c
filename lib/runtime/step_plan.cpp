#include "runtime/step_plan.hpp"

#include <fmt/format.h>

#include <cstring>

#include "core/error.hpp"

namespace dspark {
namespace {

StatusOr invalid(std::string m) {
  return {Status::invalid_argument, std::move(m)};
}
StatusOr exhausted(std::string m) {
  return {Status::resource_exhausted, std::move(m)};
}

// The fixed part of a broadcast plan; the payload's size follows from the counts.
struct PlanHeader {
  uint64_t magic;
  uint64_t id;
  int64_t max_model_len;
  uint32_t shutdown, margin;
  uint32_t resets, contexts, drafts, pad;
  uint64_t rows;  // bf16 values
};
constexpr uint64_t kPlanMagic = 0x4e414c504b525053ull;  // "SPRKPLAN"

template <typename T>
void append(std::vector<uint8_t>& out, const std::vector<T>& v) {
  const size_t at = out.size();
  out.resize(at + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(T));
}

template <typename T>
void take(const std::vector<uint8_t>& in, size_t& at, std::vector<T>& v, size_t n) {
  v.resize(n);
  if (n) std::memcpy(v.data(), in.data() + at, n * sizeof(T));
  at += n * sizeof(T);
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
  }
  return {};
}

void broadcast_plan(Communicator& comm, StepPlan& plan, int64_t row_dim, int root) {
  PlanHeader h{};
  std::vector<uint8_t> payload;
  if (comm.rank() == root) {
    h = {kPlanMagic,
         plan.id,
         plan.max_model_len,
         plan.shutdown ? 1u : 0u,
         plan.margin ? 1u : 0u,
         static_cast<uint32_t>(plan.resets.size()),
         static_cast<uint32_t>(plan.contexts.size()),
         static_cast<uint32_t>(plan.drafts.size()),
         0,
         plan.rows.size()};
    append(payload, plan.resets);
    append(payload, plan.contexts);
    append(payload, plan.drafts);
    append(payload, plan.rows);
  }
  comm.broadcast(&h, sizeof(h), root);
  if (h.magic != kPlanMagic) fail("step plan broadcast: bad header magic {:#x}", h.magic);
  const size_t bytes = h.resets * sizeof(int32_t) + h.contexts * sizeof(ContextBlock) +
                       h.drafts * sizeof(DraftRequest) + h.rows * sizeof(bf16_t);
  if (h.rows % static_cast<uint64_t>(row_dim) != 0) fail("step plan broadcast: {} row values", h.rows);
  payload.resize(bytes);
  comm.broadcast(payload.data(), bytes, root);
  if (comm.rank() == root) return;
  plan = StepPlan{};
  plan.id = h.id;
  plan.max_model_len = h.max_model_len;
  plan.shutdown = h.shutdown != 0;
  plan.margin = h.margin != 0;
  size_t at = 0;
  take(payload, at, plan.resets, h.resets);
  take(payload, at, plan.contexts, h.contexts);
  take(payload, at, plan.drafts, h.drafts);
  take(payload, at, plan.rows, h.rows);
}

}  // namespace dspark
