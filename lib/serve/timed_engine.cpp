#include "lib/serve/timed_engine.hpp"

#include <chrono>

namespace dspark {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

// A call that throws is not timed: its step counts as failed.
void TimedEngine::insert(int64_t slot, int64_t first_pos, const bf16_t* rows, int64_t n) {
  const auto t0 = std::chrono::steady_clock::now();
  inner_.insert(slot, first_pos, rows, n);
  metrics_.inserted(seconds_since(t0));
}

DraftResult TimedEngine::draft(std::span<const DraftRequest> requests, bool with_margin) {
  const auto t0 = std::chrono::steady_clock::now();
  DraftResult r = inner_.draft(requests, with_margin);
  metrics_.drafted(seconds_since(t0));
  return r;
}

}  // namespace dspark
