// CudaClock's host-link copy (the bench's insert rows beside their way to the GPU): one sample per rep, none
// faster than the GPU's own memory copies, and a large copy slower than a small one.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>

#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "lib/bench/cuda/cuda_clock.hpp"

namespace dspark {
namespace {

TEST(CudaBenchClock, HostLinkCopiesTakeTheirBytesTime) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  CudaBackend gpu(0);
  bench::CudaClock clock(gpu);
  constexpr uint64_t kSmall = 4096, kLarge = uint64_t{64} << 20;
  const double device_rate = clock.bandwidth(kLarge);  // bytes/s read + written on the GPU
  ASSERT_GT(device_rate, 0.0);
  const std::vector<double> small = clock.host_link_us(kSmall, 5), large = clock.host_link_us(kLarge, 7);
  ASSERT_EQ(small.size(), 5u);
  ASSERT_EQ(large.size(), 7u);
  for (const double us : large) {
    // A copy over the host link moves its bytes no faster than the GPU copies its own memory (that copy's
    // rate counts each byte read and written: half of it is the bytes moved).
    EXPECT_GE(us, static_cast<double>(kLarge) / (device_rate / 2.0) * 1e6);
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  EXPECT_GT(median(large), median(small));
  for (const double us : small) EXPECT_GT(us, 0.0);
}

}  // namespace
}  // namespace dspark
