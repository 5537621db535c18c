#include "lib/serve/prometheus_metrics.hpp"

#include <prometheus/text_serializer.h>

#include "lib/serve/acceptance_book.hpp"

namespace dspark {
namespace {

using prometheus::Registry;

// Latency buckets for every histogram: 25 us doubling up to 13 s, from a GPU insert to a host's idle wait.
prometheus::Histogram::BucketBoundaries latency_buckets() {
  prometheus::Histogram::BucketBoundaries b;
  for (double s = 25e-6; b.size() < 20; s *= 2) b.push_back(s);
  return b;
}

prometheus::Counter& counter(Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(r).Add({});
}

prometheus::Histogram& histogram(Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(r).Add({}, latency_buckets());
}

prometheus::Family<prometheus::Gauge>& gauges(Registry& r, const std::string& name, const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(r);
}

}  // namespace

PrometheusMetrics::PrometheusMetrics(int64_t slots)
    : registry_(std::make_shared<Registry>()),
      steps_(prometheus::BuildCounter()
                 .Name("dspark_steps_total")
                 .Help("Steps the ranks executed, by answer status (OK, INTERNAL)")
                 .Register(*registry_)),
      drafts_(counter(*registry_, "dspark_drafts_total", "Draft requests answered in OK steps")),
      rows_(counter(*registry_, "dspark_context_rows_total", "Context rows inserted by OK steps")),
      resets_(counter(*registry_, "dspark_resets_total", "Slot resets asked by OK steps")),
      rejected_(counter(*registry_, "dspark_rejected_messages_total",
                        "Host messages refused before any rank saw them")),
      attached_(counter(*registry_, "dspark_hosts_attached_total", "Hosts that attached")),
      lost_(counter(*registry_, "dspark_hosts_lost_total", "Hosts released as lost (gone, silent, corrupt)")),
      unmatched_(counter(*registry_, "dspark_acceptance_reports_unmatched_total",
                         "Acceptance reports for a slot without an answered draft, or above its k'")),
      markov_lookups_(
          counter(*registry_, "dspark_markov_cache_lookups_total",
                  "Markov positions drafted (rank 0): each looks its previous token up in the bias "
                  "cache")),
      markov_hits_(counter(*registry_, "dspark_markov_cache_hits_total",
                           "Markov positions whose previous token had a cached bias row (over lookups: the "
                           "hit rate)")),
      reports_(
          prometheus::BuildCounter()
              .Name("dspark_acceptance_reports_total")
              .Help("Acceptance reports counted, by the k' and temperature class of the draft reported on")
              .Register(*registry_)),
      accepted_tokens_(prometheus::BuildCounter()
                           .Name("dspark_accepted_tokens_total")
                           .Help("Draft tokens the target accepted, by k' and temperature class (over "
                                 "reports: the mean accepted "
                                 "length)")
                           .Register(*registry_)),
      reached_(
          prometheus::BuildCounter()
              .Name("dspark_draft_position_reached_total")
              .Help("Reported drafts whose tokens before this position were all accepted, by k', temperature "
                    "class and position")
              .Register(*registry_)),
      accepted_at_(
          prometheus::BuildCounter()
              .Name("dspark_draft_position_accepted_total")
              .Help("Reported drafts whose token at this position was accepted, by k', temperature class and "
                    "position "
                    "(over reached: acceptance by position)")
              .Register(*registry_)),
      step_(histogram(*registry_, "dspark_step_duration_seconds",
                      "Rank 0: a step message taken to its answer")),
      insert_(histogram(*registry_, "dspark_insert_duration_seconds", "Rank 0: one slot's context insert")),
      draft_(histogram(*registry_, "dspark_draft_duration_seconds", "Rank 0: one draft batch")),
      ring_wait_(histogram(*registry_, "dspark_ring_wait_seconds",
                           "Rank 0: waiting for the attached host's next step message")),
      slots_in_use_(
          gauges(*registry_, "dspark_slots_in_use", "Slots holding the attached host's context").Add({})),
      load_seconds_(gauges(*registry_, "dspark_rank_load_seconds", "Weight load time of each rank")),
      read_bytes_(gauges(*registry_, "dspark_rank_load_read_bytes", "Checkpoint bytes each rank read")),
      weight_bytes_(gauges(*registry_, "dspark_rank_weight_bytes", "Weight bytes each rank holds")),
      resident_bytes_(
          gauges(*registry_, "dspark_rank_peak_resident_bytes", "Peak resident host memory of each rank")),
      device_bytes_(gauges(*registry_, "dspark_rank_device_memory_used_bytes",
                           "Memory in use on each rank's GPU at the end of start-up (the whole device's)")) {
  gauges(*registry_, "dspark_slots", "Slots the worker holds (the slots key)")
      .Add({})
      .Set(static_cast<double>(slots));
  for (const char* s : {"OK", "INTERNAL"}) steps_.Add({{"status", s}});  // both series exist from the start
}

void PrometheusMetrics::acceptance_reported(int64_t k_prime, int temperature_class, int64_t accepted) {
  const std::string k = std::to_string(k_prime), tau = temperature_class_name(temperature_class);
  reports_.Add({{"k", k}, {"temperature", tau}}).Increment();
  accepted_tokens_.Add({{"k", k}, {"temperature", tau}}).Increment(static_cast<double>(accepted));
  for (int64_t j = 0; j < k_prime && j <= accepted; ++j) {
    const prometheus::Labels at{{"k", k}, {"temperature", tau}, {"position", std::to_string(j)}};
    reached_.Add(at).Increment();
    if (j < accepted) accepted_at_.Add(at).Increment();
  }
}

PrometheusMetrics::~PrometheusMetrics() = default;

void PrometheusMetrics::serve(const std::string& bind, int64_t port) {
  http_ = std::make_unique<MetricsHttp>(bind, static_cast<int>(port), [this] {
    return prometheus::TextSerializer().Serialize(registry_->Collect());
  });
}

void PrometheusMetrics::step_answered(Status s, double seconds, uint64_t drafts, uint64_t resets,
                                      uint64_t context_rows) {
  steps_.Add({{"status", std::string(status_name(s))}}).Increment();
  step_.Observe(seconds);
  if (s != Status::ok) return;
  drafts_.Increment(static_cast<double>(drafts));
  resets_.Increment(static_cast<double>(resets));
  rows_.Increment(static_cast<double>(context_rows));
}

void PrometheusMetrics::set_rank_loads(std::span<const RankLoad> ranks) {
  for (size_t r = 0; r < ranks.size(); ++r) {
    const prometheus::Labels rank{{"rank", std::to_string(r)}};
    load_seconds_.Add(rank).Set(ranks[r].load_seconds);
    read_bytes_.Add(rank).Set(static_cast<double>(ranks[r].read_bytes));
    weight_bytes_.Add(rank).Set(static_cast<double>(ranks[r].weight_bytes));
    resident_bytes_.Add(rank).Set(static_cast<double>(ranks[r].peak_resident_bytes));
    // Only ranks with a device: a CPU rank's memory is all in its resident set.
    if (ranks[r].device_memory_used > 0)
      device_bytes_.Add(rank).Set(static_cast<double>(ranks[r].device_memory_used));
  }
}

}  // namespace dspark
