// Rank 0's operational metrics, served in the Prometheus text format (metrics.port; docs/operations.md,
// "Metrics"): the events the host server, the timed engine and the start-up report. An interface because the
// implementation needs prometheus-cpp, which a build may lack: there start_metrics refuses metrics.port.
#pragma once

#include <cstdint>
#include <memory>
#include <span>

#include "lib/api/status.hpp"
#include "lib/config/worker_config.hpp"
#include "lib/serve/rank_load.hpp"

namespace dspark {

class Metrics {
 public:
  virtual ~Metrics() = default;
  // A step the ranks executed, answered `s` (OK or INTERNAL) `seconds` after its message was taken.
  virtual void step_answered(Status s, double seconds, uint64_t drafts, uint64_t resets,
                             uint64_t context_rows) = 0;
  // A message refused before any rank saw it (undecodable, INVALID_ARGUMENT, RESOURCE_EXHAUSTED).
  virtual void message_rejected() = 0;
  virtual void host_attached() = 0;
  virtual void host_lost() = 0;
  // How long rank 0 waited for the host's next step message.
  virtual void ring_waited(double seconds) = 0;
  // A step's context inserts run alone, and a draft batch (with the step's inserts when it has both), as rank
  // 0's drafter ran them.
  virtual void inserted(double seconds) = 0;
  virtual void drafted(double seconds) = 0;
  // Slots holding the attached host's context.
  virtual void set_slots_in_use(int64_t n) = 0;
  // Every rank's start-up, in rank order.
  virtual void set_rank_loads(std::span<const RankLoad> ranks) = 0;
  // A host's report on a draft of k' tokens (AcceptanceBook): `accepted` of them were taken.
  virtual void acceptance_reported(int64_t k_prime, int temperature_class, int64_t accepted) = 0;
  // Reports that matched no answered draft of their slot (none, or fewer tokens than reported).
  virtual void acceptance_unmatched(int64_t reports) = 0;
  // A draft batch's Markov positions (each a look-up of its previous token in the bias cache) and its hits.
  virtual void markov_cache_looked_up(int64_t lookups, int64_t hits) = 0;
};

// Whether this build serves metrics (it was built with prometheus-cpp).
bool metrics_built();

// Rank 0's endpoint, listening on metrics.bind:metrics.port; nullptr when metrics.port is 0. Throws
// dspark::Error when the address cannot be listened on, or when this build has no metrics.
std::unique_ptr<Metrics> start_metrics(const WorkerConfig::Metrics& cfg, int64_t slots);

}  // namespace dspark
