// Metrics on prometheus-cpp: one registry of every dspark_* metric (docs/operations.md lists them), served in
// its text format at /metrics (MetricsHttp). The metrics are atomic: the host server counts while scrapes
// read.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <memory>
#include <string>

#include "lib/serve/metrics.hpp"
#include "lib/serve/metrics_http.hpp"

namespace dspark {

class PrometheusMetrics final : public Metrics {
 public:
  // Registers every metric (`slots` is the configured number); nothing listens until serve().
  explicit PrometheusMetrics(int64_t slots);
  ~PrometheusMetrics() override;

  // Serves the registry at http://bind:port/metrics; throws dspark::Error naming the address when it cannot
  // listen there.
  void serve(const std::string& bind, int64_t port);
  const prometheus::Registry& registry() const { return *registry_; }

  void step_answered(Status s, double seconds, uint64_t drafts, uint64_t resets,
                     uint64_t context_rows) override;
  void message_rejected() override { rejected_.Increment(); }
  void host_attached() override { attached_.Increment(); }
  void host_lost() override { lost_.Increment(); }
  void ring_waited(double seconds) override { ring_wait_.Observe(seconds); }
  void inserted(double seconds) override { insert_.Observe(seconds); }
  void drafted(double seconds) override { draft_.Observe(seconds); }
  void set_slots_in_use(int64_t n) override { slots_in_use_.Set(static_cast<double>(n)); }
  void set_rank_loads(std::span<const RankLoad> ranks) override;
  void acceptance_reported(int64_t k_prime, int temperature_class, int64_t accepted) override;
  void acceptance_unmatched(int64_t reports) override { unmatched_.Increment(static_cast<double>(reports)); }
  void markov_cache_looked_up(int64_t lookups, int64_t hits) override {
    markov_lookups_.Increment(static_cast<double>(lookups));
    markov_hits_.Increment(static_cast<double>(hits));
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  prometheus::Family<prometheus::Counter>& steps_;
  prometheus::Counter &drafts_, &rows_, &resets_, &rejected_, &attached_, &lost_, &unmatched_,
      &markov_lookups_, &markov_hits_;
  prometheus::Family<prometheus::Counter>&reports_, &accepted_tokens_, &reached_, &accepted_at_;
  prometheus::Histogram &step_, &insert_, &draft_, &ring_wait_;
  prometheus::Gauge& slots_in_use_;
  prometheus::Family<prometheus::Gauge>&load_seconds_, &read_bytes_, &weight_bytes_, &resident_bytes_,
      &device_bytes_;
  std::unique_ptr<MetricsHttp> http_;
};

}  // namespace dspark
