// A built-in host for the worker: a seeded simulated engine that feeds the step loop on rank 0 without the
// shared-memory ring (smoke runs, tp scaling experiments, tests). Each sequence gets a prefill, then every
// step drafts for all sequences, "verifies" with a seeded acceptance model and sends the accepted rows back.
// The inputs of every step depend on the seed only, never on the drafts, so runs at different tp sizes see
// identical requests and their drafts can be compared step by step.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "config/model_config.hpp"
#include "runtime/step_loop.hpp"

namespace dspark {

struct LocalDriverOptions {
  int64_t steps = 100;
  int64_t sequences = 4;      // slots in use (at most the worker's slots and max_batch)
  int64_t prefill_rows = 24;  // context rows inserted when a sequence starts
  double accept_prob = 0.7;  // each drafted token is accepted with this probability until the first rejection
  uint64_t seed = 0;
  std::filesystem::path drafts_out;  // JSON lines, one per step, when set
};

class LocalDriver final : public PlanSource {
 public:
  LocalDriver(const ModelConfig& cfg, const StepLimits& limits, const LocalDriverOptions& options);

  std::optional<StepPlan> next() override;
  void complete(const StepPlan& plan, const StepResult& result) override;

  int64_t steps_done() const { return done_; }
  int64_t failed_steps() const { return failed_; }
  // Step latencies (from next() returning to complete()), microseconds.
  const std::vector<double>& latencies_us() const { return latencies_; }

 private:
  struct Sequence {
    int32_t slot = 0;
    int64_t pos = 0;      // next context position = anchor position of the next draft
    int64_t pending = 0;  // rows to send before the next draft
    int32_t anchor = 0;
    bool fresh = true;
  };
  void append_rows(StepPlan& plan, const Sequence& s, int64_t first, int64_t n);

  ModelConfig cfg_;
  StepLimits limits_;
  LocalDriverOptions opt_;
  std::mt19937_64 rng_;
  std::vector<Sequence> seqs_;
  int64_t done_ = 0, failed_ = 0;
  std::ofstream out_;
  std::chrono::steady_clock::time_point started_;
  std::vector<double> latencies_;
};

}  // namespace dspark
