// The GPUs this process can see: how many, and what each is (for logs, device mapping and benchmark floors).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace dspark::cuda {

struct DeviceInfo {
  int index = 0;
  std::string name;
  int sm_major = 0, sm_minor = 0;
  int multiprocessors = 0;
  uint64_t memory_bytes = 0;
  int memory_bus_bits = 0;
  double memory_clock_khz = 0;
};

// 0 when there is no driver or no device (never throws: CPU-only machines ask this to skip GPU work).
int device_count();
// Throws dspark::Error with CUDA's message when the query fails.
DeviceInfo device_info(int index);
std::vector<DeviceInfo> all_devices();

}  // namespace dspark::cuda
