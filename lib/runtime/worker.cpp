#include "runtime/worker.hpp"

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "checkpoint/checkpoint.hpp"
#include "core/error.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "model/load_weights.hpp"

namespace dspark {
namespace {

std::unique_ptr<Backend> make_backend(const WorkerConfig& cfg) {
  switch (cfg.backend) {
    case BackendKind::cpu:
      return std::make_unique<CpuBackend>();
    case BackendKind::cuda:
      fail("backend: cuda is not available in this build yet (use backend: cpu)");
  }
  fail("backend: unknown");
}

void report_latencies(const LocalDriver& driver) {
  std::vector<double> v = driver.latencies_us();
  if (v.empty()) return;
  std::sort(v.begin(), v.end());
  auto pct = [&](double p) { return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1))]; };
  spdlog::info("local driver: {} steps ({} failed), step latency p50 {:.0f} us, p99 {:.0f} us, max {:.0f} us",
               driver.steps_done(), driver.failed_steps(), pct(0.5), pct(0.99), v.back());
}

}  // namespace

void setup_logging(const WorkerConfig& cfg, int rank, int ranks) {
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  if (!cfg.logging.dir.empty()) {
    const auto file = cfg.logging.dir / fmt::format("dspark-worker-rank{}.log", rank);
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file.string(), true));
  }
  auto logger = std::make_shared<spdlog::logger>("dspark", sinks.begin(), sinks.end());
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}/{}] [%^%l%$] %v", rank, ranks));
  logger->set_level(spdlog::level::from_str(cfg.logging.level));
  spdlog::set_default_logger(logger);
}

int run_worker(const WorkerConfig& cfg, const MpiSession& mpi, const WorkerRunOptions& options) {
  MpiCommunicator world(MPI_COMM_WORLD);
  LocalCommunicator local;
  Communicator& comm = mpi.size() > 1 ? static_cast<Communicator&>(world) : local;
  std::unique_ptr<Backend> backend = make_backend(cfg);
  if (cfg.weights.head != "keep")
    fail("weights.head: '{}' is not supported yet (keep only)", cfg.weights.head);

  const auto t0 = std::chrono::steady_clock::now();
  const Checkpoint ckpt(cfg.checkpoint);
  const ModelConfig model = load_model_config(ckpt.config_path());
  const ShardPlan plan = make_shard_plan(model, comm.rank(), comm.size());
  DrafterOptions dopt;
  dopt.slots = cfg.slots;
  dopt.max_batch = cfg.max_batch;
  dopt.max_insert_rows = std::min<int64_t>(cfg.max_context_rows, 256);
  dopt.max_model_len = cfg.max_model_len;
  dopt.check_replicated = cfg.debug.check_replicated;
  Drafter drafter(model, load_drafter_weights(ckpt, model, plan, *backend), plan, *backend, comm, dopt);
  spdlog::info("loaded {} on {} backend: {:.1f} MB of weights (heads [{}, {}), vocab [{}, {})) in {:.1f} s",
               cfg.checkpoint.string(), backend->name(), static_cast<double>(drafter.weights().bytes) / 1e6,
               plan.heads.begin, plan.heads.end, plan.vocab.begin, plan.vocab.end,
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

  const StepLimits limits{cfg.slots,         cfg.max_batch,    cfg.max_context_rows, cfg.max_model_len,
                          cfg.max_model_len, model.vocab_size, model.block_size,     model.row_dim()};
  const LoopOptions loop{cfg.health.max_failed_steps};
  std::unique_ptr<LocalDriver> driver;
  if (comm.rank() == 0) {
    if (!options.local_driver)
      fail("no plan source: the host ring is not available yet; run with --local-driver");
    driver = std::make_unique<LocalDriver>(model, limits, *options.local_driver);
  }
  const int rc = run_step_loop(drafter, comm, driver.get(), limits, loop);
  if (driver) report_latencies(*driver);
  spdlog::info("worker stopped ({})", rc == 0 ? "clean shutdown" : "unhealthy");
  return rc;
}

}  // namespace dspark
