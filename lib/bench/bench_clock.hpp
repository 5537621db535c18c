// What dspark_bench needs of a backend beyond the Backend interface: how to wait for a rank's queued work,
// how to time the work a call queues, and the memory bandwidth its floor divides by. CudaClock
// (lib/bench/cuda/cuda_clock.hpp) for the GPU, HostClock (lib/bench/host_clock.hpp) for the CPU backend.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace dspark::bench {

class BenchClock {
 public:
  virtual ~BenchClock() = default;
  // Everything queued on this rank done (the backend's work and its communicator's).
  virtual void drain() = 0;
  // Microseconds of the work each fn() call queues, each call fenced before (drain + barrier).
  virtual std::vector<double> time_queued(Communicator& comm, int iters, const std::function<void()>& fn) = 0;
  // Memory bandwidth in bytes/s: a copy of `bytes` (read + written = 2 bytes per byte), the median of `reps`
  // copies after one warm-up copy.
  virtual double bandwidth(uint64_t bytes, int reps = 5) = 0;
  // How bandwidth() measures, for the report ("device-to-device copy", "host memcpy").
  virtual std::string bandwidth_method() const = 0;
  // Microseconds of one copy of `bytes` from page-locked host memory to the memory the backend computes in
  // (the fastest way an insert's rows can take there), one per rep after a warm-up copy; empty where the rows
  // need no such copy (a backend computing in host memory).
  virtual std::vector<double> host_link_us(uint64_t /*bytes*/, int /*reps*/) { return {}; }
};

}  // namespace dspark::bench
