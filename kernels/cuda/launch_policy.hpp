// How the kernels are launched (launch_policy.cpp): whether launch_kernel (device_common.cuh) asks for
// programmatic dependent launch. Plain C++ (g++ and nvcc).
#pragma once

namespace dspark::cuda {

// Whether launches let a kernel overlap the tail of the one before it (programmatic dependent launch,
// sm_90+): on unless the environment sets DSPARK_PDL=0 (read once). The results are the same bits either way.
bool programmatic_launch();

}  // namespace dspark::cuda
