// Plain launches (no programmatic dependent launch): each follows the copy of this rank's tensor into its
// peer buffer in stream order.
#include "comm/peer_collectives.hpp"

#include <algorithm>

#include "comm/peer_handshake.cuh"

namespace dspark::detail {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

unsigned blocks_for(int64_t n) {
  return static_cast<unsigned>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

__global__ void peer_sum_kernel(const __grid_constant__ PeerView peers, float* out, int64_t n) {
  peer::peer_arrive(peers);
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[i] = peer::rank_order_sum(peers, i);
  peer::peer_depart(peers);
}

__global__ void peer_merge_records_kernel(const __grid_constant__ PeerView peers, MarkovRecord* out,
                                          int64_t B) {
  peer::peer_arrive(peers);
  for (int64_t b = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; b < B;
       b += static_cast<int64_t>(gridDim.x) * blockDim.x)
    out[b] = peer::rank_order_merge(peers, b);
  peer::peer_depart(peers);
}

}  // namespace

cudaError_t launch_peer_sum(const PeerView& peers, float* out, int64_t n, cudaStream_t stream) {
  peer_sum_kernel<<<blocks_for(n), kThreads, 0, stream>>>(peers, out, n);
  return cudaGetLastError();
}

cudaError_t launch_peer_merge_records(const PeerView& peers, MarkovRecord* out, int64_t B,
                                      cudaStream_t stream) {
  peer_merge_records_kernel<<<blocks_for(B), kThreads, 0, stream>>>(peers, out, B);
  return cudaGetLastError();
}

}  // namespace dspark::detail
