// BenchClock of the CUDA backend: a device-wide sync drains the rank's GPU (its stream and NCCL's work),
// CUDA events on the backend's stream time the work a call queues, and a device-to-device copy measures the
// bandwidth.
#pragma once

#include "kernels/cuda/cuda_backend.hpp"
#include "lib/bench/bench_clock.hpp"

namespace dspark::bench {

class CudaClock final : public BenchClock {
 public:
  explicit CudaClock(CudaBackend& backend) : be_(backend) {}
  void drain() override;
  std::vector<double> time_queued(Communicator& comm, int iters, const std::function<void()>& fn) override;
  double bandwidth(uint64_t bytes, int reps = 5) override;
  std::string bandwidth_method() const override { return "device-to-device copy"; }
  std::vector<double> host_link_us(uint64_t bytes, int reps) override;

 private:
  CudaBackend& be_;
};

}  // namespace dspark::bench
