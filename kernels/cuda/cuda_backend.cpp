// The CUDA backend's device, streams, cuBLAS handles, scratch, allocation, host transfers and graph capture;
// the ops that launch kernels are in the families' *_ops.cpp.
#include "kernels/cuda/cuda_backend.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>

#include "kernels/cuda/attention.hpp"
#include "kernels/cuda/blas.hpp"
#include "kernels/cuda/cuda_check.hpp"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/kernel_trace.hpp"
#include "kernels/cuda/launch_policy.hpp"
#include "lib/core/row_memory.hpp"

namespace dspark {

using cuda::check;

namespace {

// Row memory (lib/core/row_memory.hpp) page-locked and mapped, for every CUDA context of the process: an
// insert reads its rows where a message was decoded.
void* allocate_page_locked(size_t bytes) {
  void* p = nullptr;
  return cudaHostAlloc(&p, bytes, cudaHostAllocPortable | cudaHostAllocMapped) == cudaSuccess ? p : nullptr;
}

void release_page_locked(void* p) {
  (void)cudaFreeHost(p);
}

}  // namespace

CudaBackend::Blas::Blas(cudaStream_t stream) {
  check(cublasCreate(&handle), "cublasCreate");
  check(cudaMalloc(&workspace, kWorkspaceBytes), "cuBLAS workspace");
  check(cublasSetStream(handle, stream), "cublasSetStream");
  check(cublasSetWorkspace(handle, workspace, kWorkspaceBytes), "cublasSetWorkspace");
  // Split-K partials stay fp32 (the output is rounded once); the algorithm is cuBLAS's deterministic default.
  check(
      cublasSetMathMode(handle, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                          CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)),
      "cublasSetMathMode");
  check(cublasSetAtomicsMode(handle, CUBLAS_ATOMICS_NOT_ALLOWED), "cublasSetAtomicsMode");
}

CudaBackend::Blas::~Blas() {
  if (handle) cublasDestroy(handle);
  if (workspace) (void)cudaFree(workspace);
}

CudaBackend::Scratch::~Scratch() {
  if (data) (void)cudaFree(data);
  if (counters) (void)cudaFree(counters);
  for (void* p : retired) (void)cudaFree(p);
}

CudaBackend::CudaBackend(int device, const Tuning& tuning) : device_(device), tuning_(tuning) {
  const int n = cuda::device_count();
  if (device < 0 || device >= n) fail("cuda backend: no GPU {} ({} visible)", device, n);
  // The kernels' tensor-core products (bf16 mma.sync, ldmatrix, cp.async) exist from sm_80 on.
  if (const cuda::DeviceInfo d = cuda::device_info(device); d.sm_major < 8)
    fail("cuda backend: GPU {} ({}) is sm_{}{}; the CUDA backend needs sm_80 or later", device, d.name,
         d.sm_major, d.sm_minor);
  cuda::set_programmatic_launch(tuning.pdl);
  try {
    check(cudaSetDevice(device), "cudaSetDevice");
    install_row_memory_provider({allocate_page_locked, release_page_locked});
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check(cudaEventCreateWithFlags(&staged_, cudaEventDisableTiming), "cudaEventCreate");
    cur_ = stream_;
    blas_ = std::make_unique<Blas>(stream_);
    scratch_ = std::make_unique<Scratch>();
    check(cudaMalloc(&scratch_->data, Scratch::kInitialBytes), "scratch");
    scratch_->bytes = Scratch::kInitialBytes;
    for (Lane& l : lanes_) {
      check(cudaStreamCreateWithFlags(&l.stream, cudaStreamNonBlocking), "cudaStreamCreate (side)");
      check(cudaEventCreateWithFlags(&l.fork, cudaEventDisableTiming), "cudaEventCreate");
      check(cudaEventCreateWithFlags(&l.join, cudaEventDisableTiming), "cudaEventCreate");
      l.blas = std::make_unique<Blas>(l.stream);
      l.scratch = std::make_unique<Scratch>();
      check(cudaMalloc(&l.scratch->data, Scratch::kSideInitialBytes), "scratch (side)");
      l.scratch->bytes = Scratch::kSideInitialBytes;
    }
    const size_t counter_bytes = cuda::kAttentionSplitPairs * sizeof(uint32_t);
    for (Scratch* s : {scratch_.get(), lanes_[0].scratch.get(), lanes_[1].scratch.get()}) {
      check(cudaMalloc(&s->counters, counter_bytes), "attention split counters");
      check(cudaMemsetAsync(s->counters, 0, counter_bytes, stream_), "attention split counters");
    }
    check(cudaStreamSynchronize(stream_), "attention split counters");
  } catch (...) {
    release();
    throw;
  }
}

CudaBackend::~CudaBackend() {
  release();
}

void CudaBackend::set_kernel_trace_file(const std::string& file) {
  if (!file.empty() && !cuda::kernel_trace_built())
    fail("cuda backend: a kernel trace file ({}) needs a build configured with -DDSPARK_KERNEL_TRACE=ON",
         file);
  kernel_trace_file_ = file;
}

void CudaBackend::release() noexcept {
  if (stream_) (void)cudaStreamSynchronize(stream_);
  for (Lane& l : lanes_)
    if (l.stream) (void)cudaStreamSynchronize(l.stream);
  blas_.reset();
  scratch_.reset();
  for (Lane& l : lanes_) {
    l.blas.reset();
    l.scratch.reset();
    if (l.fork) (void)cudaEventDestroy(l.fork);
    if (l.join) (void)cudaEventDestroy(l.join);
    if (l.stream) (void)cudaStreamDestroy(l.stream);
    l = Lane{};
  }
  if (staged_) (void)cudaEventDestroy(staged_);
  if (staging_) (void)cudaFreeHost(staging_);
  staging_ = nullptr;
  staged_ = nullptr;
  if (stream_) (void)cudaStreamDestroy(stream_);
  stream_ = cur_ = nullptr;
  on_lane_ = nullptr;
}

void* CudaBackend::scratch(size_t bytes, const char* op) {
  Scratch& s = current_scratch();
  if (bytes <= s.bytes) return s.data;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(cur_, &status), op);
  if (status != cudaStreamCaptureStatusNone)
    fail(
        "cuda {}: needs {} bytes of scratch (have {}) during a CUDA graph capture; run the shape eagerly "
        "first",
        op, bytes, s.bytes);
  const size_t mib = size_t{1} << 20;
  const size_t grown = (std::max(bytes, 2 * s.bytes) + mib - 1) / mib * mib;
  void* p = nullptr;
  check(cudaMalloc(&p, grown), op);
  s.retired.push_back(s.data);  // may still be referenced by queued work or a captured graph
  s.data = p;
  s.bytes = grown;
  return p;
}

// ---- the side branches

void CudaBackend::begin_side(SideLane lane) {
  if (on_lane_) fail("cuda backend: begin_side() inside a side branch");
  Lane& l = lanes_[static_cast<size_t>(lane)];
  check(cudaEventRecord(l.fork, stream_), "begin_side");
  check(cudaStreamWaitEvent(l.stream, l.fork, 0), "begin_side");
  on_lane_ = &l;
  cur_ = l.stream;
}

void CudaBackend::end_side() {
  if (!on_lane_) return;
  Lane& l = *on_lane_;
  on_lane_ = nullptr;
  cur_ = stream_;
  check(cudaEventRecord(l.join, l.stream), "end_side");
  l.pending = true;
}

void CudaBackend::join_side() {
  end_side();
  // Only lane work not yet joined: a join event may last have been recorded inside a graph capture that has
  // ended, and waiting on such an event outside it is an error.
  for (Lane& l : lanes_) {
    if (!l.pending) continue;
    check(cudaStreamWaitEvent(stream_, l.join, 0), "join_side");
    l.pending = false;
  }
}

// ---- memory

namespace {

// A tensor of dtype and shape with no memory yet, and the bytes to allocate for it: its size rounded up to
// 256 (the allocators align to at least that), so that vector loads past a row end stay inside the buffer.
Tensor unbacked(const char* op, DType dtype, const Shape& shape, size_t* bytes) {
  for (int64_t d : shape)
    if (d < 0) fail("cuda {}: negative dimension in {}", op, shape_str(shape));
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  *bytes = std::max<size_t>(256, (t.nbytes() + 255) / 256 * 256);
  return t;
}

}  // namespace

// Zero-filled, as alloc_host: a fresh buffer never holds stale values.
Tensor CudaBackend::alloc(DType dtype, const Shape& shape) {
  size_t bytes = 0;
  Tensor t = unbacked("alloc", dtype, shape, &bytes);
  check(cudaSetDevice(device_), "alloc");
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess)
    fail("cuda alloc: {} bytes for {} {}: {}", bytes, dtype_name(dtype), shape_str(shape),
         cudaGetErrorString(err));
  t.owner = std::shared_ptr<void>(p, [](void* q) { (void)cudaFree(q); });
  t.data = p;
  check(cudaMemsetAsync(p, 0, bytes, stream_), "alloc");
  check(cudaStreamSynchronize(stream_), "alloc");
  return t;
}

Tensor CudaBackend::alloc_host(DType dtype, const Shape& shape) {
  size_t bytes = 0;
  Tensor t = unbacked("alloc_host", dtype, shape, &bytes);
  check(cudaSetDevice(device_), "alloc_host");
  void* p = nullptr;
  const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocMapped);
  if (err != cudaSuccess)
    fail("cuda alloc_host: {} bytes of page-locked memory for {} {}: {}", bytes, dtype_name(dtype),
         shape_str(shape), cudaGetErrorString(err));
  t.owner = std::shared_ptr<void>(p, [](void* q) { (void)cudaFreeHost(q); });
  void* dev = nullptr;
  check(cudaHostGetDevicePointer(&dev, p, 0), "alloc_host");
  if (dev != p) fail("cuda alloc_host: the GPU maps host memory at another address (no unified addressing)");
  std::memset(p, 0, bytes);
  t.data = p;
  return t;
}

void CudaBackend::wait_for_word(const Tensor& word, int32_t value) {
  cuda::expect_dtype(word, DType::i32, "wait_for_word", "word");
  cuda::expect_numel(word, 1, "wait_for_word", "word");
  const volatile int32_t* w = static_cast<const volatile int32_t*>(word.data);
  using clock = std::chrono::steady_clock;
  auto ask = clock::now() + std::chrono::microseconds(100);
  while (*w != value) {
    if (clock::now() < ask) continue;
    const cudaError_t st = cudaStreamQuery(stream_);
    if (st == cudaSuccess && *w != value)  // everything retired, its writes visible
      fail("cuda wait_for_word: the stream finished without writing {} (the word holds {})", value, *w);
    if (st != cudaSuccess && st != cudaErrorNotReady) check(st, "wait_for_word");
    ask = clock::now() + std::chrono::microseconds(100);
  }
  std::atomic_thread_fence(std::memory_order_acquire);  // what the caller reads next comes after the word
  cuda::kernel_trace_step_end(kernel_trace_file_, device_);
}

void* CudaBackend::staging(size_t bytes, const char* op) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  check(cudaStreamIsCapturing(stream_, &status), op);
  if (status != cudaStreamCaptureStatusNone) fail("cuda {}: a host transfer during a CUDA graph capture", op);
  if (bytes > kMaxStagingBytes) return nullptr;
  check(cudaEventSynchronize(staged_), op);  // the previous transfer through staging_ has landed
  if (staging_ == nullptr) check(cudaMallocHost(&staging_, kMaxStagingBytes), op);
  return staging_;
}

void CudaBackend::upload(const Tensor& dst, const void* src) {
  if (dst.nbytes() == 0) return;
  cuda::expect_data(dst, "upload", "dst");
  const size_t n = dst.nbytes();
  if (void* host = staging(n, "upload")) {
    // The caller's buffer may go away on return: the copy into staging_ is what the transfer reads, and the
    // next use of staging_ waits for it.
    std::memcpy(host, src, n);
    check(cudaMemcpyAsync(dst.data, host, n, cudaMemcpyHostToDevice, stream_), "upload");
    check(cudaEventRecord(staged_, stream_), "upload");
    return;
  }
  check(cudaMemcpyAsync(dst.data, src, n, cudaMemcpyHostToDevice, stream_), "upload");
  check(cudaStreamSynchronize(stream_), "upload");  // the host buffer may go away on return
}

bool CudaBackend::reads_in_place(const void* p) const {
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    (void)cudaGetLastError();  // an unknown pointer is plain memory
    return false;
  }
  return a.type == cudaMemoryTypeHost && a.devicePointer == p;
}

void CudaBackend::download(void* dst, const Tensor& src) {
  if (src.nbytes() == 0) return;
  cuda::expect_data(src, "download", "src");
  join_side();  // side work issued so far may have written src
  const size_t n = src.nbytes();
  void* host = staging(n, "download");
  check(cudaMemcpyAsync(host != nullptr ? host : dst, src.data, n, cudaMemcpyDeviceToHost, stream_),
        "download");
  if (host != nullptr) check(cudaEventRecord(staged_, stream_), "download");
  check(cudaStreamSynchronize(stream_), "download");
  if (host != nullptr) std::memcpy(dst, host, n);
}

void CudaBackend::zero(const Tensor& t) {
  if (t.nbytes() == 0) return;
  check(cudaMemsetAsync(t.data, 0, t.nbytes(), cur_), "zero");
}

void CudaBackend::begin_capture() {
  join_side();  // eager side work stays outside the recording
  // Thread-local mode: only this thread's unsafe calls (a cudaMalloc, a sync) break the capture.
  check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), "begin graph capture");
}

std::shared_ptr<void> CudaBackend::end_capture() {
  // A recording interrupted inside a side branch ends here too (as an invalid capture); the events' captured
  // records are no use outside it.
  on_lane_ = nullptr;
  for (Lane& l : lanes_) l.pending = false;
  cur_ = stream_;
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(stream_, &graph) != cudaSuccess || graph == nullptr) {
    cudaGetLastError();  // an invalidated capture: report "no graph", the stream is usable again
    return {};
  }
  cudaGraphExec_t exec = nullptr;
  const cudaError_t rc = cudaGraphInstantiate(&exec, graph, 0);
  cudaGraphDestroy(graph);
  check(rc, "instantiate graph");
  return std::shared_ptr<void>(exec, [](void* e) { cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(e)); });
}

void CudaBackend::replay(const std::shared_ptr<void>& graph) {
  cuda::kernel_trace_step_begin(kernel_trace_file_, stream_);
  check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(graph.get()), stream_), "graph launch");
}

uint64_t CudaBackend::device_memory_used() const {
  check(cudaSetDevice(device_), "device_memory_used");
  size_t free_bytes = 0, total_bytes = 0;
  check(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo");
  return static_cast<uint64_t>(total_bytes - free_bytes);
}

void CudaBackend::synchronize() {
  join_side();
  check(cudaStreamSynchronize(stream_), "synchronize");
  cuda::kernel_trace_step_end(kernel_trace_file_, device_);
}

}  // namespace dspark
