// Kernel start trace, a diagnostic of builds configured with -DDSPARK_KERNEL_TRACE=ON (off by default; the
// kernels are then unchanged). Every kernel's first block records, as it passes wait_for_previous_kernels,
// when it was launched (before the programmatic-launch wait), when its dependencies were met (after it) and
// its grid: in a replayed draft step, the times between successive kernels of the main stream are its
// critical path, boundaries included, which a profiler that runs one kernel at a time cannot show.
// A CudaBackend given a trace file (CudaBackend::set_kernel_trace_file: the worker's
// debug.kernel_trace_file, dspark_bench's --kernel-trace) resets the records at each graph replay and appends
// them to it at the next synchronize() or wait_for_word() (one CSV line per kernel, with the step's sequence
// number): the replayed draft steps (Drafter::draft waits for its answer; an insert does not).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

namespace dspark::cuda {

struct KernelTraceRecord {
  uint64_t launched_ns;  // %globaltimer before the dependency wait
  uint64_t ready_ns;     // and after it
  uint32_t grid_x, grid_y, grid_z, block_x;
};

// Whether this build records (DSPARK_KERNEL_TRACE).
bool kernel_trace_built();
// Each .cu file's records pointer (its own device symbols: the kernels are not relocatable device code) is
// set through the setter it registers at static initialisation.
using KernelTraceSetter = cudaError_t (*)(KernelTraceRecord* records, unsigned* count, unsigned capacity);
bool kernel_trace_register(KernelTraceSetter setter);
// Allocates the records on the current device (once) and points every registered file at them.
void kernel_trace_attach(unsigned capacity);
// Stream-ordered reset of the count; the records written since, after the stream has synchronised.
void kernel_trace_reset(cudaStream_t s);
std::vector<KernelTraceRecord> kernel_trace_read();
// CudaBackend's hooks (no-ops when `file` is empty): at a replay outside a graph recording, attach and reset;
// at the next synchronize() or wait_for_word(), append them to "<file>.gpu<device>" as CSV (call, kernel,
// launched_ns, ready_ns, grid_x, grid_y, grid_z, block_x).
void kernel_trace_step_begin(const std::string& file, cudaStream_t s);
void kernel_trace_step_end(const std::string& file, int device);

}  // namespace dspark::cuda
