// The communicator the CUDA backend's ranks get (SPEC §5): NCCL (with peer memory for every exchange when the
// ranks share one host), or, when ranks share a GPU, IpcCommunicator (NCCL refuses two ranks on one device).
#pragma once

#include <cuda_runtime.h>
#include <mpi.h>

#include <chrono>
#include <memory>

#include "comm/communicator.hpp"
#include "lib/core/tuning.hpp"

namespace dspark {

// Collective: whether any two ranks of `comm` run on the same GPU (by the devices' UUIDs).
bool ranks_share_a_gpu(MPI_Comm comm, int device);

// Collective over `comm`, on the GPU of `stream`.
std::unique_ptr<Communicator> make_device_communicator(MPI_Comm comm, int device, cudaStream_t stream,
                                                       const Tuning& tuning,
                                                       std::chrono::milliseconds exchange_timeout);

}  // namespace dspark
