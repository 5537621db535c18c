// A communicator for measuring what a draft step's exchanges cost it (dspark_bench --exchange-cost): the step
// with each exchange (the per-stage sums, the Markov argmax exchanges) replaced by a local copy of the result
// the real exchange gave. First it learns: every exchange runs the wrapped communicator's collective and
// keeps a copy of its result. Then the same calls copy those results back in place, and cross no rank. A step
// with the same inputs computes the same bits either way; what it no longer pays is the collectives, the
// waits for the other ranks and the peer kernels' handshakes and remote reads.
//
// A kept result is found by the call's place in its step: the n-th sum since the last argmax exchange, the
// n-th argmax exchange since the last sum (a step sums first, then exchanges per position), and the tensor's
// dtype and shape. Host-side calls (broadcast, all_gather, any, barrier) go to the wrapped communicator.
#pragma once

#include <cstdint>
#include <map>
#include <tuple>

#include "comm/communicator.hpp"
#include "lib/model/backend.hpp"

namespace dspark::bench {

class LocalExchangeCommunicator final : public Communicator {
 public:
  enum class Mode {
    learn,  // the wrapped communicator's collective, its result kept
    local,  // the kept result copied in, nothing crosses ranks
  };
  // `inner` and `backend` (where the results are kept and copied) outlive this.
  LocalExchangeCommunicator(Communicator& inner, Backend& backend) : inner_(inner), be_(backend) {}

  // The next call is the first of a step.
  void set_mode(Mode m) {
    mode_ = m;
    last_ = Kind::argmax;
    nth_ = 0;
  }
  Mode mode() const { return mode_; }
  // Exchanges the wrapped communicator ran (learn) and local copies made (local) since construction.
  int64_t learned() const { return learned_; }
  int64_t copied() const { return copied_; }

  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  // Throws, naming the call, in local mode where no result of its place and shape was learned.
  void all_reduce_sum(const Tensor& partial) override;
  void argmax_exchange(const Tensor& cand) override;
  // The default exchange point (no peer memory): the step's ops call the two methods above.
  void broadcast(void* data, size_t bytes, int root) override { inner_.broadcast(data, bytes, root); }
  void all_gather(const void* mine, void* all, size_t bytes) override { inner_.all_gather(mine, all, bytes); }
  bool any(bool flag) override { return inner_.any(flag); }
  void barrier() override { inner_.barrier(); }

 private:
  enum class Kind { sum, argmax };
  // (kind, n-th of its kind in the step, dtype, shape)
  using Key = std::tuple<Kind, int64_t, DType, Shape>;
  void exchange(Kind kind, const Tensor& t);

  Communicator& inner_;
  Backend& be_;
  Mode mode_ = Mode::learn;
  std::map<Key, Tensor> kept_;
  Kind last_ = Kind::argmax;  // the kind of the last call (a step's first sum is its sum 0)
  int64_t nth_ = 0;           // its place among the calls of its kind since the other kind's last call
  int64_t learned_ = 0, copied_ = 0;
};

}  // namespace dspark::bench
