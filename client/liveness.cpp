#include "liveness.hpp"

#include <fmt/format.h>

#include "lib/host/segment.hpp"

namespace dspark::client {

const char* worker_state_name(uint32_t state) {
  switch (static_cast<host::WorkerState>(state)) {
    case host::WorkerState::starting:
      return "starting";
    case host::WorkerState::serving:
      return "serving";
    case host::WorkerState::draining:
      return "draining";
    case host::WorkerState::unhealthy:
      return "unhealthy";
    case host::WorkerState::stopped:
      return "stopped";
  }
  return "unknown";
}

uint64_t heartbeat_age_ns(uint64_t heartbeat_ns) {
  const uint64_t now = host::monotonic_ns();
  return now > heartbeat_ns ? now - heartbeat_ns : 0;
}

std::optional<std::string> worker_problem(const host::SegmentHeader& h) {
  const int32_t pid = h.worker_pid.load(std::memory_order_acquire);
  if (pid <= 0 || !host::process_alive(pid)) return fmt::format("the worker process (pid {}) is gone", pid);
  const uint32_t state = h.worker_state.load(std::memory_order_acquire);
  if (state == static_cast<uint32_t>(host::WorkerState::stopped) ||
      state == static_cast<uint32_t>(host::WorkerState::unhealthy))
    return fmt::format("the worker (pid {}) is {}", pid, worker_state_name(state));
  const uint64_t age = heartbeat_age_ns(h.worker_heartbeat_ns.load(std::memory_order_acquire));
  if (age > kWorkerStaleNs)
    return fmt::format("the worker (pid {}) is not responding: its heartbeat is {} ms old", pid,
                       age / 1'000'000);
  return std::nullopt;
}

}  // namespace dspark::client
