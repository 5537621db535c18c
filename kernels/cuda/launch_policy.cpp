// Whether launch_kernel asks for programmatic dependent launch (launch.hpp): a process-wide switch read once.
#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "kernels/cuda/launch_policy.hpp"

namespace dspark::cuda {

bool programmatic_launch() {
  static const bool on = [] {
    const char* env = std::getenv("DSPARK_PDL");
    if (env != nullptr && std::strcmp(env, "0") == 0) return false;
    // griddepcontrol exists from sm_90 on; the kernels compile it in only there.
    int device = 0, major = 0;
    return cudaGetDevice(&device) == cudaSuccess &&
           cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
           major >= 9;
  }();
  return on;
}

}  // namespace dspark::cuda
