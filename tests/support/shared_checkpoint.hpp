// A synthetic checkpoint that every rank of an MPI test reads: written by rank 0 into a folder every rank
// sees (same host) on the first call for its name, removed by rank 0 when the process ends.
#pragma once

#include <mpi.h>
#include <unistd.h>

#include <filesystem>
#include <map>
#include <string>
#include <system_error>

#include "lib/checkpoint/synthetic.hpp"
#include "lib/config/model_config.hpp"

namespace dspark::test {

// Collective on the first call for `name` (every rank of `comm` makes it); cfg written with seed 3.
inline const std::filesystem::path& shared_checkpoint_dir(MPI_Comm comm, const std::string& name,
                                                          const ModelConfig& cfg) {
  struct Dir {
    std::filesystem::path path;
    bool owner = false;
    ~Dir() {
      std::error_code ec;
      if (owner) std::filesystem::remove_all(path, ec);
    }
  };
  static std::map<std::string, Dir> dirs;
  if (const auto it = dirs.find(name); it != dirs.end()) return it->second.path;
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  unsigned long id = rank == 0 ? static_cast<unsigned long>(::getpid()) : 0;
  MPI_Bcast(&id, 1, MPI_UNSIGNED_LONG, 0, comm);
  Dir& d = dirs[name];
  d.path = std::filesystem::temp_directory_path() / ("dspark-" + name + "-" + std::to_string(id));
  d.owner = rank == 0;
  if (rank == 0) {
    SyntheticOptions opt;
    opt.seed = 3;
    opt.force = true;
    write_synthetic_checkpoint(cfg, d.path, opt);
  }
  MPI_Barrier(comm);
  return d.path;
}

}  // namespace dspark::test
