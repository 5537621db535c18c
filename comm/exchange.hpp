// One exchange point of the draft step (SPEC §5): the buffer a rank writes its partial (or its argmax
// records) into, and how the ranks' buffers are combined by the op that consumes them
// (Backend::sum_and_expand, Backend::commit_markov). Made by Communicator::make_exchange. By default the op
// runs the communicator's collective (all_reduce_sum / argmax_exchange) on the buffer and then itself; where
// the communicator put the buffers in peer memory (peers() non-null), a backend with peer kernels reads every
// rank's buffer inside the op instead, with the same bits. A view: the communicator owns the peer memory.
#pragma once

#include <optional>

#include "lib/core/peer_view.hpp"
#include "lib/core/tensor.hpp"

namespace dspark {

class Communicator;

class Exchange {
 public:
  Exchange() = default;
  Exchange(Communicator& comm, Tensor buffer, std::optional<PeerView> peers = std::nullopt)
      : comm_(&comm), buffer_(std::move(buffer)), peers_(peers) {}

  // This rank's buffer: the producing op writes its leading rows, then the consuming op combines them.
  const Tensor& buffer() const { return buffer_; }
  // Every rank's buffer in peer memory, or null: the default path.
  const PeerView* peers() const { return peers_ ? &*peers_ : nullptr; }
  // The default path: the communicator's collective, in place on (the leading rows of) the buffer.
  void all_reduce_sum(const Tensor& part) const;
  void argmax_exchange(const Tensor& part) const;

 private:
  Communicator* comm_ = nullptr;
  Tensor buffer_;
  std::optional<PeerView> peers_;
};

// The exchange point of `local` (its shape and dtype) whose buffer is this rank's in `peers` (owned by the
// communicator that mapped it).
Exchange peer_exchange(Communicator& comm, const Tensor& local, const PeerView& peers);

}  // namespace dspark
