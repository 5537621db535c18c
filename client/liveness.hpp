// Internal: is the worker behind an attach alive and able to answer? Checked while a client waits, so that a
// dead or stopped worker turns into DSPARK_UNAVAILABLE instead of a hang.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lib/host/protocol.hpp"

namespace dspark::client {

// A worker heartbeat older than this means the worker is hung or gone (its heartbeat thread runs whatever the
// steps do, every ~100 ms).
constexpr uint64_t kWorkerStaleNs = 3'000'000'000ull;
constexpr uint64_t kHostHeartbeatPeriodMs = 100;

const char* worker_state_name(uint32_t state);

// Why the worker cannot answer (its socket closed, heartbeat stale or ahead of this clock, state stopped or
// unhealthy), or nothing when it may. `pid` is the worker's (SO_PEERCRED).
std::optional<std::string> worker_problem(const host::WorkerHeader& h, int socket_fd, int32_t pid);

}  // namespace dspark::client
