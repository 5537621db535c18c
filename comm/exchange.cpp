#include "comm/exchange.hpp"

#include "comm/communicator.hpp"
#include "lib/core/error.hpp"

namespace dspark {

void Exchange::all_reduce_sum(const Tensor& part) const {
  if (comm_ == nullptr) fail("all_reduce_sum on an exchange no communicator made");
  comm_->all_reduce_sum(part);
}

void Exchange::argmax_exchange(const Tensor& part) const {
  if (comm_ == nullptr) fail("argmax_exchange on an exchange no communicator made");
  comm_->argmax_exchange(part);
}

Exchange peer_exchange(Communicator& comm, const Tensor& local, const PeerView& peers) {
  Tensor t = local;
  t.data = const_cast<void*>(peers.buffers[peers.rank]);
  t.owner.reset();
  return Exchange(comm, t, peers);
}

}  // namespace dspark
