// How the kernels are launched (launch_policy.cpp): whether launch_kernel (device_common.cuh) asks for
// programmatic dependent launch. Plain C++ (g++ and nvcc).
#pragma once

namespace dspark::cuda {

// Whether launches let a kernel overlap the tail of the one before it (programmatic dependent launch,
// sm_90+): on unless set_programmatic_launch(false), which CudaBackend calls with Tuning::pdl (process-wide:
// the last backend constructed decides). The results are the same bits either way.
bool programmatic_launch();
void set_programmatic_launch(bool on);

// Whether the kernels may use what exists from sm_90 on (programmatic dependent launch, thread-block
// clusters): the GPU is sm_90 or later and the kernels were built for it (kernels_ptx_version() >= 90; a
// compute_80 PTX build has those paths compiled out, whatever GPU runs it). Asked once per process.
bool hopper_kernels();
// The PTX version (major * 10 + minor) the backend's kernels were compiled for; 0 when unknown.
int kernels_ptx_version();

}  // namespace dspark::cuda
