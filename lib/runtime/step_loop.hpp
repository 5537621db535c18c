// The SPMD step loop (SPEC §6). Rank 0 takes each step from a PlanSource (the host ring, or a built-in
// driver), validates it, broadcasts it; every rank executes it; rank 0 hands the answer back to the source. A
// step that fails on any rank fails on all: its slots are reset everywhere and it answers INTERNAL. Too many
// failed steps in a row make the worker unhealthy and the loop returns non-zero on every rank.
#pragma once

#include <chrono>
#include <functional>
#include <optional>

#include "comm/communicator.hpp"
#include "lib/api/step_plan.hpp"
#include "lib/model/draft_engine.hpp"

namespace dspark {

struct StepResult {
  StatusOr status;
  DraftResult draft;  // when the plan had draft requests and the step succeeded
};

// Where rank 0's steps come from and where their answers go.
class PlanSource {
 public:
  virtual ~PlanSource() = default;
  // Blocks until the next step; nullopt to shut the worker down.
  virtual std::optional<StepPlan> next() = 0;
  // The answer of a plan: executed (ok / internal) or rejected before the broadcast (invalid / exhausted).
  virtual void complete(const StepPlan& plan, const StepResult& result) = 0;
};

// Executes one plan on this rank; collective (every rank calls it with the same plan). A step whose peer
// exchange gave up on a late rank (ExchangeTimeout) fails on every rank once the late one arrives: the
// step's slots and the communicator's exchanges are reset and the worker serves on. The rank that saw the
// timeout hands its INTERNAL answer to `answer_now` (when set) first, so that its host is not kept waiting
// for that rank.
StepResult execute_step(DraftEngine& drafter, Communicator& comm, const StepPlan& plan,
                        const std::function<void(const StepResult&)>& answer_now = {});

struct LoopOptions {
  int64_t max_failed_steps = 3;
  // A step running longer than this on a rank (from rank 0's broadcast of its plan, or another rank's receipt
  // of it, to its end) ends the process with kExitStepTimeout (step_watchdog.hpp); 0: no bound.
  std::chrono::milliseconds step_timeout{0};
  // Run on the watchdog's thread before that exit (rank 0: mark the worker unhealthy for its hosts).
  std::function<void()> on_step_timeout;
  // How long the process lingers after on_step_timeout, so that waiting hosts read the state.
  std::chrono::milliseconds exit_grace{500};
};

// The exit status of a worker whose step outlived health.step_timeout_ms.
constexpr int kExitStepTimeout = 2;

// Runs until the source says stop (rank 0 broadcasts a shutdown plan). `source` is used on rank 0 only.
// Returns 0 after a clean shutdown, 1 when the worker became unhealthy; a step past options.step_timeout
// exits the process (kExitStepTimeout) from the watchdog's thread.
int run_step_loop(DraftEngine& drafter, Communicator& comm, PlanSource* source, const StepLimits& limits,
                  const LoopOptions& options);

}  // namespace dspark
