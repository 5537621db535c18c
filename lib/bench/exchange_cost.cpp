#include "lib/bench/exchange_cost.hpp"

#include <cstring>

#include "lib/core/error.hpp"

namespace dspark::bench {
namespace {

template <typename T>
bool same_bits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

}  // namespace

bool same_drafts(const DraftResult& a, const DraftResult& b) {
  return a.batch == b.batch && a.k == b.k && same_bits(a.ids, b.ids) && same_bits(a.margin, b.margin) &&
         same_bits(a.conf_logit, b.conf_logit);
}

std::vector<Measurement> local_exchange_drafts(Bench& bench, Drafter& drafter, LocalExchangeCommunicator& lx,
                                               const std::vector<int64_t>& batches,
                                               const std::map<int64_t, DraftResult>& real) {
  bench.fill_context();
  lx.set_mode(LocalExchangeCommunicator::Mode::learn);
  std::map<int64_t, DraftResult> learned;
  for (const int64_t B : batches) learned[B] = bench.answer(B, /*eager=*/true);
  lx.set_mode(LocalExchangeCommunicator::Mode::local);
  drafter.capture_graphs();  // recordings whose exchanges are the local copies

  std::vector<Measurement> rows;
  for (const int64_t B : batches) {
    Measurement m = bench.draft_local(B);
    if (!same_drafts(bench.answer(B, /*eager=*/false), learned.at(B)))
      fail(
          "bench: the B = {} draft with local exchanges drafted otherwise than the draft it learned them "
          "from",
          B);
    const auto it = real.find(B);
    m.drafts_match_real = it != real.end() && same_drafts(it->second, learned.at(B));
    rows.push_back(std::move(m));
  }
  // Eager drafts copy at every exchange, recordings while they are made: none means the drafter's exchanges
  // went around the communicator.
  if (lx.copied() == 0) fail("bench: the drafts with local exchanges made no local copy");
  return rows;
}

void set_exchange_cost(Measurement& local, const Measurement& real, int64_t stages, int64_t k) {
  local.exchanges = 2 * stages + k;
  local.exchanges_by_replay = real.replay.median_us > 0 && local.replay.median_us > 0;
  local.exchanges_us = local.exchanges_by_replay ? real.replay.median_us - local.replay.median_us
                                                 : real.latency.median_us - local.latency.median_us;
}

}  // namespace dspark::bench
