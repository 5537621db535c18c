#include "comm/peer_memory.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <string>

#include "comm/communicator.hpp"
#include "lib/core/error.hpp"

namespace dspark {
namespace {

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) fail("CUDA {} failed: {}", what, cudaGetErrorString(rc));
}

constexpr size_t kAlign = 256;
// After the buffer: the arrival words [kMaxPeerRanks], then the state [epoch, blocks done].
constexpr size_t kWordsBytes = kAlign;
constexpr size_t kStateWord = kMaxPeerRanks;

size_t round_up(size_t n) {
  return (std::max<size_t>(n, 1) + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

PeerMemory::PeerMemory(MpiCommunicator& host, cudaStream_t stream, std::chrono::milliseconds timeout)
    : host_(host), stream_(stream), timeout_(timeout) {
  if (host_.size() > kMaxPeerRanks)
    fail("peer memory joins at most {} ranks, this job has {}", kMaxPeerRanks, host_.size());
  cuda_check(cudaMalloc(&missed_, sizeof(uint32_t)), "cudaMalloc (peer missed word)");
  cuda_check(cudaMemsetAsync(missed_, 0, sizeof(uint32_t), stream_), "cudaMemsetAsync");
  cuda_check(cudaHostAlloc(&missed_host_, kMaxPeerRanks * sizeof(uint32_t), cudaHostAllocMapped),
             "cudaHostAlloc (peer missed words)");
  std::fill_n(missed_host_, kMaxPeerRanks, 0u);
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
}

PeerMemory::~PeerMemory() {
  // Destructors must not throw: errors at teardown are ignored. A peer may still read this rank's exported
  // buffers: every rank closes its mappings, then frees.
  (void)cudaDeviceSynchronize();
  for (const Point& p : points_)
    for (void* q : p.peers)
      if (q != p.mine && q != nullptr) (void)cudaIpcCloseMemHandle(q);
  if (!points_.empty()) {
    try {
      host_.barrier();
    } catch (...) {  // a peer gone: free anyway
    }
  }
  for (const Point& p : points_) (void)cudaFree(p.mine);
  (void)cudaFree(missed_);
  (void)cudaFreeHost(missed_host_);
}

std::optional<PeerView> PeerMemory::allocate(size_t bytes) {
  const int ranks = host_.size(), rank = host_.rank();
  Point p;
  p.words_at = round_up(bytes);
  const size_t total = p.words_at + kWordsBytes;
  cudaIpcMemHandle_t handle{};
  cudaError_t rc = cudaMalloc(&p.mine, total);
  if (rc == cudaSuccess) rc = cudaMemsetAsync(p.mine, 0, total, stream_);
  if (rc == cudaSuccess) rc = cudaStreamSynchronize(stream_);
  if (rc == cudaSuccess) rc = cudaIpcGetMemHandle(&handle, p.mine);
  std::vector<cudaIpcMemHandle_t> all(static_cast<size_t>(ranks));
  host_.all_gather(&handle, all.data(), sizeof(handle));
  p.peers.assign(static_cast<size_t>(ranks), nullptr);
  for (int s = 0; s < ranks && rc == cudaSuccess; ++s)
    rc = s == rank ? cudaSuccess
                   : cudaIpcOpenMemHandle(&p.peers[static_cast<size_t>(s)], all[static_cast<size_t>(s)],
                                          cudaIpcMemLazyEnablePeerAccess);
  if (host_.any(rc != cudaSuccess)) {  // agreed: no rank uses peer memory for this point
    for (int s = 0; s < ranks; ++s)
      if (s != rank && p.peers[static_cast<size_t>(s)] != nullptr)
        (void)cudaIpcCloseMemHandle(p.peers[static_cast<size_t>(s)]);
    if (p.mine != nullptr) (void)cudaFree(p.mine);
    (void)cudaGetLastError();
    return std::nullopt;
  }
  p.peers[static_cast<size_t>(rank)] = p.mine;
  host_.barrier();  // every rank's words zero before any kernel can signal
  PeerView v;
  for (int s = 0; s < ranks; ++s) {
    char* base = static_cast<char*>(p.peers[static_cast<size_t>(s)]);
    v.buffers[s] = base;
    v.signal[s] = reinterpret_cast<uint32_t*>(base + p.words_at);
  }
  v.arrived = v.signal[rank];
  v.state = v.arrived + kStateWord;
  v.missed = missed_;
  v.missed_host = missed_host_;
  v.timeout_ns = static_cast<uint64_t>(std::chrono::nanoseconds(timeout_).count());
  v.rank = rank;
  v.ranks = ranks;
  points_.push_back(std::move(p));
  return v;
}

void PeerMemory::check() const {
  std::string late;
  for (int s = 0; s < host_.size(); ++s)
    if (reinterpret_cast<volatile const uint32_t*>(missed_host_)[s] != 0u)
      late += fmt::format("{}{}", late.empty() ? "" : ", ", s);
  if (!late.empty())
    throw ExchangeTimeout(fmt::format(
        "rank {}: rank(s) {} did not reach an exchange within {} ms (health.exchange_timeout_ms): the step "
        "failed",
        host_.rank(), late, timeout_.count()));
}

void PeerMemory::reset() {
  cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (exchange reset)");
  host_.barrier();
  for (const Point& p : points_)
    cuda_check(cudaMemsetAsync(static_cast<char*>(p.mine) + p.words_at, 0, kWordsBytes, stream_),
               "cudaMemsetAsync (exchange reset)");
  cuda_check(cudaMemsetAsync(missed_, 0, sizeof(uint32_t), stream_), "cudaMemsetAsync (exchange reset)");
  cuda_check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize (exchange reset)");
  std::fill_n(missed_host_, kMaxPeerRanks, 0u);
  host_.barrier();
}

}  // namespace dspark
