#include "lib/host/liveness.hpp"

#include <signal.h>
#include <time.h>

#include <cerrno>

#include "lib/host/protocol.hpp"

namespace dspark::host {

uint64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(ts.tv_nsec);
}

bool process_alive(int32_t pid) {
  return pid > 0 && (kill(pid, 0) == 0 || errno == EPERM);
}

std::optional<uint64_t> heartbeat_age_ns(uint64_t beat, uint64_t now) {
  if (beat > now) {
    if (beat - now > kHeartbeatFutureSlackNs) return std::nullopt;
    return 0;
  }
  return now - beat;
}

}  // namespace dspark::host
