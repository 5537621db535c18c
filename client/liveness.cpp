#include "liveness.hpp"

#include <fmt/format.h>
#include <poll.h>

#include "lib/host/liveness.hpp"

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

std::optional<std::string> worker_problem(const host::WorkerHeader& h, int socket_fd, int32_t pid) {
  // The worker closes the socket when it ends the session, and the kernel when the worker's process ends.
  pollfd p{socket_fd, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) != 0)
    return fmt::format(
        "the worker (pid {}) closed this host's connection: the worker is gone, or it ended this host's "
        "session; attach again",
        pid);
  const uint32_t state = h.worker_state.load(std::memory_order_acquire);
  if (state == static_cast<uint32_t>(host::WorkerState::stopped) ||
      state == static_cast<uint32_t>(host::WorkerState::unhealthy))
    return fmt::format("the worker (pid {}) is {}", pid, worker_state_name(state));
  const uint64_t beat = h.worker_heartbeat_ns.load(std::memory_order_acquire);
  const std::optional<uint64_t> age = host::heartbeat_age_ns(beat, host::monotonic_ns());
  if (!age)
    return fmt::format("the worker (pid {}) stamped its heartbeat ahead of this machine's clock", pid);
  if (*age > kWorkerStaleNs)
    return fmt::format("the worker (pid {}) is not responding: its heartbeat is {} ms old", pid,
                       *age / 1'000'000);
  return std::nullopt;
}

}  // namespace dspark::client
