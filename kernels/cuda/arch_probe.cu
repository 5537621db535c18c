// The target the backend's kernels were built for, read from one of them: every .cu file of dspark_cuda is
// compiled with the same architectures, so this kernel's PTX version is theirs (90 for an sm_90a build, 80
// for one that carries compute_80 PTX only, whatever GPU the driver JIT-compiles it for).
#include <cuda_runtime.h>

#include "kernels/cuda/launch_policy.hpp"

namespace dspark::cuda {
namespace {

__global__ void arch_probe_kernel() {}

}  // namespace

int kernels_ptx_version() {
  cudaFuncAttributes a{};
  return cudaFuncGetAttributes(&a, arch_probe_kernel) == cudaSuccess ? a.ptxVersion : 0;
}

}  // namespace dspark::cuda
