// A bound on how long one step may run on this rank (health.step_timeout_ms). A step that waits on a rank
// that stopped answering blocks inside a collective, and neither MPI (no cancel for a blocking collective)
// nor NCCL and the peer exchanges (an aborted communicator is unusable) let the worker carry on without it,
// so the one safe end is the process's: the watchdog's own thread reports the step and the caller exits
// (run_step_loop: rank 0 marks the worker unhealthy first, so waiting hosts see UNAVAILABLE; mpirun then ends
// the other ranks and the supervisor restarts the job).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>

namespace dspark {

class StepWatchdog {
 public:
  // Called once, on the watchdog's thread, with the step's id and how long it had run, when a step stays
  // armed past `timeout` (then the watchdog stops watching).
  using Expired = std::function<void(uint64_t step_id, std::chrono::milliseconds ran)>;
  StepWatchdog(std::chrono::milliseconds timeout, Expired on_expired);
  ~StepWatchdog();
  StepWatchdog(const StepWatchdog&) = delete;
  StepWatchdog& operator=(const StepWatchdog&) = delete;

  // Step `step_id` begins / ended on this rank.
  void arm(uint64_t step_id);
  void disarm();

 private:
  void watch();

  const std::chrono::milliseconds timeout_;
  const Expired on_expired_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool armed_ = false, quit_ = false, fired_ = false;
  uint64_t step_ = 0;
  std::chrono::steady_clock::time_point started_;
  std::thread thread_;
};

}  // namespace dspark
