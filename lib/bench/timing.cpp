#include "lib/bench/timing.hpp"

#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "kernels/cuda/cuda_check.hpp"

namespace dspark::bench {
namespace {

// Everything queued on this rank's GPU (the backend's stream and NCCL's work) done, then all ranks meet.
void fence(CudaBackend& be, Communicator& comm) {
  cuda::check(cudaSetDevice(be.device()), "bench fence");
  cuda::check(cudaDeviceSynchronize(), "bench fence");
  comm.barrier();
}

// Two events on the backend's stream, destroyed with the object.
class EventPair {
 public:
  EventPair() {
    cuda::check(cudaEventCreate(&start_), "cudaEventCreate");
    cuda::check(cudaEventCreate(&stop_), "cudaEventCreate");
  }
  ~EventPair() {
    (void)cudaEventDestroy(start_);
    (void)cudaEventDestroy(stop_);
  }
  EventPair(const EventPair&) = delete;
  EventPair& operator=(const EventPair&) = delete;
  void start(cudaStream_t s) { cuda::check(cudaEventRecord(start_, s), "cudaEventRecord"); }
  void stop(cudaStream_t s) { cuda::check(cudaEventRecord(stop_, s), "cudaEventRecord"); }
  double elapsed_us() {
    cuda::check(cudaEventSynchronize(stop_), "cudaEventSynchronize");
    float ms = 0;
    cuda::check(cudaEventElapsedTime(&ms, start_, stop_), "cudaEventElapsedTime");
    return 1e3 * static_cast<double>(ms);
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

}  // namespace

Stats summarize(std::vector<double> us) {
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  const double median = n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
  const size_t p99 = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n))) - 1;
  return {median, us[std::min(p99, n - 1)]};
}

std::vector<double> time_host(CudaBackend& be, Communicator& comm, int iters, const std::function<void()>& fn,
                              CallEnd end) {
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    fence(be, comm);
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    // A second, device-wide sync after a call that has synchronised costs about 6 us of host time (2 x H200)
    // that no caller of it pays.
    if (end == CallEnd::queued) cuda::check(cudaDeviceSynchronize(), "bench timed call");
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return us;
}

std::vector<double> time_stream(CudaBackend& be, Communicator& comm, int iters,
                                const std::function<void()>& fn) {
  EventPair ev;
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    fence(be, comm);
    ev.start(be.stream());
    fn();
    ev.stop(be.stream());
    us.push_back(ev.elapsed_us());
  }
  return us;
}

double device_bandwidth(CudaBackend& be, uint64_t bytes, int reps) {
  const Tensor src = be.alloc(DType::u8, {static_cast<int64_t>(bytes)});
  const Tensor dst = be.alloc(DType::u8, {static_cast<int64_t>(bytes)});
  EventPair ev;
  std::vector<double> us;
  for (int i = 0; i <= reps; ++i) {  // copy 0 warms up
    ev.start(be.stream());
    cuda::check(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, be.stream()),
                "bandwidth copy");
    ev.stop(be.stream());
    const double t = ev.elapsed_us();
    if (i > 0) us.push_back(t);
  }
  return 2.0 * static_cast<double>(bytes) / (summarize(us).median_us * 1e-6);
}

}  // namespace dspark::bench
