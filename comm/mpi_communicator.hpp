// The Communicator over MPI for the CPU backend (host memory). Reductions are computed the same way on every
// rank from all ranks' inputs gathered in rank order, so every rank holds identical bits whatever MPI's
// reduction algorithm would have done.
#pragma once

#include <mpi.h>

#include <vector>

#include "comm/communicator.hpp"

namespace dspark {

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm);
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_reduce_sum(const Tensor& partial) override;
  void argmax_exchange(const Tensor& cand) override;
  void broadcast(void* data, size_t bytes, int root) override;
  void all_gather(const void* mine, void* all, size_t bytes) override;
  bool any(bool flag) override;
  void barrier() override;
  // Collective: whether every rank runs on this host (peer memory joins only such ranks).
  bool one_host() const;

 private:
  void wait_idle_friendly(MPI_Request& req);
  MPI_Comm comm_;
  int rank_ = 0;
  int size_ = 1;
  std::vector<char> gathered_;
};

// MPI's lifetime for a process: MPI_Init_thread on construction, MPI_Finalize on destruction.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int rank() const { return rank_; }
  int size() const { return size_; }
  int local_rank() const { return local_rank_; }  // rank among the processes of this host (GPU choice)

 private:
  int rank_ = 0, size_ = 1, local_rank_ = 0;
};

}  // namespace dspark
