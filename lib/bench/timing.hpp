// Timing helpers of dspark_bench. Every measurement is fenced the same way on every rank: the rank's queued
// work is drained and the ranks meet at an MPI barrier before each timed call, so one rank's lag does not
// leak into the next call's figure. Times are in microseconds.
#pragma once

#include <functional>
#include <vector>

#include "comm/communicator.hpp"
#include "lib/bench/bench_clock.hpp"

namespace dspark::bench {

struct Stats {
  double median_us = 0;
  double p99_us = 0;  // nearest rank: with 50 samples, the largest
};
Stats summarize(std::vector<double> us);

// Whether a timed call returns only once its work is done (Drafter::draft: its answer is on the host), or
// may return with work still queued (Drafter::insert), which the timing then waits for.
enum class CallEnd { done, queued };

// Host wall-clock of fn() per call, fenced before (drain + barrier) and, for CallEnd::queued, after
// (drain): what a caller waits for.
std::vector<double> time_host(BenchClock& clock, Communicator& comm, int iters,
                              const std::function<void()>& fn, CallEnd end);

}  // namespace dspark::bench
