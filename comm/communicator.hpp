// What crosses ranks (SPEC §5): fp32 all-reduces whose result has identical bits on every rank, the Markov
// argmax exchange, and broadcasts of host-side control data (the step plan, context rows). Tensors are in the
// memory of the backend the communicator was made for.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "comm/exchange.hpp"
#include "lib/core/error.hpp"
#include "lib/core/tensor.hpp"

namespace dspark {

// A peer exchange gave up waiting for a rank (health.exchange_timeout_ms): the step failed on this rank, the
// communicator and the ranks that are still running are intact (Communicator::reset_exchanges).
class ExchangeTimeout : public Error {
 public:
  explicit ExchangeTimeout(const std::string& what) : Error(what) {}
};

// How long a peer kernel waits for a rank by default (health.exchange_timeout_ms).
inline constexpr std::chrono::milliseconds kDefaultExchangeTimeout{10000};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In place on an f32 tensor: every rank ends with the sum over ranks, the same bits everywhere.
  virtual void all_reduce_sum(const Tensor& partial) = 0;
  // In place on MarkovRecords (i32 [B, kMarkovRecordWords]): every rank ends with, per request, the ranks'
  // records folded with merge_markov in rank order (the global top-2, ties to the lower vocabulary id, and
  // the global draw with its merged normaliser), the same bits everywhere.
  virtual void argmax_exchange(const Tensor& cand) = 0;
  // The exchange point whose buffer is `local` (a tensor of the backend's, the shape of the largest
  // exchange): a communicator with peer memory puts the buffer there instead (Exchange::peers), others keep
  // `local`. Collective: every rank asks for the same shapes in the same order. Peer memory lives as long as
  // the communicator. A peer buffer serves one exchange at a time: a rank writes it again only after at least
  // one other exchange point's exchange (each rank enters that one only after it has finished reading this),
  // so consecutive exchanges must not use the same point twice in a row.
  virtual Exchange make_exchange(const Tensor& local) { return Exchange(*this, local); }
  // Whether an exchange can give up on a late rank (ExchangeTimeout): the same answer on every rank.
  virtual bool exchanges_may_time_out() const { return false; }
  // Throws ExchangeTimeout, naming the ranks, when a peer exchange since the last reset gave up waiting for
  // one; call it once the device work queued since then has finished.
  virtual void check_exchanges() {}
  // Collective, after a step that failed on any rank (and with no device work of the communicator's left in
  // flight on any rank): every exchange point back to its first use, nothing marked missing.
  virtual void reset_exchanges() {}
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
