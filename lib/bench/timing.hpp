// Timing helpers of dspark_bench. Every measurement is fenced the same way on every rank: the stream is
// drained and the ranks meet at an MPI barrier before each timed call, so one rank's lag does not leak into
// the next call's figure. Times are in microseconds.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.hpp"
#include "kernels/cuda/cuda_backend.hpp"

namespace dspark::bench {

struct Stats {
  double median_us = 0;
  double p99_us = 0;  // nearest rank: with 50 samples, the largest
};
Stats summarize(std::vector<double> us);

// Whether a timed call returns only once its work is done (Drafter::draft: its answer is on the host), or
// may return with work still queued (Drafter::insert), which the timing then waits for.
enum class CallEnd { done, queued };

// Host wall-clock of fn() per call, fenced before (device sync + barrier) and, for CallEnd::queued, after
// (device sync): what a caller waits for.
std::vector<double> time_host(CudaBackend& be, Communicator& comm, int iters, const std::function<void()>& fn,
                              CallEnd end);

// Device time of the work fn() enqueues on the backend's stream (CUDA events around it), fenced before each
// call: for collectives, whose host side only enqueues.
std::vector<double> time_stream(CudaBackend& be, Communicator& comm, int iters,
                                const std::function<void()>& fn);

// Device memory bandwidth in bytes/s: a device-to-device cudaMemcpyAsync of `bytes` (read + written = 2
// bytes), the median of `reps` copies after one warm-up copy.
double device_bandwidth(CudaBackend& be, uint64_t bytes, int reps = 5);

}  // namespace dspark::bench
