#include "lib/runtime/step_loop.hpp"

#include <spdlog/spdlog.h>

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <thread>

#include "lib/runtime/plan_broadcast.hpp"
#include "lib/runtime/step_watchdog.hpp"

namespace dspark {

namespace {

std::vector<int32_t> touched_slots(const StepPlan& plan) {
  std::vector<int32_t> touched;
  for (const ContextBlock& c : plan.contexts) touched.push_back(c.slot);
  for (const DraftRequest& r : plan.drafts) touched.push_back(r.slot);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  return touched;
}

// Every rank learns of a failure anywhere, so every rank resets the same slots and stays in step.
bool agree_on_failure(DraftEngine& drafter, Communicator& comm, const StepPlan& plan,
                      const std::string& error, StepResult& result) {
  if (!comm.any(!error.empty())) return false;
  for (int32_t s : touched_slots(plan)) drafter.reset(s);
  result.status = {Status::internal, error.empty() ? "the step failed on another rank" : error};
  result.draft = {};
  return true;
}

// Where a draft's answer is not finite ("" when it is): NaN or Inf in the weights or in a slot's context,
// which must not leave the worker as an answer.
std::string non_finite_answer(const DraftResult& r) {
  for (size_t i = 0; i < r.conf.size(); ++i) {
    const bool finite = std::isfinite(r.conf[i]) && std::isfinite(r.conf_logit[i]) &&
                        (r.margin.empty() || std::isfinite(r.margin[i])) &&
                        (r.q.empty() || std::isfinite(r.q[i]));
    if (!finite)
      return fmt::format(
          "request {} position {}: the draft is not finite (NaN or Inf in the weights or the slot's "
          "context); "
          "the step's slots are reset",
          static_cast<int64_t>(i) / r.k, static_cast<int64_t>(i) % r.k);
  }
  for (size_t i = 0; i < r.distribution.size(); ++i)
    if (!std::isfinite(r.distribution[i])) {
      const size_t row = i / (r.distribution.size() / std::max<size_t>(1, r.distribution_rows.size()));
      const int32_t t = row < r.distribution_rows.size() ? r.distribution_rows[row] : 0;
      return fmt::format(
          "request {} position {}: the draft distribution is not finite; the step's slots are reset",
          t / std::max<int64_t>(1, r.k), t % std::max<int64_t>(1, r.k));
    }
  return {};
}

}  // namespace

StepResult execute_step(DraftEngine& drafter, Communicator& comm, const StepPlan& plan,
                        const std::function<void(const StepResult&)>& answer_now) {
  StepResult result;
  // Phase 1 has no collectives: the checks, the resets, and a step's context inserts when it drafts nothing
  // (rank-local). A failure on one rank is agreed on before any rank enters the draft's collectives.
  std::string error;
  try {
    if (plan.max_model_len > 0) drafter.set_max_model_len(plan.max_model_len);
    for (int32_t s : plan.resets) drafter.reset(s);
    drafter.validate_inserts(plan.contexts);
    if (!plan.drafts.empty())
      drafter.validate(plan.drafts);
    else if (!plan.contexts.empty())
      drafter.insert_blocks(plan.contexts, plan.rows.data());
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (agree_on_failure(drafter, comm, plan, error, result) || plan.drafts.empty()) return result;
  // Phase 2, the inserts and the draft (one recording where the drafter has one), runs collectives: a rank
  // failing inside it cannot tell how far its peers got, so with more than one rank the failure is fatal
  // (the launcher restarts the worker). Both were checked in phase 1. The exception is a peer exchange that
  // gave up waiting for a rank: its kernels ran to the end on every rank, so the ranks agree on it (a late
  // rank's own answer is not to be trusted) and start the exchanges over.
  std::string late;
  try {
    result.draft = drafter.insert_and_draft(plan.contexts, plan.rows.data(), plan.drafts, plan.margin);
  } catch (const ExchangeTimeout& e) {
    if (!comm.exchanges_may_time_out()) throw;  // its peers will not agree on it: fatal as any other
    late = e.what();
    if (answer_now) answer_now({{Status::internal, late}, {}});
  } catch (const std::exception& e) {
    if (comm.size() > 1) throw;
    agree_on_failure(drafter, comm, plan, e.what(), result);
    return result;
  }
  // The agreement costs a collective per step: only where an exchange can have given up.
  if (comm.size() > 1 && comm.exchanges_may_time_out() &&
      agree_on_failure(drafter, comm, plan, late, result)) {
    comm.reset_exchanges();
    return result;
  }
  // The answer is replicated: every rank finds the same non-finite value and resets the same slots.
  if (const std::string bad = non_finite_answer(result.draft); !bad.empty()) {
    for (int32_t s : touched_slots(plan)) drafter.reset(s);
    result.status = {Status::internal, bad};
    result.draft = {};
  }
  return result;
}

namespace {

// The watchdog of a loop with a step bound: its expiry reports the step, lets rank 0 tell its hosts, and ends
// the process without unwinding (the main thread is blocked inside a collective that will not return).
std::unique_ptr<StepWatchdog> make_watchdog(const Communicator& comm, const LoopOptions& options) {
  if (options.step_timeout.count() <= 0) return nullptr;
  const int rank = comm.rank();
  return std::make_unique<StepWatchdog>(options.step_timeout, [rank, options](uint64_t step,
                                                                              std::chrono::milliseconds ran) {
    spdlog::critical(
        "rank {}: step {} has run {} ms, past health.step_timeout_ms ({} ms): a rank or its device stopped "
        "answering; the worker exits with status {} for its supervisor to restart it",
        rank, step, ran.count(), options.step_timeout.count(), kExitStepTimeout);
    if (options.on_step_timeout) options.on_step_timeout();
    spdlog::default_logger()->flush();
    std::this_thread::sleep_for(options.exit_grace);
    std::_Exit(kExitStepTimeout);
  });
}

}  // namespace

int run_step_loop(DraftEngine& drafter, Communicator& comm, PlanSource* source, const StepLimits& limits,
                  const LoopOptions& options) {
  const int64_t row_dim = drafter.row_dim();
  StepLimits current = limits;
  int64_t failed_in_a_row = 0;
  const std::unique_ptr<StepWatchdog> watchdog = make_watchdog(comm, options);
  for (;;) {
    StepPlan plan;
    if (comm.rank() == 0) {
      std::optional<StepPlan> next = source->next();
      if (!next) {
        plan.shutdown = true;
      } else {
        plan = std::move(*next);
        const StatusOr check = check_plan(plan, current);
        if (!check.ok()) {  // rejected whole before any rank sees it
          source->complete(plan, {check, {}});
          continue;
        }
      }
    }
    // Rank 0 times the step from its broadcast (a stopped peer may block it); the others from the plan's
    // arrival (before it they are idle, not late).
    if (watchdog && comm.rank() == 0 && !plan.shutdown) watchdog->arm(plan.id);
    broadcast_plan(comm, plan, row_dim);
    if (plan.shutdown) return 0;
    if (watchdog && comm.rank() != 0) watchdog->arm(plan.id);
    bool answered = false;
    const auto answer_now = [&](const StepResult& r) {
      source->complete(plan, r);
      answered = true;
    };
    const StepResult result = execute_step(
        drafter, comm, plan, comm.rank() == 0 ? answer_now : std::function<void(const StepResult&)>{});
    if (watchdog) watchdog->disarm();
    if (plan.max_model_len > 0 && result.status.ok()) current.max_model_len = plan.max_model_len;
    if (comm.rank() == 0 && !answered) source->complete(plan, result);
    if (result.status.ok()) {
      failed_in_a_row = 0;
      continue;
    }
    spdlog::error("step {} failed: {}", plan.id, result.status.message);
    if (++failed_in_a_row >= options.max_failed_steps) {
      spdlog::critical("{} steps failed in a row: the worker is unhealthy and exits", failed_in_a_row);
      return 1;
    }
  }
}

}  // namespace dspark
