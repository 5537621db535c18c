// Rank 0's counters of the host interface, shared by the server (which counts) and the door's thread (which
// answers observers): every access takes the lock. Each event also goes to the Prometheus metrics when they
// are on.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <utility>
#include <vector>

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

  // An acceptance report counted (AcceptanceBook), and an answered draft's Markov positions and cache hits.
  void acceptance_counted(int64_t accepted);
  void markov_looked_up(int64_t lookups, int64_t hits);
  // The hottest previous tokens without a cached row, most seen first (at most kHotUncachedTokens kept).
  void set_hot_uncached(const std::vector<std::pair<int32_t, uint64_t>>& hot);

  // The counters with the latency percentiles of the recent steps (hosts_refused is the door's).
  StatsResponse snapshot() const;
  // Version 6's part: acceptance and the cache.
  StatsMore snapshot_more() const;
  uint32_t failed_in_a_row() const;
  uint64_t steps() const;

 private:
  Metrics* const metrics_;
  mutable std::mutex mu_;
  StatsResponse s_{};
  StatsMore more_{};
  uint32_t failed_in_a_row_ = 0;
  std::deque<double> recent_us_;
};

}  // namespace dspark::host
