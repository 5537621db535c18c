#include "lib/serve/timed_engine.hpp"

#include <chrono>

namespace dspark {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// A call that throws is not timed: its step counts as failed.
void TimedEngine::insert_blocks(std::span<const ContextBlock> blocks, const bf16_t* rows) {
  const auto t0 = std::chrono::steady_clock::now();
  inner_.insert_blocks(blocks, rows);
  metrics_.inserted(seconds_since(t0));
}

DraftResult TimedEngine::insert_and_draft(std::span<const ContextBlock> blocks, const bf16_t* rows,
                                          std::span<const DraftRequest> requests, bool with_margin) {
  const auto t0 = std::chrono::steady_clock::now();
  DraftResult r = inner_.insert_and_draft(blocks, rows, requests, with_margin);
  metrics_.drafted(seconds_since(t0));
  metrics_.markov_cache_looked_up(r.markov_lookups, r.markov_hits);
  return r;
}

DraftResult TimedEngine::draft(std::span<const DraftRequest> requests, bool with_margin) {
  const auto t0 = std::chrono::steady_clock::now();
  DraftResult r = inner_.draft(requests, with_margin);
  metrics_.drafted(seconds_since(t0));
  metrics_.markov_cache_looked_up(r.markov_lookups, r.markov_hits);
  return r;
}

}  // namespace dspark
