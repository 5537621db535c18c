// Exchange points in peer memory for the ranks of one host (SPEC §5's fast path, and the only path when
// ranks share a GPU): each point is one cudaMalloc per rank (the buffer, then the handshake's words),
// exported over CUDA IPC and mapped by every other rank, so that a kernel on any rank reads every rank's
// buffer (over NVLink, or on the same GPU) and their arrival words tell it which are complete. Also the words
// a wait that gave up marks (comm/peer_handshake.cuh), and their check and reset after a failed step.
#pragma once

#include <cuda_runtime.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "comm/mpi_communicator.hpp"
#include "lib/core/peer_view.hpp"

namespace dspark {

class PeerMemory {
 public:
  // Collective over `host` (every rank on one host, at most kMaxPeerRanks). Kernels give up waiting for a
  // peer after `timeout`. Memory is zero-filled on `stream`.
  PeerMemory(MpiCommunicator& host, cudaStream_t stream, std::chrono::milliseconds timeout);
  ~PeerMemory();
  PeerMemory(const PeerMemory&) = delete;
  PeerMemory& operator=(const PeerMemory&) = delete;

  // Collective: a zero-filled buffer of `bytes` on every rank, every other rank's mapped here. Nothing on
  // every rank when any rank cannot map its peers' (no CUDA IPC between these devices).
  std::optional<PeerView> allocate(size_t bytes);
  // Throws ExchangeTimeout naming the ranks some kernel waited for in vain since the last reset.
  void check() const;
  // Collective: waits for this rank's device work, then every point's epochs and the missed words back to
  // zero on every rank, between two barriers (no rank's kernel can touch them meanwhile).
  void reset();
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  struct Point {
    void* mine = nullptr;      // cudaMalloc'ed here, exported
    size_t words_at = 0;       // offset of the handshake's words
    std::vector<void*> peers;  // every rank's, opened here (this rank's own: mine, not opened)
  };
  MpiCommunicator& host_;
  cudaStream_t stream_;
  std::chrono::milliseconds timeout_;
  uint32_t* missed_ = nullptr;       // device word: non-zero once a wait gave up
  uint32_t* missed_host_ = nullptr;  // host-mapped: [kMaxPeerRanks], rank s waited for in vain
  std::vector<Point> points_;
};

}  // namespace dspark
