// Whether launch_kernel asks for programmatic dependent launch (launch_policy.hpp): a process-wide policy,
// which the CudaBackend sets from its Tuning.
#include <cuda_runtime.h>

#include <atomic>

#include "kernels/cuda/launch_policy.hpp"

namespace dspark::cuda {

namespace {
std::atomic<bool> g_requested{true};
}  // namespace

void set_programmatic_launch(bool on) {
  g_requested.store(on, std::memory_order_relaxed);
}

bool hopper_kernels() {
  // Every GPU of a run is the same kind.
  static const bool supported = [] {
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
           major >= 9 && kernels_ptx_version() >= 90;
  }();
  return supported;
}

bool programmatic_launch() {
  // griddepcontrol exists from sm_90 on; the kernels compile it in only there, and a launch that asked for
  // it without it would let a kernel start before its inputs were written.
  return hopper_kernels() && g_requested.load(std::memory_order_relaxed);
}

}  // namespace dspark::cuda
