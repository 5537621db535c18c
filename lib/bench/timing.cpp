#include "lib/bench/timing.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>

namespace dspark::bench {

Stats summarize(std::vector<double> us) {
  if (us.empty()) return {};
  std::sort(us.begin(), us.end());
  const size_t n = us.size();
  const double median = n % 2 ? us[n / 2] : 0.5 * (us[n / 2 - 1] + us[n / 2]);
  const size_t p99 = static_cast<size_t>(std::ceil(0.99 * static_cast<double>(n))) - 1;
  return {median, us[std::min(p99, n - 1)]};
}

std::vector<double> time_host(BenchClock& clock, Communicator& comm, int iters,
                              const std::function<void()>& fn, CallEnd end) {
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    clock.drain();
    comm.barrier();
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    // A second, device-wide sync after a call that has synchronised costs about 6 us of host time (2 x H200)
    // that no caller of it pays.
    if (end == CallEnd::queued) clock.drain();
    const auto t1 = std::chrono::steady_clock::now();
    us.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  return us;
}

}  // namespace dspark::bench
