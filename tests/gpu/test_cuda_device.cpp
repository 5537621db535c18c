// The GPU query works where there is a GPU and answers "none" cleanly where there is not.
#include <gtest/gtest.h>

#include "kernels/cuda/device_info.hpp"

namespace dspark {
namespace {

TEST(CudaDevice, CountNeverThrows) {
  EXPECT_GE(cuda::device_count(), 0);
}

TEST(CudaDevice, DescribesEveryDevice) {
  const int n = cuda::device_count();
  if (n == 0) GTEST_SKIP() << "no GPU";
  for (const auto& d : cuda::all_devices()) {
    EXPECT_FALSE(d.name.empty());
    EXPECT_GE(d.sm_major, 7);
    EXPECT_GT(d.memory_bytes, uint64_t{1} << 30);
    EXPECT_GT(d.multiprocessors, 0);
  }
}

}  // namespace
}  // namespace dspark
