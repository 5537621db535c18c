// dspark_client [--ring NAME] [--uid UID] info|bench|status|health|stats|stop: a host or an observer of a
// running worker. `info` and `bench` attach as the host, through the C++ client wrapper; `bench` drives the
// seeded engine simulation (the worker's --local-driver engine) over the host interface: each simulated step
// becomes one dspark_step (resets + context rows + one draft batch). `status`, `health`, `stats` and `stop`
// are an observer's (no host slot: they work while an engine is attached). `stop` sends SIGTERM to rank 0
// (the socket's SO_PEERCRED pid), the one stop under mpirun that ends with exit status 0.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "client/dspark_client.hpp"
#include "lib/config/worker_config.hpp"
#include "lib/host/door_client.hpp"
#include "lib/host/liveness.hpp"
#include "lib/host/socket_path.hpp"
#include "lib/runtime/engine_sim.hpp"

namespace {

struct BenchOptions {
  int64_t steps = 100;
  dspark::EngineSimOptions engine;
  int64_t print_drafts = 0;
  int64_t step_rows = 0;  // context rows the simulation sends per step; 0 = the worker's max_context_rows
  bool no_margins = false;
  int64_t warmup = 0;  // untimed steps first
};

const char* state_name(uint32_t s) {
  static const char* names[] = {"starting", "serving", "draining", "unhealthy", "stopped"};
  return s < 5 ? names[s] : "unknown";
}

const char* format_name(uint32_t code) {
  static const char* names[] = {"dense", "fp8_block", "fp4", "exl3"};
  return code < 4 ? names[code] : "unknown";
}

void print_info(const dspark_model_info& m, const std::vector<int32_t>& tapped_layers, int32_t noise_token) {
  std::vector<std::string_view> formats;
  for (uint32_t code = 0; code < 32; ++code)
    if (m.weight_formats & (1u << code)) formats.push_back(format_name(code));
  fmt::print(
      "vocab_size {}\nhidden {}\ntaps {}\nrow_bytes {}\nblock_size {}\nwindow {}\nslots {}\nmax_batch {}\n"
      "max_context_rows {}\ntp {}\nmax_model_len {}\nweight_formats {}\nhead_format {}\n"
      "tapped_layers {}\nnoise_token {}\nprotocol_version {}\n",
      m.vocab_size, m.hidden, m.taps, m.row_bytes, m.block_size, m.window, m.slots, m.max_batch,
      m.max_context_rows, m.tp, m.max_model_len, fmt::join(formats, ","), format_name(m.head_format),
      fmt::join(tapped_layers, ","), noise_token, dspark::protocol_version());
}

void print_stats(const dspark_stats& s) {
  fmt::print(
      "steps {}\nfailed_steps {}\nrejected_messages {}\ndrafts {}\ncontext_rows {}\nresets {}\n"
      "hosts_attached {}\nhosts_lost {}\nhosts_refused {}\nstep_us p50 {:.1f} p99 {:.1f} max {:.1f}\n",
      s.steps, s.failed_steps, s.rejected_messages, s.drafts, s.context_rows, s.resets, s.hosts_attached,
      s.hosts_lost, s.hosts_refused, s.step_us_p50, s.step_us_p99, s.step_us_max);
}

// Acceptance and the Markov bias cache (protocol version 6's part of the stats answer).
void print_serving_stats(const dspark_serving_stats& m) {
  std::vector<std::string> hot;
  for (uint32_t i = 0; i < m.hot_uncached && i < DSPARK_HOT_UNCACHED_TOKENS; ++i)
    hot.push_back(fmt::format("{}:{}", m.hot_tokens[i], m.hot_seen[i]));
  fmt::print(
      "acceptance_reports {}\naccepted_tokens {}\nmarkov_cache_lookups {}\nmarkov_cache_hits {}\n"
      "hot_uncached_tokens {}\n",
      m.acceptance_reports, m.accepted_tokens, m.markov_lookups, m.markov_hits,
      hot.empty() ? std::string("none") : fmt::format("{}", fmt::join(hot, ",")));
}

// p50 / p99 / max of latencies in microseconds.
void print_latency(const char* what, std::vector<double> us) {
  if (us.empty()) {
    fmt::print("  {:<22} -\n", what);
    return;
  }
  std::sort(us.begin(), us.end());
  const auto at = [&](double q) {
    const auto i = static_cast<size_t>(std::ceil(q * static_cast<double>(us.size()))) - 1;
    return us[std::min(i, us.size() - 1)];
  };
  fmt::print("  {:<22} n {:>7}  p50 {:>9.1f}  p99 {:>9.1f}  max {:>9.1f}\n", what, us.size(), at(0.5),
             at(0.99), us.back());
}

void print_drafts(int64_t step, const dspark::StepPlan& plan, const dspark::DraftBatch& b) {
  for (uint32_t i = 0; i < b.n; ++i) {
    const auto& r = plan.drafts[i];
    const auto row = [&](const std::vector<float>& v) {
      return std::vector<float>(v.begin() + i * b.k, v.begin() + (i + 1) * b.k);
    };
    fmt::print("step {} slot {} pos {} anchor {}: tokens {} conf {::.3f} margin {::.3f}\n", step, r.slot,
               r.anchor_pos, r.anchor_token,
               std::vector<int32_t>(b.ids.begin() + i * b.k, b.ids.begin() + (i + 1) * b.k), row(b.conf),
               row(b.margin));
  }
}

// Whether process `pid` has ended: gone, or a zombie not yet reaped (kill(pid, 0) still succeeds on those).
bool process_ended(int32_t pid) {
  if (!dspark::host::process_alive(pid)) return true;
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  std::getline(stat, line);
  const size_t comm_end = line.rfind(')');  // "pid (comm) state ...": comm may hold spaces and parentheses
  return comm_end != std::string::npos && comm_end + 2 < line.size() &&
         (line[comm_end + 2] == 'Z' || line[comm_end + 2] == 'X');
}

// While attach waits for the worker to serve, watches the worker's process (--worker-pid, e.g. the `$!` of a
// backgrounded mpirun): a worker that fails to start ends the wait at once with exit status 3, instead of
// after the whole --timeout-ms. Attach cannot be interrupted, hence _exit from this thread.
class StartWatch {
 public:
  StartWatch(int32_t pid, std::string ring) : pid_(pid) {
    if (pid_ <= 0) return;
    thread_ = std::thread([this, ring = std::move(ring)] {
      while (!done_.load()) {
        if (process_ended(pid_)) {
          fmt::print(stderr,
                     "dspark_client: the worker (pid {}) exited before {} served; its output says why\n",
                     pid_, ring);
          std::fflush(stderr);
          ::_exit(3);
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    });
  }
  ~StartWatch() {
    done_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  StartWatch(const StartWatch&) = delete;
  StartWatch& operator=(const StartWatch&) = delete;

 private:
  int32_t pid_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

// What an observer of `ring` gets: retried until the deadline while no worker listens there (or, with
// `until_serving`, while the worker is not serving yet). Nothing when the deadline passes or the worker
// refuses; `why` says why.
std::optional<dspark::host::DoorAnswer> observe(const std::string& ring, uint32_t uid, int32_t timeout_ms,
                                                bool until_serving, std::string& why) {
  using dspark::host::DoorAnswer;
  std::string path;
  try {
    path = dspark::host::socket_path(ring);
  } catch (const std::exception& e) {
    why = e.what();
    return std::nullopt;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    DoorAnswer a = dspark::host::knock(path, uid, dspark::host::PeerKind::observer, std::chrono::seconds(5));
    why = a.why;
    if (a.kind == DoorAnswer::Kind::refused || a.kind == DoorAnswer::Kind::wrong_owner) return std::nullopt;
    if (a.kind == DoorAnswer::Kind::accepted) {
      if (!until_serving || a.observation.state == static_cast<uint32_t>(dspark::host::WorkerState::serving))
        return a;
      why = fmt::format("the worker (pid {}) is {}", a.worker.pid, state_name(a.observation.state));
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      why = fmt::format("{} after {} ms", why, timeout_ms);
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

dspark_stats c_stats(const dspark::host::StatsResponse& s) {
  return {s.steps,        s.failed_steps, s.rejected_messages, s.drafts,
          s.context_rows, s.resets,       s.hosts_attached,    s.hosts_lost,
          s.step_us_p50,  s.step_us_p99,  s.step_us_max,       s.hosts_refused};
}

dspark_serving_stats c_serving_stats(const dspark::host::StatsMore& m) {
  dspark_serving_stats s{
      m.acceptance_reports, m.accepted_tokens, m.markov_lookups, m.markov_hits, m.hot_uncached, {}, {}};
  for (uint32_t i = 0; i < DSPARK_HOT_UNCACHED_TOKENS; ++i) {
    s.hot_tokens[i] = m.hot_tokens[i];
    s.hot_seen[i] = m.hot_seen[i];
  }
  return s;
}

void print_status(const dspark::host::DoorAnswer& a) {
  const dspark::host::Observation& o = a.observation;
  fmt::print("state {}\nworker_pid {}\nhost_pid {}\ntp {}\nfailed_in_a_row {}\n", state_name(o.state),
             a.worker.pid, o.host_pid == 0 ? std::string("none") : std::to_string(o.host_pid), o.model.tp,
             o.failed_in_a_row);
  print_stats(c_stats(o.stats));
}

// Sends SIGTERM to the worker's rank 0 (the socket's peer) and waits for it to end: rank 0 answers the step
// in flight and broadcasts the shutdown to every rank, so mpirun exits 0. (SIGTERM to mpirun itself makes it
// kill the ranks and exit 1 however cleanly they stop.) Needs no host slot: works while an engine is
// attached.
int stop_worker(const std::string& ring, uint32_t uid, int32_t timeout_ms) {
  std::string why;
  const std::optional<dspark::host::DoorAnswer> a = observe(ring, uid, 0, false, why);
  if (!a) {
    fmt::print(stderr, "dspark_client: no worker to stop: {}\n", why);
    return 3;
  }
  const int32_t pid = a->worker.pid;
  if (process_ended(pid) ||
      a->observation.state == static_cast<uint32_t>(dspark::host::WorkerState::stopped)) {
    fmt::print(stderr, "dspark_client: no worker runs on {} (its rank 0, pid {}, has ended)\n", ring, pid);
    return 3;
  }
  if (::kill(pid, SIGTERM) != 0) {
    fmt::print(stderr, "dspark_client: cannot signal the worker's rank 0 (pid {}): {}\n", pid,
               std::strerror(errno));
    return 1;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (!process_ended(pid)) {
    if (std::chrono::steady_clock::now() >= deadline) {
      fmt::print(stderr, "dspark_client: sent SIGTERM to rank 0 (pid {}); still running after {} ms\n", pid,
                 timeout_ms);
      return 3;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fmt::print("stopped the worker of {} (rank 0, pid {})\n", ring, pid);
  return 0;
}

int bench(dspark::Client& c, const BenchOptions& o) {
  const dspark_model_info m = c.model();
  dspark::EngineShape shape;
  shape.vocab_size = m.vocab_size;
  shape.block_size = m.block_size;
  shape.row_dim = m.row_bytes / 2;
  shape.slots = m.slots;
  shape.max_batch = m.max_batch;
  shape.max_context_rows = o.step_rows > 0 ? o.step_rows : m.max_context_rows;
  shape.max_model_len = m.max_model_len;
  dspark::EngineSim sim(shape, o.engine);
  fmt::print(
      "bench: {} steps after {} untimed, {} sequences, prefill {}, {}, seed {}, up to {} rows per step\n",
      o.steps, o.warmup, sim.sequences(), o.engine.prefill_rows,
      o.engine.accepted_rows > 0 ? fmt::format("{} rows per sequence per step", o.engine.accepted_rows)
                                 : fmt::format("acceptance {}", o.engine.accept_prob),
      o.engine.seed, shape.max_context_rows);

  std::vector<double> with_ctx, without_ctx, all;
  uint64_t rows_sent = 0, drafts = 0;
  std::vector<dspark::Context> ctx;
  std::vector<dspark_draft_request> reqs;
  const int64_t every = std::max<int64_t>(1, o.steps / 10);
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  for (int64_t n = -o.warmup; n < o.steps; ++n) {
    const int64_t i = std::max<int64_t>(n, 0);  // the timed step's index
    if (n == 0) start = Clock::now();
    const dspark::StepPlan plan = sim.next_step();
    ctx.clear();
    size_t at = 0;
    for (const dspark::ContextBlock& b : plan.contexts) {
      ctx.push_back({b.slot, b.first_pos, b.rows, plan.rows.data() + at});
      at += static_cast<size_t>(b.rows) * static_cast<size_t>(shape.row_dim);
      if (n >= 0) rows_sent += static_cast<uint64_t>(b.rows);
    }
    reqs.clear();
    for (const dspark::DraftRequest& d : plan.drafts)
      reqs.push_back({d.slot, d.anchor_token, d.anchor_pos, d.window_low, d.outputs, d.accepted >= 0 ? 1 : 0,
                      d.accepted >= 0 ? d.accepted : 0});
    const auto t0 = Clock::now();
    const dspark::DraftBatch batch = c.step(plan.resets, ctx, reqs, !o.no_margins);  // throws on non-OK
    const double us = std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
    sim.step_done(plan, true);
    if (n < 0) continue;
    (ctx.empty() ? without_ctx : with_ctx).push_back(us);
    all.push_back(us);
    drafts += reqs.size();
    if (i < o.print_drafts) print_drafts(i, plan, batch);
    if ((i + 1) % every == 0 || i + 1 == o.steps) {
      const double s = std::chrono::duration<double>(Clock::now() - start).count();
      fmt::print("progress: {}/{} steps, {:.1f} steps/s\n", i + 1, o.steps, static_cast<double>(i + 1) / s);
    }
  }
  const double total = std::chrono::duration<double>(Clock::now() - start).count();
  fmt::print("done: {} steps in {:.3f} s ({:.1f} steps/s), {} draft requests, {} context rows sent\n",
             o.steps, total, static_cast<double>(o.steps) / total, drafts, rows_sent);
  fmt::print("latency per dspark_step (microseconds, round trip):\n");
  print_latency("step with context", with_ctx);
  print_latency("step without context", without_ctx);
  print_latency("overall", all);
  fmt::print("worker stats:\n");
  print_stats(c.stats());
  print_serving_stats(c.serving_stats());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "dspark_client: a host or observer of a dspark worker (info, bench; status, health, stats, stop)"};
  std::string ring = dspark::default_ring_name();
  int32_t timeout_ms = 30000;
  int32_t worker_pid = 0;
  uint32_t uid = ::geteuid();
  app.add_option("--ring", ring, "the worker's ring.name, or its socket's full path")->capture_default_str();
  app.add_option("--uid", uid, "the uid the worker must run as (default: this user's)");
  app.add_option("--timeout-ms", timeout_ms, "attach and per-call wait limit")->default_val(30000);
  app.add_option("--worker-pid", worker_pid,
                 "the worker's process (e.g. $! of a backgrounded mpirun): if it exits while attach waits, "
                 "say so at once (exit 3) instead of waiting --timeout-ms")
      ->check(CLI::PositiveNumber);
  // What this client speaks, for matching it against a worker's (docs/clients.md, "Protocol versions").
  app.set_version_flag("--version",
                       fmt::format("dspark_client: protocol version {}", dspark::protocol_version()));
  app.require_subcommand(1);
  CLI::App* info = app.add_subcommand("info", "print the model description of the attach answer");
  CLI::App* status = app.add_subcommand("status", "print the worker's state, pids, health and counters now");
  CLI::App* health = app.add_subcommand("health", "wait until the worker serves, then print its health");
  CLI::App* stats =
      app.add_subcommand("stats", "wait until the worker serves, then print its counters and step latencies");
  CLI::App* bench_cmd = app.add_subcommand("bench", "drive the seeded engine simulation through the worker");
  CLI::App* stop = app.add_subcommand(
      "stop", "stop the worker cleanly: SIGTERM to its rank 0, then wait (up to --timeout-ms) for it to end");
  BenchOptions bo;
  bench_cmd->add_option("--steps", bo.steps, "steps to run")->default_val(100)->check(CLI::PositiveNumber);
  bench_cmd->add_option("--sequences", bo.engine.sequences, "sequences (slots) drafted per step")
      ->default_val(4);
  bench_cmd->add_option("--prefill", bo.engine.prefill_rows, "context rows of each new sequence")
      ->default_val(24);
  bench_cmd->add_option("--accept", bo.engine.accept_prob, "per-token acceptance probability")
      ->default_val(0.7);
  bench_cmd
      ->add_option(
          "--accepted-rows", bo.engine.accepted_rows,
          "every sequence sends exactly this many rows per step (a fixed step shape, as dspark_bench "
          "--iteration's --accepted-rows; 0: the seeded acceptance's)")
      ->default_val(0)
      ->check(CLI::Range(0, 64));
  bench_cmd
      ->add_option("--warmup", bo.warmup, "untimed steps before the timed ones (the prefills among them)")
      ->default_val(0)
      ->check(CLI::NonNegativeNumber);
  bench_cmd->add_option("--seed", bo.engine.seed, "seed of rows, tokens and acceptance")->default_val(0);
  bench_cmd->add_option("--print-drafts", bo.print_drafts, "print the drafts of the first K steps")
      ->default_val(0);
  bench_cmd->add_option(
      "--step-rows", bo.step_rows,
      "context rows the simulation may send per step (default: the worker's max_context_rows; "
      "more makes the client split sends)");
  bench_cmd->add_flag("--no-margins", bo.no_margins, "draft without margins");
  CLI11_PARSE(app, argc, argv);

  try {
    if (stop->parsed()) return stop_worker(ring, uid, timeout_ms);
    std::optional<StartWatch> watch(std::in_place, worker_pid, ring);
    if (status->parsed() || health->parsed() || stats->parsed()) {
      std::string why;
      const std::optional<dspark::host::DoorAnswer> a =
          observe(ring, uid, timeout_ms, !status->parsed(), why);
      watch.reset();
      if (!a) {
        fmt::print(stderr, "dspark_client: {}\n", why);
        return 3;
      }
      const dspark::host::Observation& o = a->observation;
      if (status->parsed()) print_status(*a);
      if (health->parsed())
        fmt::print("state {}\ntp {}\nsteps {}\nfailed_in_a_row {}\n", state_name(o.state), o.model.tp,
                   o.stats.steps, o.failed_in_a_row);
      if (stats->parsed()) {
        print_stats(c_stats(o.stats));
        print_serving_stats(c_serving_stats(a->observation_more));
      }
      return 0;
    }
    dspark::Client c(ring, timeout_ms, uid);
    watch.reset();
    if (info->parsed()) print_info(c.model(), c.tapped_layers(), c.noise_token());
    if (bench_cmd->parsed()) return bench(c, bo);
  } catch (const dspark::ClientError& e) {
    fmt::print(stderr, "dspark_client: {}\n", e.what());
    return e.status() == DSPARK_UNAVAILABLE ? 3 : 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "dspark_client: {}\n", e.what());
    return 1;
  }
  return 0;
}
