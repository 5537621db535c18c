// The worker's built-in host: the seeded EngineSim feeding the step loop on rank 0 without the shared-memory
// ring (smoke runs, tp scaling experiments, tests). Every step's drafts can be written as JSON lines.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <vector>

#include "lib/runtime/engine_sim.hpp"
#include "lib/runtime/step_loop.hpp"

namespace dspark {

struct LocalDriverOptions {
  int64_t steps = 100;
  EngineSimOptions engine;
  std::filesystem::path drafts_out;  // JSON lines, one per step, when set
};

class LocalDriver final : public PlanSource {
 public:
  LocalDriver(const EngineShape& shape, const LocalDriverOptions& options);

  std::optional<StepPlan> next() override;
  void complete(const StepPlan& plan, const StepResult& result) override;

  int64_t steps_done() const { return done_; }
  int64_t failed_steps() const { return failed_; }
  // Step latencies (from next() returning to complete()), microseconds.
  const std::vector<double>& latencies_us() const { return latencies_; }

 private:
  EngineSim engine_;
  LocalDriverOptions opt_;
  int64_t k_;
  int64_t done_ = 0, failed_ = 0;
  std::ofstream out_;
  std::chrono::steady_clock::time_point started_;
  std::vector<double> latencies_;
};

}  // namespace dspark
