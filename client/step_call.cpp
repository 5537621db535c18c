#include "step_call.hpp"

#include <fmt/format.h>

#include <cstring>

#include "lib/api/step_plan.hpp"

namespace dspark::client {
namespace {

// The worker's request: a report's count, or -1 (no report); greedy without sampling fields.
DraftRequest to_request(const dspark_draft_request& q, const dspark_sampling* s) {
  DraftRequest r{q.slot, q.token, q.pos, q.low, q.outputs, q.has_accepted != 0 ? q.accepted : -1};
  if (s != nullptr) {
    r.temperature = s->temperature;
    r.distribution = (s->flags & DSPARK_SAMPLE_DISTRIBUTION) != 0;
    r.seed = s->seed;
  }
  return r;
}

Outcome check_pointers(const StepArgs& a) {
  if (!a.resets.empty() && a.resets.data() == nullptr)
    return failed(DSPARK_INVALID_ARGUMENT, "resets is NULL");
  if (!a.contexts.empty() && a.contexts.data() == nullptr)
    return failed(DSPARK_INVALID_ARGUMENT, "contexts is NULL");
  if (!a.drafts.empty() && a.drafts.data() == nullptr)
    return failed(DSPARK_INVALID_ARGUMENT, "draft requests is NULL");
  for (size_t i = 0; i < a.contexts.size(); ++i) {
    const dspark_context_block& c = a.contexts[i];
    // The wire has no empty contexts (at least 1 row each, as the worker checks).
    if (c.rows < 1) return failed(DSPARK_INVALID_ARGUMENT, fmt::format("context {}: {} rows", i, c.rows));
    if (c.data == nullptr)
      return failed(DSPARK_INVALID_ARGUMENT, fmt::format("context {}: {} rows but data is NULL", i, c.rows));
  }
  if (a.sampling != nullptr)
    for (size_t i = 0; i < a.drafts.size(); ++i)
      if ((a.sampling[i].flags & ~static_cast<uint32_t>(DSPARK_SAMPLE_DISTRIBUTION)) != 0)
        return failed(DSPARK_INVALID_ARGUMENT,
                      fmt::format("draft request {}: unknown sampling flags 0x{:x}", i, a.sampling[i].flags));
  // -1 is the wire's "no report": a report of a negative count must not pass as none.
  for (size_t i = 0; i < a.drafts.size(); ++i)
    if (a.drafts[i].has_accepted != 0 && a.drafts[i].accepted < 0)
      return failed(DSPARK_INVALID_ARGUMENT,
                    fmt::format("draft request {}: accepted {} (a report counts 0 to k' tokens)", i,
                                a.drafts[i].accepted));
  return {};
}

// Builds message `m` of the step into r (keeping r's buffers). The rows stay in the caller's buffers: the
// encoder copies them into the ring, the one copy they take on this side.
void build_message(const StepArgs& a, const MessagePlan& m, uint32_t row_bytes, host::Request& r) {
  r.type = host::MessageType::step;
  StepPlan& p = r.step;
  p.resets.clear();
  p.contexts.clear();
  p.rows.clear();
  p.drafts.clear();
  r.row_parts.clear();
  p.margin = a.margins;
  p.max_model_len = 0;
  if (m.resets) p.resets.assign(a.resets.begin(), a.resets.end());
  for (const Piece& pc : m.pieces) {
    const dspark_context_block& c = a.contexts[pc.ctx];
    p.contexts.push_back({c.slot, c.first_pos + pc.offset, pc.rows});
    const size_t bytes = static_cast<size_t>(pc.rows) * row_bytes;
    r.row_parts.emplace_back(static_cast<const uint8_t*>(c.data) + static_cast<size_t>(pc.offset) * row_bytes,
                             bytes);
  }
  if (m.drafts)
    for (size_t i = 0; i < a.drafts.size(); ++i)
      p.drafts.push_back(to_request(a.drafts[i], a.sampling != nullptr ? &a.sampling[i] : nullptr));
}

template <typename T>
void copy_out(T* dst, const std::vector<T>& src) {
  if (dst != nullptr && !src.empty()) std::memcpy(dst, src.data(), src.size() * sizeof(T));
}

}  // namespace

// The sampling fields of every request, before anything is sent: the output's room for distributions
// depends on them, and a refused one must not cost a round trip.
Outcome check_sampling(const StepArgs& a, const host::SamplingLimits& limits) {
  if (a.sampling == nullptr) return {};
  uint32_t asked = 0;
  for (size_t i = 0; i < a.drafts.size(); ++i) {
    const DraftRequest r = to_request(a.drafts[i], &a.sampling[i]);
    if (const std::string why = sampling_problem(r); !why.empty())
      return failed(DSPARK_INVALID_ARGUMENT, fmt::format("draft request {}: {}", i, why));
    asked += r.distribution ? 1 : 0;
  }
  if (asked > limits.max_distributions)
    return failed(DSPARK_RESOURCE_EXHAUSTED,
                  fmt::format("{} requests ask for the whole distribution, over max_distributions {}", asked,
                              limits.max_distributions));
  return {};
}

Outcome run_step(Connection& c, const StepArgs& a, const Deadline& d, StepScratch& s) {
  if (Outcome o = check_pointers(a); !o.ok()) return o;
  if (Outcome o = check_sampling(a, c.sampling()); !o.ok()) return o;
  const host::ModelDescription& m = c.model();
  if (a.drafts.size() > m.max_batch)
    return failed(DSPARK_RESOURCE_EXHAUSTED,
                  fmt::format("batch of {} over max_batch {}", a.drafts.size(), m.max_batch));
  const SplitLimits lim{c.max_request_bytes(), m.max_context_rows, m.row_bytes, host::kMaxStepCount};
  if (Outcome o = split_step(a.resets.size(), a.contexts, a.drafts.size(), lim, s.plans); !o.ok()) return o;
  const size_t n_msgs = s.plans.size();
  if (n_msgs > 1) {
    // Parts applied by the worker cannot be taken back: check the whole step first, as the worker would.
    StepPlan whole;
    whole.resets.assign(a.resets.begin(), a.resets.end());
    for (const dspark_context_block& x : a.contexts) whole.contexts.push_back({x.slot, x.first_pos, x.rows});
    for (size_t i = 0; i < a.drafts.size(); ++i)
      whole.drafts.push_back(to_request(a.drafts[i], a.sampling != nullptr ? &a.sampling[i] : nullptr));
    const StepLimits limits{m.slots,           m.max_batch,     m.max_context_rows,
                            c.max_model_len(), m.max_model_len, m.vocab_size,
                            m.block_size,      m.row_bytes / 2, c.sampling().max_distributions};
    if (const StatusOr st = check_plan(whole, limits, PlanCheck::fields); !st.ok())
      return failed(to_c_status(st.status), st.message);
  }
  for (size_t i = 0; i < n_msgs; ++i) {
    build_message(a, s.plans[i], m.row_bytes, s.req);
    Outcome o = c.call(s.req, d, s.resp);
    if (!o.ok()) {
      if (n_msgs > 1) o.message = fmt::format("step message {} of {}: {}", i + 1, n_msgs, o.message);
      return o;
    }
  }
  if (a.drafts.empty()) return {};
  const DraftResult& r = s.resp.draft;
  const auto n = static_cast<int64_t>(a.drafts.size());
  const auto nk = static_cast<size_t>(n) * m.block_size;
  if (r.batch != n || r.k != m.block_size || r.ids.size() != nk || r.conf.size() != nk ||
      r.conf_logit.size() != nk || r.margin.size() != nk)
    return failed(DSPARK_INTERNAL, fmt::format("the worker answered {} requests with a [{}, {}] draft batch",
                                               n, r.batch, r.k));
  copy_out(a.out.ids, r.ids);
  copy_out(a.out.conf, r.conf);
  copy_out(a.out.conf_logit, r.conf_logit);
  copy_out(a.out.margin, r.margin);
  const dspark_sampled_output& so = a.sampled;
  if (r.q.size() != nk)
    return failed(DSPARK_INTERNAL,
                  fmt::format("the worker answered {} drafted tokens' q for {}", r.q.size(), nk));
  copy_out(so.q, r.q);
  const size_t rows = r.distribution_rows.size();
  if (so.distributions != nullptr) *so.distributions = static_cast<uint32_t>(rows);
  if (rows > 0 && (so.distribution == nullptr || rows > so.distribution_capacity))
    return failed(DSPARK_INVALID_ARGUMENT,
                  fmt::format("the answer holds {} distribution rows; the output has room for {}", rows,
                              so.distribution == nullptr ? 0 : so.distribution_capacity));
  copy_out(so.distribution, r.distribution);
  copy_out(so.distribution_rows, r.distribution_rows);
  return {};
}

}  // namespace dspark::client
