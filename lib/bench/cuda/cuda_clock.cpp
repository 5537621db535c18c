#include "lib/bench/cuda/cuda_clock.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <memory>

#include "kernels/cuda/cuda_check.hpp"
#include "lib/bench/timing.hpp"

namespace dspark::bench {
namespace {

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

std::vector<double> CudaClock::host_link_us(uint64_t bytes, int reps) {
  void* host = nullptr;
  cuda::check(cudaSetDevice(be_.device()), "host link copy");
  cuda::check(cudaMallocHost(&host, bytes), "host link copy: page-locked buffer");
  const std::unique_ptr<void, void (*)(void*)> owned(host, [](void* p) { (void)cudaFreeHost(p); });
  std::memset(host, 1, bytes);
  const Tensor dst = be_.alloc(DType::u8, {static_cast<int64_t>(bytes)});
  EventPair ev;
  std::vector<double> us;
  for (int i = 0; i <= reps; ++i) {  // copy 0 warms up
    ev.start(be_.stream());
    cuda::check(cudaMemcpyAsync(dst.data, host, bytes, cudaMemcpyHostToDevice, be_.stream()),
                "host link copy");
    ev.stop(be_.stream());
    const double t = ev.elapsed_us();
    if (i > 0) us.push_back(t);
  }
  return us;
}

void CudaClock::drain() {
  cuda::check(cudaSetDevice(be_.device()), "bench fence");
  cuda::check(cudaDeviceSynchronize(), "bench fence");
}

std::vector<double> CudaClock::time_queued(Communicator& comm, int iters, const std::function<void()>& fn) {
  EventPair ev;
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    drain();
    comm.barrier();
    ev.start(be_.stream());
    fn();
    ev.stop(be_.stream());
    us.push_back(ev.elapsed_us());
  }
  return us;
}

double CudaClock::bandwidth(uint64_t bytes, int reps) {
  const Tensor src = be_.alloc(DType::u8, {static_cast<int64_t>(bytes)});
  const Tensor dst = be_.alloc(DType::u8, {static_cast<int64_t>(bytes)});
  EventPair ev;
  std::vector<double> us;
  for (int i = 0; i <= reps; ++i) {  // copy 0 warms up
    ev.start(be_.stream());
    cuda::check(cudaMemcpyAsync(dst.data, src.data, bytes, cudaMemcpyDeviceToDevice, be_.stream()),
                "bandwidth copy");
    ev.stop(be_.stream());
    const double t = ev.elapsed_us();
    if (i > 0) us.push_back(t);
  }
  return 2.0 * static_cast<double>(bytes) / (summarize(us).median_us * 1e-6);
}

}  // namespace dspark::bench
