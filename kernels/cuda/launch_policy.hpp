// How the kernels are launched (launch_policy.cpp): whether launch_kernel (device_common.cuh) asks for
// programmatic dependent launch. Plain C++ (g++ and nvcc).
#pragma once

namespace dspark::cuda {

// Whether launches let a kernel overlap the tail of the one before it (programmatic dependent launch,
// sm_90+): on unless set_programmatic_launch(false), which CudaBackend calls with Tuning::pdl (process-wide:
// the last backend constructed decides). The results are the same bits either way.
bool programmatic_launch();
void set_programmatic_launch(bool on);

}  // namespace dspark::cuda
