// The Communicator of CUDA ranks that share GPUs (SPEC §5's emulation: N ranks, one process each, on fewer
// GPUs than ranks, as the tests run tp = 2 and 4 on one GPU). NCCL refuses two ranks on one device, so MPI
// carries the bootstrap and the host-memory collectives, and every device exchange goes through peer memory
// over CUDA IPC (comm/peer_memory.hpp): the Drafter's exchange points are read inside its kernels, and
// all_reduce_sum / argmax_exchange on any other tensor copy it into a peer buffer first. The bits are those
// of the same N on N GPUs through peer memory; the timings mean nothing (ranks take turns on the GPU:
// about 2 ms per handshake under time-slicing, microseconds under MPS).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <memory>

#include "comm/communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/peer_memory.hpp"

namespace dspark {

class IpcCommunicator final : public Communicator {
 public:
  // Collective over `comm` (every rank on this host). Fails, naming the cause, when the ranks cannot map each
  // other's memory.
  IpcCommunicator(MPI_Comm comm, cudaStream_t stream, std::chrono::milliseconds exchange_timeout);
  ~IpcCommunicator() override;
  IpcCommunicator(const IpcCommunicator&) = delete;
  IpcCommunicator& operator=(const IpcCommunicator&) = delete;

  int rank() const override { return host_.rank(); }
  int size() const override { return host_.size(); }
  void all_reduce_sum(const Tensor& partial) override;
  void argmax_exchange(const Tensor& cand) override;
  Exchange make_exchange(const Tensor& local) override;
  bool exchanges_may_time_out() const override { return size() > 1; }
  void check_exchanges() override { peers_->check(); }
  void reset_exchanges() override { peers_->reset(); }
  void broadcast(void* data, size_t bytes, int root) override { host_.broadcast(data, bytes, root); }
  void all_gather(const void* mine, void* all, size_t bytes) override { host_.all_gather(mine, all, bytes); }
  bool any(bool flag) override { return host_.any(flag); }
  void barrier() override { host_.barrier(); }

 private:
  // The scratch point for the next collective on a tensor of `bytes` (collective: grown on every rank
  // alike, never during a graph capture); the two points are used in turn.
  const PeerView& scratch_for(size_t bytes);
  MpiCommunicator host_;
  cudaStream_t stream_;
  std::unique_ptr<PeerMemory> peers_;
  PeerView scratch_[2];
  size_t scratch_bytes_ = 0;
  int turn_ = 0;
};

}  // namespace dspark
