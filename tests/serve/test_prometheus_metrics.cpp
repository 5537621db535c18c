// PrometheusMetrics as its registry reads: every event moves its metric by exactly what happened (through
// StatsBook and TimedEngine, as the worker calls them), the rank series, the latency buckets, and a port that
// cannot be listened on.
#include "lib/serve/prometheus_metrics.hpp"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <optional>
#include <string>
#include <vector>

#include "lib/core/error.hpp"
#include "lib/serve/stats_book.hpp"
#include "lib/serve/timed_engine.hpp"

namespace dspark {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The sample of family `name` whose labels include `label` = `value` (any sample when label is empty).
std::optional<prometheus::ClientMetric> sample(const PrometheusMetrics& m, const std::string& name,
                                               const std::string& label = "", const std::string& value = "") {
  for (const prometheus::MetricFamily& f : m.registry().Collect()) {
    if (f.name != name) continue;
    for (const prometheus::ClientMetric& c : f.metric) {
      if (label.empty()) return c;
      for (const prometheus::ClientMetric::Label& l : c.label)
        if (l.name == label && l.value == value) return c;
    }
  }
  return std::nullopt;
}

double counter(const PrometheusMetrics& m, const std::string& name, const std::string& label = "",
               const std::string& value = "") {
  const auto c = sample(m, name, label, value);
  return c ? c->counter.value : -1;
}

double gauge(const PrometheusMetrics& m, const std::string& name, const std::string& label = "",
             const std::string& value = "") {
  const auto c = sample(m, name, label, value);
  return c ? c->gauge.value : -1;
}

uint64_t observations(const PrometheusMetrics& m, const std::string& name) {
  const auto c = sample(m, name);
  return c ? c->histogram.sample_count : 0;
}

TEST(PrometheusMetrics, StepsCountByStatusAndOnlyOkStepsCountTheirWork) {
  PrometheusMetrics m(8);
  host::StatsBook book(&m);
  EXPECT_EQ(counter(m, "dspark_steps_total", "status", "OK"), 0);
  EXPECT_EQ(counter(m, "dspark_steps_total", "status", "INTERNAL"), 0);
  book.step_answered(Status::ok, 1000, 3, 1, 24);
  book.step_answered(Status::ok, 3000, 2, 0, 5);
  book.step_answered(Status::internal, 500, 4, 2, 7);           // failed: its work did not happen
  book.step_answered(Status::invalid_argument, 10, 1, 1, 1);    // rejected before the ranks
  book.step_answered(Status::resource_exhausted, 10, 1, 1, 1);  // likewise
  book.rejected_message();                                      // undecodable
  EXPECT_EQ(counter(m, "dspark_steps_total", "status", "OK"), 2);
  EXPECT_EQ(counter(m, "dspark_steps_total", "status", "INTERNAL"), 1);
  EXPECT_EQ(counter(m, "dspark_drafts_total"), 5);
  EXPECT_EQ(counter(m, "dspark_resets_total"), 1);
  EXPECT_EQ(counter(m, "dspark_context_rows_total"), 29);
  EXPECT_EQ(counter(m, "dspark_rejected_messages_total"), 3);
  const auto step = sample(m, "dspark_step_duration_seconds");
  ASSERT_TRUE(step);
  EXPECT_EQ(step->histogram.sample_count, 3u);
  EXPECT_DOUBLE_EQ(step->histogram.sample_sum, 0.0045);  // microseconds in, seconds out
  // The book's own counters (dspark_client stats) agree.
  EXPECT_EQ(book.snapshot().steps, 3u);
  EXPECT_EQ(book.snapshot().rejected_messages, 3u);
}

TEST(PrometheusMetrics, HostsSlotsAndRingWait) {
  PrometheusMetrics m(8);
  host::StatsBook book(&m);
  book.host_attached();
  book.host_attached();
  book.host_lost();
  EXPECT_EQ(counter(m, "dspark_hosts_attached_total"), 2);
  EXPECT_EQ(counter(m, "dspark_hosts_lost_total"), 1);
  EXPECT_EQ(gauge(m, "dspark_slots"), 8);
  EXPECT_EQ(gauge(m, "dspark_slots_in_use"), 0);
  m.set_slots_in_use(5);
  EXPECT_EQ(gauge(m, "dspark_slots_in_use"), 5);
  m.ring_waited(0.25);
  m.ring_waited(0.5);
  const auto wait = sample(m, "dspark_ring_wait_seconds");
  ASSERT_TRUE(wait);
  EXPECT_EQ(wait->histogram.sample_count, 2u);
  EXPECT_DOUBLE_EQ(wait->histogram.sample_sum, 0.75);
}

TEST(PrometheusMetrics, LatencyBucketsDoubleFrom25Microseconds) {
  PrometheusMetrics m(1);
  m.drafted(30e-6);  // above 25 us, below 50 us
  m.drafted(20.0);   // above every bound: +Inf only
  const auto d = sample(m, "dspark_draft_duration_seconds");
  ASSERT_TRUE(d);
  ASSERT_EQ(d->histogram.bucket.size(), 21u);  // 20 bounds and +Inf
  EXPECT_DOUBLE_EQ(d->histogram.bucket[0].upper_bound, 25e-6);
  EXPECT_EQ(d->histogram.bucket[0].cumulative_count, 0u);
  EXPECT_DOUBLE_EQ(d->histogram.bucket[1].upper_bound, 50e-6);
  EXPECT_EQ(d->histogram.bucket[1].cumulative_count, 1u);
  EXPECT_DOUBLE_EQ(d->histogram.bucket[19].upper_bound, 25e-6 * (1 << 19));
  EXPECT_EQ(d->histogram.bucket[19].cumulative_count, 1u);
  EXPECT_EQ(d->histogram.bucket[20].cumulative_count, 2u);
}

TEST(PrometheusMetrics, EveryRankHasItsLoadSeries) {
  PrometheusMetrics m(1);
  EXPECT_FALSE(sample(m, "dspark_rank_load_seconds", "rank", "0"));  // not before the load
  // Rank 0 on a GPU with 7000 bytes in use, rank 1 without a device.
  const std::vector<RankLoad> loads = {{1.5, 1000, 900, 5000, 7000}, {2.5, 2000, 1900, 6000, 0}};
  m.set_rank_loads(loads);
  for (const int r : {0, 1}) {
    const std::string rank = std::to_string(r);
    EXPECT_EQ(gauge(m, "dspark_rank_load_seconds", "rank", rank), loads[r].load_seconds);
    EXPECT_EQ(gauge(m, "dspark_rank_load_read_bytes", "rank", rank), loads[r].read_bytes);
    EXPECT_EQ(gauge(m, "dspark_rank_weight_bytes", "rank", rank), loads[r].weight_bytes);
    EXPECT_EQ(gauge(m, "dspark_rank_peak_resident_bytes", "rank", rank), loads[r].peak_resident_bytes);
  }
  EXPECT_FALSE(sample(m, "dspark_rank_load_seconds", "rank", "2"));
  EXPECT_EQ(gauge(m, "dspark_rank_device_memory_used_bytes", "rank", "0"), 7000.0);
  EXPECT_FALSE(sample(m, "dspark_rank_device_memory_used_bytes", "rank", "1"));
}

// A drafter double: what TimedEngine forwards, counted.
class CountingEngine final : public DraftEngine {
 public:
  int inserts = 0, drafts = 0, resets = 0;
  int64_t row_dim() const override { return 6; }
  void insert_blocks(std::span<const ContextBlock> blocks, const bf16_t*) override {
    inserts += static_cast<int>(blocks.size());
  }
  void validate_inserts(std::span<const ContextBlock>) const override {}
  DraftResult draft(std::span<const DraftRequest> requests, bool) override {
    ++drafts;
    if (requests.empty()) fail("no requests");
    return {};
  }
  void reset(int64_t) override { ++resets; }
  void validate(std::span<const DraftRequest>) const override {}
  void set_max_model_len(int64_t) override {}
};

TEST(PrometheusMetrics, TimedEngineObservesEachInsertAndDraftItRuns) {
  PrometheusMetrics m(4);
  CountingEngine inner;
  TimedEngine timed(inner, m);
  const std::vector<bf16_t> rows(12);
  const std::vector<DraftRequest> requests(2);
  timed.insert(0, 0, rows.data(), 2);
  timed.insert(1, 0, rows.data(), 1);
  timed.insert(2, 5, rows.data(), 2);
  timed.draft(requests, true);
  timed.reset(1);
  EXPECT_THROW(timed.draft({}, true), Error);  // a failed draft is not observed
  EXPECT_EQ(inner.inserts, 3);
  EXPECT_EQ(inner.drafts, 2);
  EXPECT_EQ(inner.resets, 1);
  EXPECT_EQ(observations(m, "dspark_insert_duration_seconds"), 3u);
  EXPECT_EQ(observations(m, "dspark_draft_duration_seconds"), 1u);
  // A step with both: one call, observed as its draft.
  const std::vector<ContextBlock> blocks = {{0, 2, 1}, {3, 0, 1}};
  timed.insert_and_draft(blocks, rows.data(), requests, true);
  EXPECT_EQ(inner.inserts, 5);
  EXPECT_EQ(inner.drafts, 3);
  EXPECT_EQ(observations(m, "dspark_insert_duration_seconds"), 3u);
  EXPECT_EQ(observations(m, "dspark_draft_duration_seconds"), 2u);
}

TEST(PrometheusMetrics, APortInUseIsRefusedNamingTheAddress) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const int port = ntohs(a.sin_port);
  PrometheusMetrics m(1);
  try {
    m.serve("127.0.0.1", port);
    ADD_FAILURE() << "serve() on a port in use did not throw";
  } catch (const Error& e) {
    EXPECT_THAT(e.what(), AllOf(HasSubstr("metrics: cannot listen on 127.0.0.1:" + std::to_string(port)),
                                HasSubstr("metrics.port")));
  }
  ::close(fd);
}

}  // namespace
}  // namespace dspark
