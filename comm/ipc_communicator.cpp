#include "comm/ipc_communicator.hpp"

#include "comm/peer_collectives.hpp"
#include "lib/core/error.hpp"

namespace dspark {
namespace {

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) fail("CUDA {} failed: {}", what, cudaGetErrorString(rc));
}

// Scratch per point before any tensor asked for more: a draft step's partials at the worker's batches.
constexpr size_t kInitialScratch = size_t{4} << 20;

}  // namespace

IpcCommunicator::IpcCommunicator(MPI_Comm comm, cudaStream_t stream,
                                 std::chrono::milliseconds exchange_timeout)
    : host_(comm), stream_(stream) {
  if (!host_.one_host())
    fail("ranks that share GPUs must all run on one host (CUDA IPC): this job spans several hosts");
  peers_ = std::make_unique<PeerMemory>(host_, stream_, exchange_timeout);
  (void)scratch_for(kInitialScratch);
}

IpcCommunicator::~IpcCommunicator() = default;

const PeerView& IpcCommunicator::scratch_for(size_t bytes) {
  if (bytes > scratch_bytes_) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    cuda_check(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing");
    if (capture != cudaStreamCaptureStatusNone)
      fail("a collective of {} bytes exceeds the peer scratch of {} bytes during a CUDA graph capture", bytes,
           scratch_bytes_);
    // Queued work or a recorded graph may still use the old points: they live as long as the communicator.
    const size_t grown = std::max(bytes, 2 * scratch_bytes_);
    for (PeerView& s : scratch_) {
      std::optional<PeerView> v = peers_->allocate(grown);
      if (!v) fail("ranks share a GPU but cannot map each other's memory over CUDA IPC");
      s = *v;
    }
    scratch_bytes_ = grown;
  }
  const PeerView& s = scratch_[turn_];
  turn_ ^= 1;
  return s;
}

void IpcCommunicator::all_reduce_sum(const Tensor& partial) {
  if (partial.dtype != DType::f32) fail("all_reduce_sum: f32 only, got {}", dtype_name(partial.dtype));
  if (size() == 1 || partial.numel() == 0) return;
  const PeerView& s = scratch_for(partial.nbytes());
  cuda_check(cudaMemcpyAsync(const_cast<void*>(s.buffers[s.rank]), partial.data, partial.nbytes(),
                             cudaMemcpyDeviceToDevice, stream_),
             "cudaMemcpyAsync (peer all-reduce)");
  cuda_check(detail::launch_peer_sum(s, partial.as<float>(), partial.numel(), stream_),
             "launch of the peer all-reduce");
}

void IpcCommunicator::argmax_exchange(const Tensor& cand) {
  if (cand.nbytes() % sizeof(MarkovRecord) != 0)
    fail("argmax_exchange: {} bytes is not a whole number of Markov records", cand.nbytes());
  const auto B = static_cast<int64_t>(cand.nbytes() / sizeof(MarkovRecord));
  if (size() == 1 || B == 0) return;
  const PeerView& s = scratch_for(cand.nbytes());
  cuda_check(cudaMemcpyAsync(const_cast<void*>(s.buffers[s.rank]), cand.data, cand.nbytes(),
                             cudaMemcpyDeviceToDevice, stream_),
             "cudaMemcpyAsync (peer argmax exchange)");
  cuda_check(detail::launch_peer_merge_records(s, static_cast<MarkovRecord*>(cand.data), B, stream_),
             "launch of the peer argmax merge");
}

Exchange IpcCommunicator::make_exchange(const Tensor& local) {
  if (size() == 1) return Exchange(*this, local);
  std::optional<PeerView> v = peers_->allocate(local.nbytes());
  if (!v) fail("ranks share a GPU but cannot map each other's memory over CUDA IPC");
  return peer_exchange(*this, local, *v);
}

}  // namespace dspark
