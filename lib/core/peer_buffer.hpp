// A tensor of a tp = 2 group that a kernel on either GPU reads directly
// (NcclCommunicator::alloc_peer_buffer): this rank's, the peer's mapped into this process (CUDA IPC, over
// NVLink), and the words of the handshake that tells a kernel the peer's is complete. Plain device pointers,
// so that the model can hand them to the backend's fused ops (the all-reduce inside the expand, the argmax
// exchange inside the Markov commit).
#pragma once

#include <cstdint>

#include "lib/core/tensor.hpp"

namespace dspark {

struct PeerBuffer {
  Tensor mine;                      // this rank's tensor
  const void* peer = nullptr;       // the peer's, the same dtype and shape
  uint32_t* signal_peer = nullptr;  // the peer's flag word, mapped here: "mine is complete"
  uint32_t* flag = nullptr;         // this rank's flag word, set by the peer
  uint32_t* arrivals = nullptr;     // this rank's count of the op's finished blocks
  int rank = 0;                     // 0 or 1: what is combined is combined in rank order
  bool empty() const { return peer == nullptr; }
};

}  // namespace dspark
