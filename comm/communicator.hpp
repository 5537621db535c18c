// What crosses ranks (SPEC §5): fp32 all-reduces whose result has identical bits on every rank, the Markov
// argmax exchange, and broadcasts of host-side control data (the step plan, context rows). Tensors are in the
// memory of the backend the communicator was made for.
#pragma once

#include <cstddef>

#include "lib/core/peer_buffer.hpp"
#include "lib/core/tensor.hpp"

namespace dspark {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place on an f32 tensor: every rank ends with the sum over ranks, the same bits everywhere.
  virtual void all_reduce_sum(const Tensor& partial) = 0;
  // In place on Top2 records (i32 [B, 4]): every rank ends with, per request, the global best (ties to the
  // lower vocabulary id) and the global second-best value.
  virtual void argmax_exchange(const Tensor& cand) = 0;
  // A zero-filled tensor that a kernel on either GPU of a tp = 2 group on one host reads directly, for the
  // fused exchanges that replace all_reduce_sum (Backend::peer_sum_hc_expand) and argmax_exchange
  // (Backend::markov_peer_commit); empty where the communicator has no such path. Collective: every rank asks
  // for the same shapes in the same order. The memory lives as long as the communicator. A PeerBuffer serves
  // one exchange at a time: consecutive exchanges alternate between two
  // (a rank writes a buffer again only after the other one's exchange, which its peer enters only once it has
  // finished reading the first).
  virtual PeerBuffer alloc_peer_buffer(DType /*dtype*/, const Shape& /*shape*/) { return {}; }
  // Host memory: root's bytes to every rank.
  virtual void broadcast(void* data, size_t bytes, int root) = 0;
  // Host memory: every rank's `bytes` bytes, in rank order, into all (size() * bytes).
  virtual void all_gather(const void* mine, void* all, size_t bytes) = 0;
  // True on every rank when `flag` is true on any rank (a step's failure, seen by all).
  virtual bool any(bool flag) = 0;
  virtual void barrier() = 0;
};

// One rank: nothing to exchange.
class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_reduce_sum(const Tensor&) override {}
  void argmax_exchange(const Tensor&) override {}
  void broadcast(void*, size_t, int) override {}
  void all_gather(const void* mine, void* all, size_t bytes) override;
  bool any(bool flag) override { return flag; }
  void barrier() override {}
};

}  // namespace dspark
