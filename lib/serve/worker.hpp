// dspark_worker's body: one rank of the SPMD worker. Loads this rank's shard of the checkpoint named by the
// config, then runs the step loop fed by rank 0's plan source until shutdown.
#pragma once

#include <filesystem>
#include <optional>

#include <atomic>

#include "comm/mpi_communicator.hpp"
#include "lib/config/worker_config.hpp"
#include "lib/runtime/local_driver.hpp"

namespace dspark {

struct WorkerRunOptions {
  std::optional<LocalDriverOptions> local_driver;  // drive from the built-in simulated engine
};

// Per-rank logging from the config: level, "[rank r]" in every line, one file per rank when logging.dir is
// set.
void setup_logging(const WorkerConfig& cfg, int rank, int ranks);

// SIGTERM, SIGINT and SIGUSR1 set the returned flag instead of killing the process: rank 0 finishes and
// answers the step in flight, then broadcasts the shutdown plan; the other ranks wait for it. SIGUSR1 is
// there for mpirun: Open MPI's mpirun forwards it to every rank and then exits with the ranks' status (0),
// while on SIGTERM or SIGINT it kills the ranks itself and exits 1 however cleanly they stop.
const std::atomic<bool>& install_stop_handler();

// Returns the process exit code (0 clean shutdown, 1 unhealthy or failed start). Without a local driver, rank
// 0 serves the host interface named by cfg.ring.
int run_worker(const WorkerConfig& cfg, const MpiSession& mpi, const WorkerRunOptions& options);

}  // namespace dspark
