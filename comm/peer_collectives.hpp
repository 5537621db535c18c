// The collectives of IpcCommunicator on device tensors, run over an exchange point in peer memory
// (comm/peer_memory.hpp) that already holds this rank's copy: the rank-order sum and the rank-order
// merge_markov fold of every rank's buffer into `out`, after the handshake of comm/peer_handshake.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "lib/core/markov_record.hpp"
#include "lib/core/peer_view.hpp"

namespace dspark::detail {

cudaError_t launch_peer_sum(const PeerView& peers, float* out, int64_t n, cudaStream_t stream);
cudaError_t launch_peer_merge_records(const PeerView& peers, MarkovRecord* out, int64_t B,
                                      cudaStream_t stream);

}  // namespace dspark::detail
