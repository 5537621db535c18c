#include "comm/nccl_communicator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "core/error.hpp"

namespace dspark {
namespace {

void nccl_check(ncclResult_t rc, const char* what, ncclComm_t comm = nullptr) {
  if (rc == ncclSuccess) return;
  // ncclGetLastError carries the detail (which peer, which transport) that the result code lacks.
  const char* last = comm != nullptr ? ncclGetLastError(comm) : nullptr;
  fail("NCCL {} failed: {}{}{}", what, ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) fail("CUDA {} failed: {}", what, cudaGetErrorString(rc));
}

// Scratch records per rank before any batch asked for more: the worker's batches fit without a resize.
constexpr int64_t kInitialRecords = 1024;

}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t stream) : host_(comm), stream_(stream) {
  int device = 0;
  cuda_check(cudaGetDevice(&device), "cudaGetDevice");
#if CUDART_VERSION >= 12080
  if (stream_ != nullptr) cuda_check(cudaStreamGetDevice(stream_, &device), "cudaStreamGetDevice");
#endif
  // ncclCommInitRank binds the communicator to the current device.
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  // NVLink SHARP (NVLS) reduces inside the switch; it stays off unless asked for (the machines this runs on
  // are told to leave NVLink multicast alone). NCCL reads the variable at init, on every rank.
  setenv("NCCL_NVLS_ENABLE", "0", /*overwrite=*/0);

  // As llm.c's zero.cuh: rank 0 makes the unique id, MPI carries it to every rank. A failure on rank 0
  // travels with it, so no rank waits in ncclCommInitRank for a peer that never comes.
  struct {
    ncclUniqueId id;
    int32_t rc;
  } boot{};
  if (rank() == 0) boot.rc = static_cast<int32_t>(ncclGetUniqueId(&boot.id));
  host_.broadcast(&boot, sizeof(boot), 0);
  nccl_check(static_cast<ncclResult_t>(boot.rc), "ncclGetUniqueId (rank 0)");
  nccl_check(ncclCommInitRank(&nccl_, size(), boot.id, rank()), "ncclCommInitRank");
  // Symmetric windows only where they cannot change the SPEC's "same bits on every rank": with two ranks
  // every reduction order computes the same a + b; with more, NCCL's symmetric kernels may sum per rank.
  // Off unless DSPARK_NCCL_WINDOWS=1: with them, eager tp = 2 drafts differed from run to run (a race not
  // yet found, docs/gpu-testing.md), and in graphs they saved 2 us a step.
  const char* env = std::getenv("DSPARK_NCCL_WINDOWS");
  windows_ = size() == 2 && env != nullptr && std::strcmp(env, "1") == 0;
  const char* peer_env = std::getenv("DSPARK_PEER_SUM");
  peer_sums_ = size() == 2 && !(peer_env != nullptr && std::strcmp(peer_env, "0") == 0);
  reserve_records(kInitialRecords);
}

NcclCommunicator::~NcclCommunicator() {
  // Destructors must not throw: errors at teardown are ignored.
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  // The peer may still read this rank's exported partials: every rank closes its mappings, then frees.
  for (const PeerMapping& m : peer_mappings_) (void)cudaIpcCloseMemHandle(m.peer);
  if (!peer_mappings_.empty()) {
    try {
      host_.barrier();
    } catch (...) {  // a peer gone: free anyway
    }
  }
  for (const PeerMapping& m : peer_mappings_) (void)cudaFree(m.mine);
  for (const Window& w : windows_owned_) {
    if (nccl_ != nullptr) (void)ncclCommWindowDeregister(nccl_, w.handle);
    (void)ncclMemFree(w.data);
  }
  if (nccl_ != nullptr) (void)ncclCommDestroy(nccl_);
  for (void* p : cuda_scratch_) (void)cudaFree(p);
}

void* NcclCommunicator::window_alloc(size_t bytes) {
  if (!windows_) return nullptr;
  bytes = (std::max<size_t>(bytes, 1) + NCCL_WIN_REQUIRED_ALIGNMENT - 1) / NCCL_WIN_REQUIRED_ALIGNMENT *
          NCCL_WIN_REQUIRED_ALIGNMENT;
  void* p = nullptr;
  const ncclResult_t rc = ncclMemAlloc(&p, bytes);
  // Registration is collective: every rank registers or none does.
  if (host_.any(rc != ncclSuccess)) {
    if (rc == ncclSuccess) (void)ncclMemFree(p);
    windows_ = false;
    return nullptr;
  }
  Window w{p, nullptr};
  const ncclResult_t reg = ncclCommWindowRegister(nccl_, p, bytes, &w.handle, NCCL_WIN_COLL_SYMMETRIC);
  if (reg != ncclSuccess) {
    (void)ncclMemFree(p);
    nccl_check(reg, "ncclCommWindowRegister", nccl_);
  }
  windows_owned_.push_back(w);
  cuda_check(cudaMemset(p, 0, bytes), "cudaMemset (symmetric window)");
  return p;
}

void* NcclCommunicator::scratch_alloc(size_t bytes) {
  if (void* p = window_alloc(bytes)) return p;
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes), "cudaMalloc (argmax scratch)");
  cuda_scratch_.push_back(p);  // freed with the communicator (queued work or a captured graph may use it)
  return p;
}

Tensor NcclCommunicator::alloc_collective(DType dtype, const Shape& shape) {
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  // As CudaBackend::alloc: at least 256 bytes, so vector loads past a row end stay inside the buffer.
  t.data = window_alloc(std::max<size_t>(256, t.nbytes()));
  return t.data != nullptr ? t : Tensor{};  // no owner: the communicator frees its windows
}

PeerBuffer NcclCommunicator::alloc_peer_buffer(DType dtype, const Shape& shape) {
  if (!peer_sums_) return {};
  Tensor t;
  t.dtype = dtype;
  t.shape = shape;
  const size_t data = (std::max<size_t>(256, t.nbytes()) + 255) / 256 * 256;  // then the two words
  void* mine = nullptr;
  cudaIpcMemHandle_t handle{};
  cudaError_t rc = cudaMalloc(&mine, data + 256);
  if (rc == cudaSuccess) rc = cudaMemsetAsync(mine, 0, data + 256, stream_);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream_);
  if (rc == cudaSuccess) rc = cudaIpcGetMemHandle(&handle, mine);
  std::vector<cudaIpcMemHandle_t> all(2);
  host_.all_gather(&handle, all.data(), sizeof(handle));
  void* peer = nullptr;
  if (rc == cudaSuccess)
    rc = cudaIpcOpenMemHandle(&peer, all[static_cast<size_t>(1 - rank())], cudaIpcMemLazyEnablePeerAccess);
  if (host_.any(rc != cudaSuccess)) {  // agreed: every rank falls back to all_reduce_sum
    if (peer != nullptr) (void)cudaIpcCloseMemHandle(peer);
    if (mine != nullptr) (void)cudaFree(mine);
    (void)cudaGetLastError();
    peer_sums_ = false;
    return {};
  }
  host_.barrier();  // both zero-filled before either kernel can signal
  peer_mappings_.push_back({mine, peer});
  PeerBuffer s;
  t.data = mine;  // no owner: the communicator frees it
  s.mine = t;
  s.peer = peer;
  s.signal_peer = reinterpret_cast<uint32_t*>(static_cast<char*>(peer) + data);
  s.flag = reinterpret_cast<uint32_t*>(static_cast<char*>(mine) + data);
  s.arrivals = s.flag + 1;
  s.rank = rank();
  return s;
}

void NcclCommunicator::reserve_records(int64_t records) {
  const size_t bytes = static_cast<size_t>(records) * sizeof(Top2) * static_cast<size_t>(size());
  if (bytes <= scratch_bytes_) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    fail(
        "argmax_exchange: {} records per rank exceed the scratch of {} during a CUDA graph capture; call "
        "reserve_records first",
        records, scratch_bytes_ / sizeof(Top2) / static_cast<size_t>(size()));
  // Queued work or a captured graph may still use the old buffer: every one lives as long as the
  // communicator.
  scratch_ = scratch_alloc(bytes);
  scratch_bytes_ = bytes;
}

void NcclCommunicator::all_reduce_sum(const Tensor& partial) {
  if (partial.dtype != DType::f32) fail("all_reduce_sum: f32 only, got {}", dtype_name(partial.dtype));
  if (size() == 1 || partial.numel() == 0) return;  // the sum of one rank's partial is itself
  // Identical bits on every rank: NCCL's ring algorithm reduces each chunk once (reduce-scatter) and copies
  // the result to every rank (all-gather); the tree algorithm reduces at the root and broadcasts. Either way
  // one fp32 result per element is computed and replicated, never re-summed per rank. NVLS is off (see the
  // constructor). The order differs from MpiCommunicator's rank order: tp = N matches tp = 1 within rounding.
  nccl_check(ncclAllReduce(partial.data, partial.data, static_cast<size_t>(partial.numel()), ncclFloat,
                           ncclSum, nccl_, stream_),
             "ncclAllReduce", nccl_);
}

void NcclCommunicator::argmax_exchange(const Tensor& cand) {
  if (cand.nbytes() % sizeof(Top2) != 0)
    fail("argmax_exchange: {} bytes is not a whole number of Top2 records", cand.nbytes());
  const int64_t B = static_cast<int64_t>(cand.nbytes() / sizeof(Top2));
  if (size() == 1 || B == 0) return;  // merging one record with nothing leaves it as it is
  reserve_records(B);
  // Every rank's records in rank order, then the same fold as MpiCommunicator (merge_top2) on the device.
  nccl_check(ncclAllGather(cand.data, scratch_, static_cast<size_t>(B) * sizeof(Top2) / sizeof(int32_t),
                           ncclInt32, nccl_, stream_),
             "ncclAllGather", nccl_);
  detail::launch_merge_top2(static_cast<const Top2*>(scratch_), static_cast<Top2*>(cand.data), B, size(),
                            stream_);
  cuda_check(cudaGetLastError(), "launch of the Top2 merge kernel");
}

}  // namespace dspark
