// BenchClock of a backend whose calls do their work before they return (the CPU backend): queued work is
// the call itself, timed on the host, and the bandwidth is that of a host memcpy.
#pragma once

#include "lib/bench/bench_clock.hpp"
#include "lib/model/backend.hpp"

namespace dspark::bench {

class HostClock final : public BenchClock {
 public:
  explicit HostClock(Backend& backend) : be_(backend) {}
  void drain() override { be_.synchronize(); }
  std::vector<double> time_queued(Communicator& comm, int iters, const std::function<void()>& fn) override;
  // Two buffers of `bytes`, every page written first (no first-touch faults in the timed copies).
  double bandwidth(uint64_t bytes, int reps = 5) override;
  std::string bandwidth_method() const override { return "host memcpy"; }

 private:
  Backend& be_;
};

}  // namespace dspark::bench
