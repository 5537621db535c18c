// The all-reduce of a tp = 2 group read directly by a kernel (NcclCommunicator::alloc_peer_sum): this rank's
// f32 partial, the peer's mapped into this process (CUDA IPC, over NVLink), and the words of the handshake.
// Plain device pointers, so that the model can hand them to the backend's fused op.
#pragma once

#include <cstdint>

#include "core/tensor.hpp"

namespace dspark {

struct PeerSum {
  Tensor mine;                      // this rank's partial (the op reads its first rows)
  const float* peer = nullptr;      // the peer's partial, the same shape
  uint32_t* signal_peer = nullptr;  // the peer's flag word, mapped here: "my partial is complete"
  uint32_t* flag = nullptr;         // this rank's flag word, set by the peer
  uint32_t* arrivals = nullptr;     // this rank's count of the op's finished blocks
  int rank = 0;                     // 0 or 1: the sum is taken in rank order
  bool empty() const { return peer == nullptr; }
};

}  // namespace dspark
