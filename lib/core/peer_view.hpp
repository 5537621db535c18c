// The ranks' buffers of one exchange point in peer memory (SPEC §5's fast path on one host), as a kernel
// sees them: every rank's buffer mapped into this process (CUDA IPC), the words of the handshake that tell
// a kernel a peer's buffer is complete, and where a wait that gave up is reported. Plain pointers, passed to
// kernels by value (comm/peer_handshake.cuh).
#pragma once

#include <cstdint>

namespace dspark {

// The most ranks one host's peer memory joins (the GPUs of one node).
inline constexpr int kMaxPeerRanks = 8;

struct PeerView {
  // Every rank's buffer in rank order, this rank's own at [rank]: what is combined is combined in this
  // order, so every rank computes the same bits.
  const void* buffers[kMaxPeerRanks] = {};
  // Rank s's arrival words mapped here: this rank publishes "mine is complete for epoch e" as e at
  // signal[s][rank].
  uint32_t* signal[kMaxPeerRanks] = {};
  uint32_t* arrived = nullptr;  // this rank's arrival words [kMaxPeerRanks]: [s] = rank s's last epoch
  uint32_t* state = nullptr;    // this rank's [epoch of the last exchange, blocks of the current one done]
  // Shared by the communicator's exchanges: a word in device memory (non-zero once a wait gave up, so later
  // exchanges of the failed step do not wait again) and one per rank in host-mapped memory (rank s waited for
  // in vain), read by the host after the step.
  uint32_t* missed = nullptr;
  uint32_t* missed_host = nullptr;
  uint64_t timeout_ns = 0;  // how long a kernel waits for a peer before it gives up
  int rank = 0, ranks = 1;
};

}  // namespace dspark
