#include "lib/bench/host_clock.hpp"

#include <chrono>
#include <cstring>
#include <vector>

#include "lib/bench/timing.hpp"

namespace dspark::bench {

std::vector<double> HostClock::time_queued(Communicator& comm, int iters, const std::function<void()>& fn) {
  return time_host(*this, comm, iters, fn, CallEnd::queued);
}

double HostClock::bandwidth(uint64_t bytes, int reps) {
  std::vector<unsigned char> src(bytes, 1), dst(bytes, 0);
  std::vector<double> us;
  for (int i = 0; i <= reps; ++i) {  // copy 0 warms up
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), bytes);
    const auto t1 = std::chrono::steady_clock::now();
    if (i > 0) us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
    src[static_cast<size_t>(i) % bytes] = dst[bytes - 1];  // the copies' results are used
  }
  return 2.0 * static_cast<double>(bytes) / (summarize(us).median_us * 1e-6);
}

}  // namespace dspark::bench
