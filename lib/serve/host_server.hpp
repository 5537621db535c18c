// Rank 0's side of the host interface: a PlanSource over the shared-memory segment. Steps, resets, context
// rows and set_max_model_len become step plans of the SPMD loop; attach, stats and health are answered here.
// It keeps the worker's liveness in the header (a heartbeat thread), watches the host's, resets a lost host's
// slots, and ends the loop after a stop request (SIGTERM), once the step in flight has been answered.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "lib/host/codec.hpp"
#include "lib/host/protocol.hpp"
#include "lib/host/ring.hpp"
#include "lib/host/segment.hpp"
#include "lib/runtime/step_loop.hpp"

namespace dspark::host {

struct ServerOptions {
  std::string name;  // POSIX shm name
  uint32_t mode = 0600;
  std::chrono::milliseconds host_timeout{5000};
};

class HostServer final : public PlanSource {
 public:
  // Creates the segment (state starting). `stop` is polled between steps (set by the SIGTERM handler).
  HostServer(const ServerOptions& options, const ModelDescription& model, const std::atomic<bool>& stop);
  ~HostServer() override;  // state stopped; the segment is removed

  // The weight formats the worker loaded, for the model description (before set_serving: attach answers and
  // the segment header then carry them).
  void set_weight_formats(uint32_t weight_formats, uint32_t head_format);
  // The worker has loaded its weights: hosts may attach.
  void set_serving();
  // The loop ended unhealthy: hosts see it before the worker exits.
  void set_unhealthy();

  std::optional<StepPlan> next() override;
  void complete(const StepPlan& plan, const StepResult& result) override;

 private:
  struct InFlight {
    uint64_t request_id = 0;
    MessageType type = MessageType::step;
    bool answer = true;  // false for the worker's own plans (a lost host's resets)
    std::chrono::steady_clock::time_point started;
  };
  // One message from the ring: a plan to run, or nullopt when it was handled here (or there was none).
  std::optional<StepPlan> take_message();
  void answer(const Response& r);
  void answer_status(MessageType type, uint64_t id, Status s, std::string message);
  // A detached or lost host: empty the rings, release host_pid; returns the plan resetting its slots.
  StepPlan release_host(const char* why);
  bool host_lost() const;
  void heartbeat_loop();

  ServerOptions opt_;
  ModelDescription model_;
  const std::atomic<bool>& stop_;
  Segment segment_;
  RingReader requests_;
  RingWriter responses_;
  std::vector<uint8_t> message_;  // private copy of the message being decoded
  std::vector<uint8_t> encoded_;
  bool attached_ = false;
  bool host_unresponsive_ = false;  // an answer could not be written in time
  std::vector<bool> touched_;       // slots the current host has written
  InFlight in_flight_;
  uint64_t next_plan_id_ = 0;
  uint32_t failed_in_a_row_ = 0;
  StatsResponse stats_{};
  std::deque<double> recent_us_;
  std::atomic<bool> quit_{false};
  std::thread heartbeat_;
};

}  // namespace dspark::host
