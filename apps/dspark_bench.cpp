// dspark_bench: draft-step and context-insert latency of the DSpark drafter, beside the memory bandwidth
// floor of SPEC §8. `mpirun -np N dspark_bench` (rank r on GPU local_rank): synthetic weights are generated
// on each GPU (no checkpoint), then the worker's own path runs: Drafter + CudaBackend + NcclCommunicator.
// Draft steps replay CUDA graphs unless --eager; --format bf16,fp8 measures the weight formats one after the
// other in the same run. --backend cpu runs the CPU backend (MPI collectives) on the tiny preset instead, its
// weights a synthetic checkpoint read by the worker's loader and its floor from a host memcpy's bandwidth.
// See docs/performance.md.
#include <fmt/format.h>
#include <mpi.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "comm/mpi_communicator.hpp"
#include "kernels/cpu/cpu_backend.hpp"
#include "lib/bench/bench_format.hpp"
#include "lib/bench/bench_run.hpp"
#include "lib/bench/exchange_cost.hpp"
#include "lib/bench/host_clock.hpp"
#include "lib/bench/host_weights.hpp"
#include "lib/bench/report.hpp"
#include "lib/bench/ring_steps.hpp"
#include "lib/core/error.hpp"
#include "lib/core/tuning.hpp"
#include "lib/model/drafter.hpp"
#ifdef DSPARK_WITH_CUDA
#include "comm/nccl_communicator.hpp"
#include "kernels/cuda/cuda_backend.hpp"
#include "kernels/cuda/device_info.hpp"
#include "kernels/cuda/kernel_trace.hpp"
#include "lib/bench/cuda/cuda_clock.hpp"
#include "lib/bench/cuda/device_weights.hpp"
#endif

namespace {

using namespace dspark;

#ifdef DSPARK_WITH_CUDA
constexpr const char* kDefaultBackend = "cuda";
#else
constexpr const char* kDefaultBackend = "cpu";
#endif

struct Args {
  std::string backend = kDefaultBackend;
  std::string preset;  // empty: v41-flash on cuda, tiny on cpu
  bench::BenchOptions bench;
  double bw_gib = 0;  // 0: 4 GiB on cuda, 0.5 GiB on cpu
  bool eager = false;
  bool iteration = false;
  bool exchange_cost = false;
  int64_t accepted_rows = 4;
  std::string json;
  Tuning tuning;
  std::string kernel_trace;
  std::vector<bench::BenchFormat> formats{bench::BenchFormat::bf16};
};

#ifdef DSPARK_WITH_CUDA
// Rank 0 prints a line per tenth of its weight bytes (each allocation drains the stream, so the count follows
// the GPU's progress).
bench::GenerationProgressFn progress_printer(bool enabled) {
  if (!enabled) return {};
  return [next = 0.0](const bench::GenerationProgress& p) mutable {
    const double frac =
        p.bytes_total ? static_cast<double>(p.bytes_done) / static_cast<double>(p.bytes_total) : 1;
    if (frac < next && p.tensors_done != p.tensors_total) return;
    fmt::print("weights: {:5.1f} / {:.1f} GB on rank 0 ({} / {} tensors)\n",
               static_cast<double>(p.bytes_done) / 1e9, static_cast<double>(p.bytes_total) / 1e9,
               p.tensors_done, p.tensors_total);
    std::fflush(stdout);
    next = frac + 0.1;
  };
}
#endif

// This rank's part of a format's synthetic weights (cfg from config_for_format).
using WeightSource = std::function<DrafterWeights(const ModelConfig&, const ShardPlan&, bench::BenchFormat)>;

// The drafter options of a format's run.
DrafterOptions drafter_options(const Args& args, const ModelConfig& cfg, bool graphs) {
  const int64_t max_batch = *std::max_element(args.bench.batches.begin(), args.bench.batches.end());
  DrafterOptions dopt;
  dopt.slots = max_batch;
  dopt.max_batch = max_batch;
  dopt.max_insert_rows = 128;
  for (const int64_t n : args.bench.insert_rows) dopt.max_insert_rows = std::max(dopt.max_insert_rows, n);
  dopt.use_graphs = graphs;
  dopt.graph_batch_sizes = args.bench.batches;
  dopt.insert_row_buckets = args.bench.insert_rows;
  if (args.bench.markov_cache) dopt.markov_cache_rows = max_batch * cfg.block_size;
  if (args.iteration) {  // each step's rows fill a bucket of their own, recorded with the step's draft
    for (const int64_t B : args.bench.batches) {
      const int64_t rows = B * args.accepted_rows;
      if (std::find(dopt.insert_row_buckets.begin(), dopt.insert_row_buckets.end(), rows) ==
          dopt.insert_row_buckets.end())
        dopt.insert_row_buckets.push_back(rows);
      dopt.max_insert_rows = std::max(dopt.max_insert_rows, rows);
      dopt.step_graph_pairs.emplace_back(rows, B);
    }
  }
  return dopt;
}

// --exchange-cost: the draft of every batch with its exchanges replaced by local copies, on a drafter of its
// own whose weights are generated again (the real drafter is released first: the two never share the
// memory). Only draft steps are recorded.
std::vector<bench::Measurement> local_exchange_rows(const MpiSession& mpi, const Args& args,
                                                    const ModelConfig& cfg, const ShardPlan& plan,
                                                    bench::BenchFormat format, Backend& backend,
                                                    bench::BenchClock& clock, Communicator& comm,
                                                    const WeightSource& weights_of, double bandwidth,
                                                    bool graphs, const std::map<int64_t, DraftResult>& real) {
  const auto t0 = std::chrono::steady_clock::now();
  DrafterWeights weights = weights_of(cfg, plan, format);
  comm.barrier();
  if (mpi.rank() == 0)
    fmt::print("{} weights generated again in {:.1f} s for the drafts with local exchanges\n",
               bench::bench_format_name(format),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  DrafterOptions dopt = drafter_options(args, cfg, graphs);
  dopt.insert_row_buckets.clear();
  dopt.step_graph_pairs.clear();
  dopt.markov_cache_rows = 0;
  bench::LocalExchangeCommunicator lx(comm, backend);
  Drafter drafter(cfg, std::move(weights), plan, backend, lx, dopt);
  bench::Bench b(drafter, backend, clock, lx, bandwidth, args.bench);
  return bench::local_exchange_drafts(b, drafter, lx, args.bench.batches, real);
}

// One format's weights, drafter and measurements; rows are appended to `runs` (rank 0).
void run_format(const MpiSession& mpi, const Args& args, const ModelConfig& base, bench::BenchFormat format,
                Backend& backend, bench::BenchClock& clock, Communicator& comm,
                const WeightSource& weights_of, bench::RunInfo info, nlohmann::json& runs) {
  const bool lead = mpi.rank() == 0;
  const ModelConfig cfg = bench::config_for_format(base, format);
  const ShardPlan plan = make_shard_plan(cfg, mpi.rank(), mpi.size());  // refuses a split with the reason
  info.format = bench::bench_format_name(format);
  std::vector<bench::Measurement> rows;
  const auto record = [&](bench::Measurement m) {
    if (lead) bench::print_row(info, m);
    rows.push_back(std::move(m));
  };
  std::map<int64_t, DraftResult> answers;  // the real drafts, for the drafts with local exchanges
  {
    const auto t0 = std::chrono::steady_clock::now();
    DrafterWeights weights = weights_of(cfg, plan, format);
    comm.barrier();
    if (lead)
      fmt::print("{} weights generated on every rank in {:.1f} s\n\n", info.format,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    info.weight_bytes = weights.bytes;

    Drafter drafter(cfg, std::move(weights), plan, backend, comm, drafter_options(args, cfg, info.graphs));
    const auto t1 = std::chrono::steady_clock::now();
    drafter.capture_graphs();  // what the worker does at start-up: every measured shape replays a recording
    if (lead && info.graphs)
      fmt::print("recorded {} draft-step, {} insert and {} step graphs in {:.2f} s\n\n",
                 drafter.graph_counts().draft_graphs, drafter.graph_counts().insert_graphs,
                 drafter.graph_counts().step_graphs,
                 std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count());
    bench::Bench b(drafter, backend, clock, comm, info.bandwidth, args.bench);
    b.fill_context();

    info.peer_exchange = drafter.peer_exchange();
    if (lead) {
      bench::print_header(info);
      bench::print_table_head();
    }
    for (int64_t B : args.bench.batches) {
      record(b.draft(B));
      if (args.exchange_cost) answers[B] = b.answer(B, /*eager=*/false);
      if (args.bench.markov_cache) record(b.draft_cached(B));
      if (args.bench.sampled) {
        record(b.draft_sampled(B, false));
        record(b.draft_sampled(B, true));
      }
    }
    for (int64_t n : args.bench.insert_rows) record(b.insert(n));
    if (args.iteration) {
      for (int64_t B : args.bench.batches) {
        record(b.step(B, true));
        record(b.step(B, false));
      }
      // Last: the ring host's detach resets the slots its steps wrote.
      const bench::RingStepOptions ro{args.bench.batches, info.backend == "cuda"};
      for (bench::Measurement& m : bench::ring_steps(b, drafter, comm, ro)) record(std::move(m));
      if (lead) bench::print_ring_split(rows);
    }
  }
  if (args.exchange_cost) {
    std::vector<bench::Measurement> local = local_exchange_rows(
        mpi, args, cfg, plan, format, backend, clock, comm, weights_of, info.bandwidth, info.graphs, answers);
    for (bench::Measurement& m : local) {
      for (const bench::Measurement& r : rows)
        if (r.kind == "draft" && r.size == m.size)
          bench::set_exchange_cost(m, r, cfg.n_mtp_layers, cfg.block_size);
      record(std::move(m));
    }
    if (lead) bench::print_exchange_costs(info, rows);
  }
  if (lead) {
    bench::print_insert_links(rows);
    fmt::print("\n");
    runs.push_back(bench::to_json(info, rows));
  }
}

// What every backend's run shares: the info filled, the formats one after the other (each drafter released
// before the next is generated, so their figures share the machine, the bandwidth measurement and the build),
// the JSON written.
int run_formats(const MpiSession& mpi, const Args& args, const ModelConfig& cfg, Backend& backend,
                bench::BenchClock& clock, Communicator& comm, const WeightSource& weights_of,
                bench::RunInfo info) {
  info.preset = args.preset;
  info.tp = mpi.size();
  info.k = cfg.block_size;
  info.iters = args.bench.iters;
  info.copy_bytes = static_cast<uint64_t>(args.bw_gib * double(1u << 30));
  info.bandwidth = clock.bandwidth(info.copy_bytes);  // before the weights take the memory
  info.bandwidth_method = clock.bandwidth_method();
  nlohmann::json runs = nlohmann::json::array();
  for (const bench::BenchFormat f : args.formats)
    run_format(mpi, args, cfg, f, backend, clock, comm, weights_of, info, runs);
  if (mpi.rank() == 0 && !args.json.empty()) {
    std::ofstream out(args.json);
    out << nlohmann::json{{"runs", runs}}.dump(1) << "\n";
    if (!out) fail("{}: write failed", args.json);
    spdlog::info("wrote {}", args.json);
  }
  return 0;
}

// The CPU backend: every call computes before it returns (eager, no graphs), MPI collectives across ranks.
int run_cpu(const MpiSession& mpi, const Args& args, const ModelConfig& cfg) {
  if (args.preset != "tiny")
    fail("--backend cpu runs the tiny preset only (--preset tiny): the {} weights take about 31 GB at tp 1",
         args.preset);
  if (!args.kernel_trace.empty()) fail("--kernel-trace: only the cuda backend records a kernel trace");
  CpuBackend backend;
  std::unique_ptr<Communicator> comm;
  if (mpi.size() > 1)
    comm = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD);
  else
    comm = std::make_unique<LocalCommunicator>();
  bench::HostClock clock(backend);
  bench::RunInfo info;
  info.backend = "cpu";
  info.device = "host CPU";
  info.graphs = false;
  info.tuning = args.tuning;
  const WeightSource weights_of = [&](const ModelConfig& c, const ShardPlan& plan, bench::BenchFormat f) {
    return bench::load_host_weights(c, plan, backend, args.bench.seed, f, mpi.rank());
  };
  return run_formats(mpi, args, cfg, backend, clock, *comm, weights_of, info);
}

#ifdef DSPARK_WITH_CUDA
int run_cuda(const MpiSession& mpi, const Args& args, const ModelConfig& cfg) {
  if (!args.kernel_trace.empty() && !cuda::kernel_trace_built())
    fail("--kernel-trace: this build records no kernel trace (configure with -DDSPARK_KERNEL_TRACE=ON)");
  CudaBackend backend(mpi.local_rank(), args.tuning);
  backend.set_kernel_trace_file(args.kernel_trace);
  NcclCommunicator comm(MPI_COMM_WORLD, backend.stream(), args.tuning);
  bench::CudaClock clock(backend);
  bench::RunInfo info;
  info.backend = "cuda";
  info.device = cuda::device_info(backend.device()).name;
  info.graphs = !args.eager;
  info.tuning = args.tuning;
  info.kernel_trace = args.kernel_trace;
  const bool lead = mpi.rank() == 0;
  const WeightSource weights_of = [&](const ModelConfig& c, const ShardPlan& plan, bench::BenchFormat f) {
    return bench::generate_device_weights(c, plan, backend, args.bench.seed, f, progress_printer(lead));
  };
  return run_formats(mpi, args, cfg, backend, clock, comm, weights_of, info);
}
#endif

int run(const MpiSession& mpi, Args args) {
  if (args.bench.batches.empty()) fail("--batch: give at least one batch size");
  if (args.formats.empty()) fail("--format: give at least one weight format");
  const bool cpu = args.backend == "cpu";
  if (args.preset.empty()) args.preset = cpu ? "tiny" : "v41-flash";
  if (args.bw_gib == 0) args.bw_gib = cpu ? 0.5 : 4.0;
  const ModelConfig cfg = args.preset == "tiny" ? tiny_model_config() : ModelConfig{};
  if (cpu) return run_cpu(mpi, args, cfg);
#ifdef DSPARK_WITH_CUDA
  return run_cuda(mpi, args, cfg);
#else
  fail("--backend cuda: this build has no CUDA backend (configure with -DDSPARK_CUDA=ON)");
#endif
}

}  // namespace

int main(int argc, char** argv) {
  MpiSession mpi(&argc, &argv);
  CLI::App app{"dspark_bench: DSpark draft-step and insert latency against the memory-bandwidth floor"};
  Args args;
  app.add_option("--backend", args.backend,
                 "cuda (one GPU per rank, NCCL) or cpu (the reference backend, MPI collectives, tiny preset)")
      ->check(CLI::IsMember({"cuda", "cpu"}))
      ->capture_default_str();
  app.add_option("--preset", args.preset,
                 "model sizes: v41-flash (DeepSeek-V4.1-Flash; the cuda default) or tiny (the cpu default)")
      ->check(CLI::IsMember({"v41-flash", "tiny"}));
  app.add_option("--batch", args.bench.batches, "draft batch sizes B")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  app.add_option("--insert-rows", args.bench.insert_rows, "context rows per measured insert")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  const std::map<std::string, bench::BenchFormat> formats{{"bf16", bench::BenchFormat::bf16},
                                                          {"fp8", bench::BenchFormat::fp8},
                                                          {"fp8-head", bench::BenchFormat::fp8_head},
                                                          {"exl3", bench::BenchFormat::exl3}};
  app.add_option("--format", args.formats,
                 "weight formats, measured one after the other in this run: bf16 (dense), fp8 (the release's "
                 "fp8 block linears and fp4 routed experts), fp8-head (fp8 with the head re-quantised to fp8 "
                 "block), exl3 (the seed's EXL3 mix)")
      ->transform(CLI::CheckedTransformer(formats, CLI::ignore_case))
      ->delimiter(',');
  app.add_option("--iters", args.bench.iters, "timed calls per measurement")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--warmup", args.bench.warmup, "untimed calls before them")
      ->check(CLI::Range(0, 1000000))
      ->capture_default_str();
  app.add_option("--context-rows", args.bench.context_rows, "random context rows per slot before drafting")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 16))
      ->capture_default_str();
  app.add_option("--seed", args.bench.seed, "seed of the weights, context rows and anchor tokens")
      ->capture_default_str();
  app.add_option(
         "--bw-gib", args.bw_gib,
         "size of the copy that measures bandwidth (GiB): device-to-device on cuda (default 4), a host "
         "memcpy on cpu (default 0.5)")
      ->check(CLI::PositiveNumber);
  app.add_flag("--eager", args.eager,
               "run draft steps eagerly instead of replaying CUDA graphs (cpu: always)");
  app.add_flag("--iteration", args.iteration,
               "also time whole steps: --accepted-rows new rows for each of B sequences, then their draft, "
               "through the step loop (one replay) and as an insert and a draft");
  app.add_flag(
      "--exchange-cost", args.exchange_cost,
      "also time each draft with its exchanges replaced by local copies of their results ('draft local-x' "
      "rows, on weights generated again) and print what the exchanges cost the step (at tp 1, where nothing "
      "crosses ranks: the copies' own cost)");
  app.add_flag("--sampled", args.bench.sampled,
               "also time each draft with every request sampled at temperature 1 ('draft sampled' rows) and "
               "with the first one also asking for its whole draft distribution ('draft sampled+q')");
  app.add_flag("--markov-cache", args.bench.markov_cache,
               "also time each draft with its Markov positions' previous tokens in the bias cache (100 % "
               "hits, 'draft cached' rows); the draft rows then run with the cache empty (0 % hits)");
  app.add_option("--accepted-rows", args.accepted_rows,
                 "new context rows per sequence in an --iteration step")
      ->check(CLI::Range(int64_t{1}, int64_t{64}))
      ->capture_default_str();
  app.add_option("--json", args.json, "also write the results as JSON to this file (rank 0)");
  // The optimisations (core/tuning.hpp), each on unless turned off here: one binary measures each's gain.
  const auto tuning_option = [&](const char* name, bool& value, const char* what) {
    app.add_option(name, value, std::string(what) + " (true or false)")
        ->default_str(value ? "true" : "false");
  };
  tuning_option("--pdl", args.tuning.pdl, "programmatic dependent launch");
  tuning_option("--weight-tiles", args.tuning.weight_tiles,
                "experts in mma tiles, tiled copies of the attention layers, head and markov_head");
  tuning_option("--head-tiles", args.tuning.head_tiles, "the head's tiled copy, with --weight-tiles");
  tuning_option("--peer-sum", args.tuning.peer_sum,
                "tp 2: sums and argmax exchanges through peer buffers instead of NCCL's collectives");
  tuning_option("--bf16-copies", args.tuning.bf16_copies,
                "exact bf16 copies of an fp8 main_proj and wkv for products of at least 17 rows");
  app.add_option("--kernel-trace", args.kernel_trace,
                 "append each replayed step's kernel start trace to FILE.gpu<device> (builds configured with "
                 "-DDSPARK_KERNEL_TRACE=ON only)")
      ->option_text("FILE");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return mpi.rank() == 0 ? app.exit(e) : (e.get_exit_code() == 0 ? 0 : 1);
  }
  if (args.iteration) args.bench.accepted_rows = args.accepted_rows;
  try {
    return run(mpi, args);
  } catch (const std::exception& e) {
    spdlog::error("rank {}: {}", mpi.rank(), e.what());
    // A rank that fails alone would leave the others waiting in a collective: end the whole job.
    if (mpi.size() > 1) MPI_Abort(MPI_COMM_WORLD, 1);
    return 1;
  }
}
