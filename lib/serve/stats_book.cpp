#include "lib/serve/stats_book.hpp"

#include <algorithm>
#include <vector>

namespace dspark::host {
namespace {

constexpr size_t kRecentSteps = 1024;  // latency window of the stats

}  // namespace

void StatsBook::rejected_message() {
  if (metrics_) metrics_->message_rejected();
  std::lock_guard<std::mutex> lock(mu_);
  ++s_.rejected_messages;
}

void StatsBook::host_attached() {
  if (metrics_) metrics_->host_attached();
  std::lock_guard<std::mutex> lock(mu_);
  ++s_.hosts_attached;
}

void StatsBook::host_lost() {
  if (metrics_) metrics_->host_lost();
  std::lock_guard<std::mutex> lock(mu_);
  ++s_.hosts_lost;
}

void StatsBook::acceptance_counted(int64_t accepted) {
  std::lock_guard<std::mutex> lock(mu_);
  ++more_.acceptance_reports;
  more_.accepted_tokens += static_cast<uint64_t>(accepted);
}

void StatsBook::markov_looked_up(int64_t lookups, int64_t hits) {
  std::lock_guard<std::mutex> lock(mu_);
  more_.markov_lookups += static_cast<uint64_t>(lookups);
  more_.markov_hits += static_cast<uint64_t>(hits);
}

void StatsBook::set_hot_uncached(const std::vector<std::pair<int32_t, uint64_t>>& hot) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = std::min<size_t>(hot.size(), kHotUncachedTokens);
  more_.hot_uncached = static_cast<uint32_t>(n);
  for (size_t i = 0; i < kHotUncachedTokens; ++i) {
    more_.hot_tokens[i] = i < n ? hot[i].first : 0;
    more_.hot_seen[i] = i < n ? hot[i].second : 0;
  }
}

StatsMore StatsBook::snapshot_more() const {
  std::lock_guard<std::mutex> lock(mu_);
  return more_;
}

void StatsBook::step_answered(Status s, double us, uint64_t drafts, uint64_t resets, uint64_t context_rows) {
  const bool rejected = s == Status::invalid_argument || s == Status::resource_exhausted;
  if (metrics_ && rejected) metrics_->message_rejected();
  if (metrics_ && !rejected) metrics_->step_answered(s, us * 1e-6, drafts, resets, context_rows);
  std::lock_guard<std::mutex> lock(mu_);
  if (rejected) {
    ++s_.rejected_messages;
    return;
  }
  ++s_.steps;
  recent_us_.push_back(us);
  if (recent_us_.size() > kRecentSteps) recent_us_.pop_front();
  if (s == Status::ok) {
    failed_in_a_row_ = 0;
    s_.drafts += drafts;
    s_.resets += resets;
    s_.context_rows += context_rows;
  } else {
    ++s_.failed_steps;
    ++failed_in_a_row_;
  }
}

StatsResponse StatsBook::snapshot() const {
  std::vector<double> v;
  StatsResponse r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    r = s_;
    v.assign(recent_us_.begin(), recent_us_.end());
  }
  std::sort(v.begin(), v.end());
  if (!v.empty()) {
    r.step_us_p50 = v[v.size() / 2];
    r.step_us_p99 = v[static_cast<size_t>(0.99 * static_cast<double>(v.size() - 1))];
    r.step_us_max = v.back();
  }
  return r;
}

uint32_t StatsBook::failed_in_a_row() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failed_in_a_row_;
}

uint64_t StatsBook::steps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_.steps;
}

}  // namespace dspark::host
