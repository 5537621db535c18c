// dspark_worker CONFIG.yaml: one rank of the drafter service. Launch N ranks with `mpirun -np N`; each loads
// its shard and runs the same step loop; rank 0 takes the steps from the host (or from the built-in local
// driver).
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include "comm/mpi_communicator.hpp"
#include "lib/config/worker_config.hpp"
#include "lib/serve/worker.hpp"

int main(int argc, char** argv) {
  dspark::MpiSession mpi(&argc, &argv);
  CLI::App app{"dspark_worker: the DSpark drafter as a tensor-parallel SPMD service (one rank per GPU)"};
  std::string config_path;
  int64_t local_steps = 0;
  dspark::LocalDriverOptions driver;
  app.add_option("config", config_path, "worker configuration (YAML)")->required()->check(CLI::ExistingFile);
  app.add_option("--local-driver", local_steps,
                 "feed the worker from a built-in seeded engine simulation for this many steps, then stop");
  app.add_option("--sequences", driver.engine.sequences, "local driver: sequences (slots) drafted per step")
      ->default_val(4);
  app.add_option("--prefill", driver.engine.prefill_rows, "local driver: context rows of each new sequence")
      ->default_val(24);
  app.add_option("--accept", driver.engine.accept_prob, "local driver: per-token acceptance probability")
      ->default_val(0.7);
  app.add_option("--seed", driver.engine.seed, "local driver: seed of rows, tokens and acceptance")
      ->default_val(0);
  app.add_option("--drafts-out", driver.drafts_out, "local driver: write every step's drafts as JSON lines");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    const dspark::WorkerConfig cfg = dspark::load_worker_config(config_path);
    dspark::setup_logging(cfg, mpi.rank(), mpi.size());
    dspark::WorkerRunOptions options;
    if (local_steps > 0) {
      driver.steps = local_steps;
      options.local_driver = driver;
    }
    return dspark::run_worker(cfg, mpi, options);
  } catch (const std::exception& e) {
    spdlog::critical("rank {}: {}", mpi.rank(), e.what());
    // A rank that stops alone would leave the others waiting in a collective: end the whole job.
    if (mpi.size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
