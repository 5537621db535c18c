#include "comm/nccl_communicator.hpp"

#include <algorithm>
#include <cstdlib>

#include "lib/core/error.hpp"

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

NcclCommunicator::NcclCommunicator(MPI_Comm comm, cudaStream_t stream, const Tuning& tuning,
                                   std::chrono::milliseconds exchange_timeout)
    : host_(comm), stream_(stream) {
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
  if (size() > 1 && size() <= kMaxPeerRanks && tuning.peer_sum && host_.one_host())
    peers_ = std::make_unique<PeerMemory>(host_, stream_, exchange_timeout);
  reserve_records(kInitialRecords);
}

NcclCommunicator::~NcclCommunicator() {
  // Destructors must not throw: errors at teardown are ignored.
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  peers_.reset();
  if (nccl_ != nullptr) (void)ncclCommDestroy(nccl_);
  for (void* p : cuda_scratch_) (void)cudaFree(p);
}

Exchange NcclCommunicator::make_exchange(const Tensor& local) {
  if (!peers_ || peer_refused_) return Exchange(*this, local);
  std::optional<PeerView> v = peers_->allocate(local.nbytes());
  if (!v) {  // agreed on every rank: this point and every later one through NCCL
    peer_refused_ = true;
    return Exchange(*this, local);
  }
  return peer_exchange(*this, local, *v);
}

void NcclCommunicator::reserve_records(int64_t records) {
  const size_t bytes = static_cast<size_t>(records) * sizeof(MarkovRecord) * static_cast<size_t>(size());
  if (bytes <= scratch_bytes_) return;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cuda_check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
  if (capture != cudaStreamCaptureStatusNone)
    fail(
        "argmax_exchange: {} records per rank exceed the scratch of {} during a CUDA graph capture; call "
        "reserve_records first",
        records, scratch_bytes_ / sizeof(MarkovRecord) / static_cast<size_t>(size()));
  // Queued work or a captured graph may still use the old buffer: every one lives as long as the
  // communicator.
  void* p = nullptr;
  cuda_check(cudaMalloc(&p, bytes), "cudaMalloc (argmax scratch)");
  cuda_scratch_.push_back(p);
  scratch_ = p;
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
  if (cand.nbytes() % sizeof(MarkovRecord) != 0)
    fail("argmax_exchange: {} bytes is not a whole number of Markov records", cand.nbytes());
  const int64_t B = static_cast<int64_t>(cand.nbytes() / sizeof(MarkovRecord));
  if (size() == 1 || B == 0) return;  // merging one record with nothing leaves it as it is
  reserve_records(B);
  // Every rank's records in rank order, then the same fold as MpiCommunicator (merge_markov) on the device.
  nccl_check(
      ncclAllGather(cand.data, scratch_, static_cast<size_t>(B) * sizeof(MarkovRecord) / sizeof(int32_t),
                    ncclInt32, nccl_, stream_),
      "ncclAllGather", nccl_);
  detail::launch_merge_records(static_cast<const MarkovRecord*>(scratch_),
                               static_cast<MarkovRecord*>(cand.data), B, size(), stream_);
  cuda_check(cudaGetLastError(), "launch of the MarkovRecord merge kernel");
}

}  // namespace dspark
