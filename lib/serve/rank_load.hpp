// What each rank's start-up cost, for rank 0's metrics: the weight load's time and bytes (LoadProgress), the
// weights held, the process's peak resident memory, its device's memory in use. Every rank sends its own to
// rank 0.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/communicator.hpp"

namespace dspark {

struct RankLoad {
  double load_seconds = 0;           // the weight load, first read to last (LoadProgress::seconds)
  uint64_t read_bytes = 0;           // read from the checkpoint (its shard of it)
  uint64_t weight_bytes = 0;         // the weights as held in the backend's memory, after load options
  uint64_t peak_resident_bytes = 0;  // the process's peak resident set (host memory; a GPU's is not in it)
  uint64_t device_memory_used = 0;   // Backend::device_memory_used at the end of start-up (0: no device)
};

// This process's peak resident set size (getrusage).
uint64_t peak_resident_bytes();

// Every rank's RankLoad in rank order; collective (every rank calls it).
std::vector<RankLoad> gather_rank_loads(Communicator& comm, const RankLoad& mine);

}  // namespace dspark
