#include "lib/serve/worker.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include <csignal>

#include "kernels/cpu/cpu_backend.hpp"
#include "lib/checkpoint/checkpoint.hpp"
#include "lib/checkpoint/tensor_table.hpp"
#include "lib/core/error.hpp"
#include "lib/core/sampling.hpp"
#include "lib/host/socket_path.hpp"
#include "lib/serve/host_server.hpp"
#ifdef DSPARK_WITH_CUDA
#include "comm/device_communicator.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/kernel_trace.hpp"
#endif
#include "lib/model/drafter.hpp"
#include "lib/model/load_weights.hpp"
#include "lib/model/shard_report.hpp"
#include "lib/serve/load_progress.hpp"
#include "lib/serve/metrics.hpp"
#include "lib/serve/model_description.hpp"
#include "lib/serve/timed_engine.hpp"

namespace dspark {
namespace {

// Tokens a hot-tokens file lists at most.
constexpr size_t kHotTokensWritten = 65536;

// The rank's GPU: device_map[rank] when the config maps it, else the rank among this host's processes.
[[maybe_unused]] int gpu_of(const WorkerConfig& cfg, const MpiSession& mpi) {
  if (cfg.device_map.empty()) return mpi.local_rank();
  if (static_cast<size_t>(mpi.rank()) >= cfg.device_map.size())
    fail("device_map has {} entries but this is rank {}", cfg.device_map.size(), mpi.rank());
  return static_cast<int>(cfg.device_map[static_cast<size_t>(mpi.rank())]);
}

// Ranks that share a GPU (a device_map naming it more than once) must each be able to run while the others'
// peer kernels spin on them. So every kernel loads at start (a kernel loaded lazily, at its first launch, may
// wait for the GPU's other work), and under MPS each of the k ranks on a GPU takes at most 100 / k % of its
// SMs (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE; ignored without MPS): the others' spinning blocks can then never
// hold every SM. Both are read when CUDA initialises, so this runs before any CUDA call; an explicit setting
// wins.
[[maybe_unused]] void prepare_for_a_shared_gpu(const WorkerConfig& cfg, int gpu) {
  const auto sharing = std::count(cfg.device_map.begin(), cfg.device_map.end(), static_cast<int64_t>(gpu));
  if (sharing < 2) return;
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  setenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", std::to_string(100 / sharing).c_str(), 0);
}

// Backend and communicator of this rank: CPU + MPI (one rank: local), or CUDA + NCCL.
struct Compute {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
};

Compute make_compute(const WorkerConfig& cfg, const MpiSession& mpi) {
  Compute c;
  switch (cfg.backend) {
    case BackendKind::cpu:
      if (!cfg.debug.kernel_trace_file.empty())
        fail("debug.kernel_trace_file: only the cuda backend records a kernel trace (backend: cpu)");
      c.backend = std::make_unique<CpuBackend>();
      if (mpi.size() > 1)
        c.comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
      else
        c.comm = std::make_unique<LocalCommunicator>();
      return c;
    case BackendKind::cuda: {
#ifdef DSPARK_WITH_CUDA
      if (!cfg.debug.kernel_trace_file.empty() && !cuda::kernel_trace_built())
        fail(
            "debug.kernel_trace_file: this build records no kernel trace (configure with "
            "-DDSPARK_KERNEL_TRACE=ON)");
      const int device = gpu_of(cfg, mpi);
      prepare_for_a_shared_gpu(cfg, device);
      auto gpu = std::make_unique<CudaBackend>(device, cfg.tuning);
      gpu->set_kernel_trace_file(cfg.debug.kernel_trace_file.string());
      c.comm = make_device_communicator(MPI_COMM_WORLD, gpu->device(), gpu->stream(), cfg.tuning,
                                        std::chrono::milliseconds(cfg.health.exchange_timeout_ms));
      spdlog::info("GPU {} ({}), {} rank(s)", gpu->device(), cuda::device_info(gpu->device()).name,
                   mpi.size());
      c.backend = std::move(gpu);
      return c;
#else
      fail(
          "backend: cuda, but this build has no CUDA backend (built without nvcc or NCCL): use backend: cpu");
#endif
    }
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

std::atomic<bool> g_stop{false};
extern "C" void on_stop_signal(int) {
  g_stop.store(true);
}

// The Markov cache's tokens (markov_cache.rows > 0): the first `rows` of the token file, logged with the
// memory they take on each rank.
std::vector<int32_t> markov_cache_tokens(const WorkerConfig& cfg, const ModelConfig& model,
                                         const ShardPlan& plan) {
  const WorkerConfig::MarkovCache& mc = cfg.markov_cache;
  if (mc.rows == 0) {
    if (!mc.tokens_file.empty())
      spdlog::warn("markov_cache.tokens_file is set but markov_cache.rows is 0: no cache");
    return {};
  }
  const std::filesystem::path file =
      mc.tokens_file.empty() ? cfg.checkpoint / "markov_cache_tokens.txt" : mc.tokens_file;
  if (mc.tokens_file.empty() && !std::filesystem::exists(file))
    fail("markov_cache.rows is {}, but no markov_cache.tokens_file is set and {} does not exist", mc.rows,
         file.string());
  std::vector<int32_t> tokens = read_markov_cache_tokens(file, model.vocab_size, mc.rows);
  spdlog::info("Markov bias cache: {} tokens of {} ({:.1f} MB per rank)", tokens.size(), file.string(),
               static_cast<double>(tokens.size()) * static_cast<double>(plan.vocab.size()) * 4 / 1e6);
  return tokens;
}

// At shutdown: the cache's hit rate and the hottest tokens it did not hold, and the token file for the next
// start (markov_cache.hot_tokens_file).
void report_markov_tokens(const WorkerConfig::MarkovCache& mc, const MarkovTokenBook& book) {
  if (book.lookups() > 0) {
    std::vector<std::string> hot;
    for (const auto& [id, n] : book.hottest(8, /*uncached_only=*/true))
      hot.push_back(fmt::format("{} ({})", id, n));
    spdlog::info("Markov bias cache: {} look-ups, {} hits ({:.1f} %); hottest uncached tokens: {}",
                 book.lookups(), book.hits(),
                 100.0 * static_cast<double>(book.hits()) / static_cast<double>(book.lookups()),
                 hot.empty() ? std::string("none") : fmt::format("{}", fmt::join(hot, ", ")));
  }
  if (mc.hot_tokens_file.empty()) return;
  try {
    const auto tokens = book.hottest(kHotTokensWritten, /*uncached_only=*/false);
    write_markov_cache_tokens(mc.hot_tokens_file, tokens);
    spdlog::info("wrote the {} most seen previous tokens to {}", tokens.size(), mc.hot_tokens_file.string());
  } catch (const Error& e) {
    spdlog::error("{}", e.what());  // the shutdown goes on
  }
}

}  // namespace

const std::atomic<bool>& install_stop_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGUSR1, &sa, nullptr);  // what `kill -USR1 <mpirun>` forwards to every rank (worker.hpp)
  return g_stop;
}

void setup_logging(const WorkerConfig& cfg, int rank, int ranks) {
  std::vector<spdlog::sink_ptr> sinks{std::make_shared<spdlog::sinks::stderr_color_sink_mt>()};
  if (!cfg.logging.dir.empty()) {
    // Appended, so a supervisor's restart keeps the log of the run that failed.
    const auto file = cfg.logging.dir / fmt::format("dspark-worker-rank{}.log", rank);
    sinks.push_back(std::make_shared<spdlog::sinks::basic_file_sink_mt>(file.string(), false));
  }
  auto logger = std::make_shared<spdlog::logger>("dspark", sinks.begin(), sinks.end());
  logger->set_pattern(fmt::format("[%H:%M:%S.%e] [rank {}/{}] [%^%l%$] %v", rank, ranks));
  logger->set_level(spdlog::level::from_str(cfg.logging.level));
  spdlog::set_default_logger(logger);
}

int run_worker(const WorkerConfig& cfg, const MpiSession& mpi, const WorkerRunOptions& options) {
  Compute compute = make_compute(cfg, mpi);
  Communicator& comm = *compute.comm;
  std::unique_ptr<Backend>& backend = compute.backend;
  if (comm.rank() == 0)
    spdlog::info("tuning: {}{}", describe(cfg.tuning),
                 cfg.backend == BackendKind::cpu ? " (the cpu backend ignores it)" : "");

  const std::atomic<bool>& stop = install_stop_handler();
  const auto t0 = std::chrono::steady_clock::now();
  const Checkpoint ckpt(cfg.checkpoint, is_drafter_tensor);
  const ModelConfig model = load_model_config(ckpt.config_path());
  // Metrics are the host server's (the local driver keeps its own latencies); the same on every rank, as
  // the rank-load gather below is collective.
  const bool metrics_on = cfg.metrics.port != 0 && !options.local_driver;
  if (comm.rank() == 0 && cfg.metrics.port != 0 && options.local_driver)
    spdlog::warn("metrics.port: no metrics under --local-driver");
  // Listening before the load: a port in use, or a build without metrics, fails the start at once.
  std::unique_ptr<Metrics> metrics;
  if (comm.rank() == 0 && metrics_on) metrics = start_metrics(cfg.metrics, cfg.slots);
  // The socket exists while the weights load, so a host attaching early hears "starting", and a second worker
  // on the same name is refused before it loads anything.
  std::unique_ptr<host::HostServer> server;
  if (comm.rank() == 0 && !options.local_driver) {
    // The CUDA backend leaves rank 0's cores idle between steps; the CPU backend's ranks compute on theirs.
    const bool spin_ahead = host::spin_ahead_setting().value_or(cfg.backend == BackendKind::cuda);
    const host::ServerOptions so{
        host::socket_path(cfg.ring.name, cfg.ring.socket_dir.string()),
        cfg.ring.group,
        std::chrono::milliseconds(cfg.health.host_timeout_ms),
        metrics.get(),
        describe_taps(model),
        host::SamplingLimits{static_cast<uint32_t>(cfg.sampling.max_distributions), kMaxTemperature},
        spin_ahead};
    const ServedLimits served{cfg.slots, cfg.max_batch, cfg.max_context_rows, cfg.max_model_len, comm.size()};
    server = std::make_unique<host::HostServer>(so, describe_model(model, served), stop);
  }
  const ShardPlan plan = make_shard_plan(model, comm.rank(), comm.size());
  DrafterOptions dopt;
  dopt.slots = cfg.slots;
  dopt.max_batch = cfg.max_batch;
  dopt.max_distributions = cfg.sampling.max_distributions;
  dopt.max_insert_rows = std::min<int64_t>(cfg.max_context_rows, 256);
  for (const int64_t n : cfg.graphs.insert_rows) dopt.max_insert_rows = std::max(dopt.max_insert_rows, n);
  dopt.max_model_len = cfg.max_model_len;
  dopt.check_replicated = cfg.debug.check_replicated;
  dopt.use_graphs = cfg.graphs.enabled;  // backends without graphs (cpu) run eagerly
  dopt.graph_batch_sizes = cfg.graphs.batch_sizes;
  dopt.insert_row_buckets = cfg.graphs.insert_rows;
  dopt.step_graph_pairs =
      cfg.graphs.steps ? *cfg.graphs.steps : default_step_pairs(cfg.graphs, model.block_size);
  dopt.markov_cache_rows = cfg.markov_cache.rows;
  dopt.markov_cache_tokens = markov_cache_tokens(cfg, model, plan);
  LoadOptions lopt;
  lopt.head_fp8 = cfg.weights.head == "fp8";
  // The bytes this rank reads, from the headers (the loader reads exactly what the shard report counts).
  LoadProgress progress(
      make_shard_report(model, comm.size(), &ckpt).bytes[static_cast<size_t>(comm.rank())].total(),
      std::chrono::seconds(2), [](const std::string& line) { spdlog::info("{}", line); });
  lopt.on_read = [&progress](uint64_t bytes) { progress.add(bytes); };
  const uint64_t mem_before = backend->device_memory_used();
  Drafter drafter(model, load_drafter_weights(ckpt, model, plan, *backend, lopt), plan, *backend, comm, dopt);
  progress.finish();
  const uint64_t mem_loaded = backend->device_memory_used();
  const LoadedFormats formats = loaded_formats(drafter.weights());
  spdlog::info(
      "loaded {} on {} backend: {:.1f} MB of weights (heads [{}, {}), vocab [{}, {})), formats {}, head {}{} "
      "in "
      "{:.1f} s",
      cfg.checkpoint.string(), backend->name(), static_cast<double>(drafter.weights().bytes) / 1e6,
      plan.heads.begin, plan.heads.end, plan.vocab.begin, plan.vocab.end, formats.names,
      weight_format_name(drafter.weights().head.format), lopt.head_fp8 ? " (re-quantised at load)" : "",
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  if (server) server->set_weight_formats(formats.bits, format_code(drafter.weights().head.format));
  if (server) server->set_markov_tokens(&drafter.markov_tokens());
  const auto t1 = std::chrono::steady_clock::now();
  drafter.capture_graphs();
  const GraphCounts graphs = drafter.graph_counts();
  if (const uint64_t mem_graphs = backend->device_memory_used(); mem_graphs > 0)
    spdlog::info(
        "device memory in use (every process on this GPU): {:.2f} GB before loading, {:.2f} GB loaded "
        "({:.2f} GB "
        "of weights, the rest KV rings, workspace and scratch), {:.2f} GB with the graphs",
        static_cast<double>(mem_before) / 1e9, static_cast<double>(mem_loaded) / 1e9,
        static_cast<double>(drafter.weights().bytes) / 1e9, static_cast<double>(mem_graphs) / 1e9);
  if (graphs.draft_graphs + graphs.insert_graphs > 0)
    spdlog::info(
        "recorded {} draft-step graphs (batch sizes {}, k' 1..{}), {} insert graphs (rows {}) and {} step "
        "graphs (inserts + draft, [rows, batch] {}) in {:.2f} s",
        graphs.draft_graphs, fmt::join(cfg.graphs.batch_sizes, ","), model.block_size, graphs.insert_graphs,
        fmt::join(cfg.graphs.insert_rows, ","), graphs.step_graphs, fmt::join(dopt.step_graph_pairs, ","),
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());

  const StepLimits limits{cfg.slots,         cfg.max_batch,     cfg.max_context_rows,
                          cfg.max_model_len, cfg.max_model_len, model.vocab_size,
                          model.block_size,  model.row_dim(),   cfg.sampling.max_distributions};
  LoopOptions loop;
  loop.max_failed_steps = cfg.health.max_failed_steps;
  loop.step_timeout = std::chrono::milliseconds(cfg.health.step_timeout_ms);
  host::HostServer* const srv = server.get();  // hosts waiting on the hung step see "unhealthy" at once
  loop.on_step_timeout = [srv] {
    if (srv) srv->set_unhealthy();
  };
  std::unique_ptr<LocalDriver> driver;
  PlanSource* source = server.get();
  if (comm.rank() == 0 && options.local_driver) {
    const EngineShape shape{model.vocab_size, model.block_size,     model.row_dim(),  cfg.slots,
                            cfg.max_batch,    cfg.max_context_rows, cfg.max_model_len};
    driver = std::make_unique<LocalDriver>(shape, *options.local_driver);
    source = driver.get();
  }
  if (metrics_on) {
    const std::vector<RankLoad> loads =
        gather_rank_loads(comm, {progress.seconds(), progress.done(), drafter.weights().bytes,
                                 peak_resident_bytes(), backend->device_memory_used()});
    if (metrics) metrics->set_rank_loads(loads);
  }
  std::optional<TimedEngine> timed;  // rank 0 times inserts and drafts; the other ranks run them in step
  if (metrics) timed.emplace(drafter, *metrics);
  DraftEngine& engine = timed ? static_cast<DraftEngine&>(*timed) : drafter;
  // Rank 0 serves only once every rank has loaded and recorded its graphs: a host's first step, and the
  // launcher's readiness probe (dspark_client health), never wait on a rank still loading.
  comm.any(false);
  if (server) {
    server->set_serving();
    spdlog::info("serving {} with {} rank(s)", host::socket_path(cfg.ring.name, cfg.ring.socket_dir.string()),
                 comm.size());
  }
  const int rc = run_step_loop(engine, comm, source, limits, loop);
  if (server && rc != 0) server->set_unhealthy();
  if (driver) report_latencies(*driver);
  const GraphCounts ran = drafter.graph_counts();
  if (ran.draft_graphs + ran.insert_graphs > 0)  // says whether the recorded buckets fit the traffic
    spdlog::info(
        "steps with inserts as one replay: {}; other draft steps: {} replayed, {} eager (no recording of "
        "their "
        "batch size); other insert chunks: {} replayed, {} eager",
        ran.step_replays, ran.draft_replays, ran.draft_eager, ran.insert_replays, ran.insert_eager);
  if (!drafter.draft_shapes().empty()) {
    std::vector<std::string> shapes;
    for (const auto& [shape, n] : drafter.draft_shapes())
      shapes.push_back(
          fmt::format("B={} k'={}: {} ({} replayed)", shape.first, shape.second, n.steps, n.replayed));
    spdlog::info("draft shapes run: {}", fmt::join(shapes, ", "));
  }
  if (comm.rank() == 0) report_markov_tokens(cfg.markov_cache, drafter.markov_tokens());
  spdlog::info("worker stopped ({})", rc == 0 ? "clean shutdown" : "unhealthy");
  return rc;
}

}  // namespace dspark
