// dspark_worker CONFIG.yaml: one rank of the drafter service. Launch N ranks with `mpirun -np N`; each loads
// its shard and runs the same step loop; rank 0 takes the steps from the host (or from the built-in local
// driver). `--check-config` validates a config without MPI and prints what a launcher needs
// (scripts/dspark-launch).
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <string_view>

#include "comm/mpi_communicator.hpp"
#include "lib/config/worker_config.hpp"
#include "lib/core/error.hpp"
#include "lib/host/socket_path.hpp"
#include "lib/serve/metrics.hpp"
#include "lib/serve/worker.hpp"

namespace {

bool has_arg(int argc, char** argv, std::string_view arg) {
  for (int i = 1; i < argc; ++i)
    if (arg == argv[i]) return true;
  return false;
}

// dspark_worker CONFIG --check-config [--log-dir DIR]: the config as the worker reads it, without MPI (no
// mpirun), as "key value" lines; exit 1 with the reason when it is refused (metrics.port included, on a
// build without metrics).
int check_config(int argc, char** argv) {
  CLI::App app{"dspark_worker --check-config: validate a worker configuration, print what a launcher needs"};
  std::string config_path, log_dir;
  bool check = true;
  app.add_option("config", config_path, "worker configuration (YAML)")->required()->check(CLI::ExistingFile);
  app.add_flag("--check-config", check, "validate and print: config, backend, checkpoint, socket, log_dir");
  app.add_option("--log-dir", log_dir, "as the worker's --log-dir");
  CLI11_PARSE(app, argc, argv);
  try {
    dspark::WorkerConfig cfg = dspark::load_worker_config(config_path);
    if (!log_dir.empty()) cfg.logging.dir = std::filesystem::absolute(log_dir);
    if (!std::filesystem::is_directory(cfg.checkpoint))
      dspark::fail("{}: checkpoint {} is not a directory", config_path, cfg.checkpoint.string());
    if (cfg.metrics.port != 0 && !dspark::metrics_built())
      dspark::fail(
          "{}: metrics.port: {}: this build has no Prometheus metrics (built without prometheus-cpp and "
          "libmicrohttpd)",
          config_path, cfg.metrics.port);
    const std::string metrics = cfg.metrics.port == 0
                                    ? "off"
                                    : fmt::format("http://{}:{}/metrics", cfg.metrics.bind, cfg.metrics.port);
    std::printf("config %s\nbackend %s\ncheckpoint %s\nsocket %s\nlog_dir %s\nmetrics %s\n",
                std::filesystem::absolute(config_path).c_str(),
                cfg.backend == dspark::BackendKind::cuda ? "cuda" : "cpu", cfg.checkpoint.c_str(),
                dspark::host::socket_path(cfg.ring.name, cfg.ring.socket_dir.string()).c_str(),
                cfg.logging.dir.c_str(), metrics.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dspark_worker: %s\n", e.what());
    return 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (has_arg(argc, argv, "--check-config")) return check_config(argc, argv);
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
  std::string log_dir;
  bool check_only = false;  // handled before MPI starts (check_config); listed for --help
  app.add_option("--log-dir", log_dir, "one log file per rank in this directory (overrides logging.dir)");
  app.add_flag("--check-config", check_only,
               "validate the config without MPI, print what a launcher needs, exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  try {
    dspark::WorkerConfig cfg = dspark::load_worker_config(config_path);
    if (!log_dir.empty()) cfg.logging.dir = std::filesystem::absolute(log_dir);
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
