#include <cuda_runtime.h>

#include "kernels/cuda/device_info.hpp"
#include "lib/core/error.hpp"

namespace dspark::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky "no driver" error
    return 0;
  }
  return n;
}

DeviceInfo device_info(int index) {
  cudaDeviceProp p{};
  const cudaError_t err = cudaGetDeviceProperties(&p, index);
  if (err != cudaSuccess) fail("cuda device {}: {}", index, cudaGetErrorString(err));
  DeviceInfo d;
  d.index = index;
  d.name = p.name;
  d.sm_major = p.major;
  d.sm_minor = p.minor;
  d.multiprocessors = p.multiProcessorCount;
  d.memory_bytes = p.totalGlobalMem;
  int bus = 0, clock = 0;
  cudaDeviceGetAttribute(&bus, cudaDevAttrGlobalMemoryBusWidth, index);
  cudaDeviceGetAttribute(&clock, cudaDevAttrMemoryClockRate, index);
  d.memory_bus_bits = bus;
  d.memory_clock_khz = clock;
  return d;
}

std::vector<DeviceInfo> all_devices() {
  std::vector<DeviceInfo> out;
  for (int i = 0; i < device_count(); ++i) out.push_back(device_info(i));
  return out;
}

}  // namespace dspark::cuda
