// The Communicator of the CUDA backend (SPEC §5-§6): device tensors cross ranks with NCCL on the backend's
// stream, and nothing in all_reduce_sum / argmax_exchange waits on the host, so a draft step that calls them
// can be captured in a CUDA graph. Host-memory collectives (step plans, failure agreement) go over MPI, which
// also bootstraps NCCL.
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "comm/communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/peer_memory.hpp"
#include "lib/core/markov_record.hpp"
#include "lib/core/tensor.hpp"
#include "lib/core/tuning.hpp"

namespace dspark {

class NcclCommunicator final : public Communicator {
 public:
  // Collective over `comm`: every rank constructs it at the same time. The NCCL communicator is bound to the
  // GPU of `stream` (the current device for the null stream), on which every collective is then issued.
  // Of `tuning` it reads peer_sum (make_exchange); peer kernels give up waiting for a rank after
  // `exchange_timeout`. Sets NCCL_NVLS_ENABLE=0 unless the environment already sets it.
  NcclCommunicator(MPI_Comm comm, cudaStream_t stream, const Tuning& tuning = {},
                   std::chrono::milliseconds exchange_timeout = kDefaultExchangeTimeout);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void all_reduce_sum(const Tensor& partial) override;
  void argmax_exchange(const Tensor& cand) override;
  // With every rank on one host and Tuning::peer_sum: the exchange point in peer memory (CUDA IPC between
  // the processes, comm/peer_memory.hpp). `local` (NCCL's collectives) on every rank when any rank cannot
  // map its peers' (peer memory is then off for good).
  Exchange make_exchange(const Tensor& local) override;
  bool exchanges_may_time_out() const override { return peers_ != nullptr; }
  void check_exchanges() override {
    if (peers_) peers_->check();
  }
  void reset_exchanges() override {
    if (peers_) peers_->reset();
  }
  void broadcast(void* data, size_t bytes, int root) override { host_.broadcast(data, bytes, root); }
  void all_gather(const void* mine, void* all, size_t bytes) override { host_.all_gather(mine, all, bytes); }
  bool any(bool flag) override { return host_.any(flag); }
  // Host-side only: does not wait for work queued on the stream.
  void barrier() override { host_.barrier(); }

  // Sizes argmax_exchange's device scratch for batches of up to `records` requests. Call it before capturing
  // a graph with a larger batch than any run eagerly so far: memory cannot be allocated during a capture.
  void reserve_records(int64_t records);

 private:
  MpiCommunicator host_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t nccl_ = nullptr;
  void* scratch_ = nullptr;  // argmax_exchange: every rank's records, [size, B] MarkovRecord
  size_t scratch_bytes_ = 0;
  std::vector<void*> cuda_scratch_;    // every cudaMalloc scratch buffer (the current one too), freed with it
  std::unique_ptr<PeerMemory> peers_;  // null: NCCL's collectives for every exchange
  bool peer_refused_ = false;          // a point could not be mapped: later points use NCCL
};

namespace detail {
// out[b] = the rank-ordered merge_markov fold of gathered[r * B + b], r = 0..ranks-1, on `stream`.
void launch_merge_records(const MarkovRecord* gathered, MarkovRecord* out, int64_t B, int ranks,
                          cudaStream_t stream);
}  // namespace detail

}  // namespace dspark
