// The host side of the kernel start trace (kernel_trace.hpp).
#include "kernels/cuda/kernel_trace.hpp"

#include <algorithm>
#include <fstream>
#include <string>

#include "kernels/cuda/cuda_check.hpp"
#include "lib/core/error.hpp"

namespace dspark::cuda {

namespace {

struct TraceState {
  std::vector<KernelTraceSetter> setters;
  KernelTraceRecord* records = nullptr;
  unsigned* count = nullptr;
  unsigned capacity = 0;
  bool step_open = false;  // a step began (reset) and has not been written yet
};

TraceState& state() {
  static TraceState s;
  return s;
}

}  // namespace

bool kernel_trace_built() {
#ifdef DSPARK_KERNEL_TRACE
  return true;
#else
  return false;
#endif
}

bool kernel_trace_register(KernelTraceSetter setter) {
  state().setters.push_back(setter);
  return true;
}

void kernel_trace_attach(unsigned capacity) {
  TraceState& s = state();
  if (s.records != nullptr) return;
  check(cudaMalloc(&s.records, capacity * sizeof(KernelTraceRecord)), "kernel trace records");
  check(cudaMalloc(&s.count, sizeof(unsigned)), "kernel trace count");
  check(cudaMemset(s.count, 0, sizeof(unsigned)), "kernel trace count");
  s.capacity = capacity;
  for (KernelTraceSetter set : s.setters) check(set(s.records, s.count, capacity), "kernel trace symbols");
}

void kernel_trace_reset(cudaStream_t stream) {
  if (state().count != nullptr)
    check(cudaMemsetAsync(state().count, 0, sizeof(unsigned), stream), "kernel trace reset");
}

std::vector<KernelTraceRecord> kernel_trace_read() {
  const TraceState& s = state();
  if (s.count == nullptr) return {};
  unsigned n = 0;
  check(cudaMemcpy(&n, s.count, sizeof n, cudaMemcpyDeviceToHost), "kernel trace count");
  std::vector<KernelTraceRecord> out(std::min(n, s.capacity));
  if (!out.empty())
    check(cudaMemcpy(out.data(), s.records, out.size() * sizeof(KernelTraceRecord), cudaMemcpyDeviceToHost),
          "kernel trace records");
  return out;
}

void kernel_trace_step_begin(const std::string& file, cudaStream_t s) {
  if (file.empty()) return;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(s, &status), "kernel trace");
  if (status != cudaStreamCaptureStatusNone) return;
  kernel_trace_attach(1 << 16);
  kernel_trace_reset(s);
  state().step_open = true;
}

void kernel_trace_step_end(const std::string& file, int device) {
  if (file.empty() || !state().step_open) return;
  state().step_open = false;
  static unsigned long call = 0;
  const std::string path = file + ".gpu" + std::to_string(device);
  std::ofstream f(path, std::ios::app);
  unsigned i = 0;
  for (const KernelTraceRecord& r : kernel_trace_read())
    f << call << ',' << i++ << ',' << r.launched_ns << ',' << r.ready_ns << ',' << r.grid_x << ',' << r.grid_y
      << ',' << r.grid_z << ',' << r.block_x << '\n';
  if (!f) fail("kernel trace: cannot write {}", path);
  ++call;
}

}  // namespace dspark::cuda
