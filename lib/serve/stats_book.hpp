// Rank 0's counters of the host interface, shared by the server (which counts) and the door's thread (which
// answers observers): every access takes the lock. Each event also goes to the Prometheus metrics when they
// are on.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>

#include "lib/api/status.hpp"
#include "lib/host/protocol.hpp"
#include "lib/serve/metrics.hpp"

namespace dspark::host {

class StatsBook {
 public:
  explicit StatsBook(Metrics* metrics = nullptr) : metrics_(metrics) {}

  void rejected_message();
  void host_attached();
  void host_lost();
  // A step answered with `s` after `us` microseconds (INVALID_ARGUMENT and RESOURCE_EXHAUSTED count as
  // rejected messages, not steps).
  void step_answered(Status s, double us, uint64_t drafts, uint64_t resets, uint64_t context_rows);

  // The counters with the latency percentiles of the recent steps (hosts_refused is the door's).
  StatsResponse snapshot() const;
  uint32_t failed_in_a_row() const;
  uint64_t steps() const;

 private:
  Metrics* const metrics_;
  mutable std::mutex mu_;
  StatsResponse s_{};
  uint32_t failed_in_a_row_ = 0;
  std::deque<double> recent_us_;
};

}  // namespace dspark::host
