#include "comm/device_communicator.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "comm/ipc_communicator.hpp"
#include "comm/mpi_communicator.hpp"
#include "comm/nccl_communicator.hpp"
#include "lib/core/error.hpp"

namespace dspark {

bool ranks_share_a_gpu(MPI_Comm comm, int device) {
  MpiCommunicator host(comm);
  cudaDeviceProp prop{};
  const cudaError_t rc = cudaGetDeviceProperties(&prop, device);
  if (host.any(rc != cudaSuccess)) fail("cudaGetDeviceProperties (GPU {}) failed on some rank", device);
  using Uuid = std::array<char, sizeof(prop.uuid.bytes)>;
  Uuid mine{};
  std::memcpy(mine.data(), prop.uuid.bytes, mine.size());
  std::vector<Uuid> all(static_cast<size_t>(host.size()));
  host.all_gather(&mine, all.data(), sizeof(Uuid));
  std::sort(all.begin(), all.end());
  return std::adjacent_find(all.begin(), all.end()) != all.end();
}

std::unique_ptr<Communicator> make_device_communicator(MPI_Comm comm, int device, cudaStream_t stream,
                                                       const Tuning& tuning,
                                                       std::chrono::milliseconds exchange_timeout) {
  if (ranks_share_a_gpu(comm, device)) {
    int rank = 0;
    MPI_Comm_rank(comm, &rank);
    if (rank == 0)
      spdlog::warn(
          "ranks share a GPU: every exchange goes through CUDA IPC peer memory, without NCCL (for tests: the "
          "bits of the same tp on separate GPUs, timings that mean nothing)");
    return std::make_unique<IpcCommunicator>(comm, stream, exchange_timeout);
  }
  return std::make_unique<NcclCommunicator>(comm, stream, tuning, exchange_timeout);
}

}  // namespace dspark
