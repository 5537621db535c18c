// The GPU query works where there is a GPU and answers "none" cleanly where there is not.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>

#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/launch_policy.hpp"

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

// The kernels know the target they were built for (the lowest of CMAKE_CUDA_ARCHITECTURES: 90a gives PTX
// version 90, 80-virtual 80), and use sm_90's launches (programmatic dependence, clusters) only when both
// that target and the GPU have them.
TEST(CudaDevice, KernelsKnowTheTargetTheyWereBuiltFor) {
  if (cuda::device_count() == 0) GTEST_SKIP() << "no GPU";
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  const std::string archs = DSPARK_CUDA_ARCHITECTURES;
  const int built = std::stoi(archs);  // the first listed; the builds here list one
  EXPECT_EQ(cuda::kernels_ptx_version(), built) << archs;
  const cuda::DeviceInfo d = cuda::device_info(0);
  EXPECT_EQ(cuda::hopper_kernels(), d.sm_major >= 9 && built >= 90);
}

}  // namespace
}  // namespace dspark
