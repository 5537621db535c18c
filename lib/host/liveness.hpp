// The clock both sides stamp their heartbeats with, and the checks of a stamp read from the other side.
#pragma once

#include <cstdint>
#include <optional>

namespace dspark::host {

// CLOCK_MONOTONIC in nanoseconds: one clock for every process of the machine.
uint64_t monotonic_ns();

// Whether process `pid` exists (EPERM still means it does).
bool process_alive(int32_t pid);

// The age at `now` of a heartbeat stamped `beat` by the other side, or nullopt when the stamp is more than
// kHeartbeatFutureSlackNs ahead of `now`: a forged or broken stamp is never fresh. A stamp a little ahead
// (the other side stamped between the two clock reads) is 0 old.
std::optional<uint64_t> heartbeat_age_ns(uint64_t beat, uint64_t now);

}  // namespace dspark::host
