#include "lib/bench/ring_steps.hpp"

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <thread>

#include "client/dspark_client.hpp"
#include "lib/core/error.hpp"
#include "lib/core/sampling.hpp"
#include "lib/host/ring.hpp"
#include "lib/host/socket_path.hpp"
#include "lib/model/forwarding_engine.hpp"
#include "lib/runtime/step_loop.hpp"
#include "lib/serve/host_server.hpp"
#include "lib/serve/model_description.hpp"

namespace dspark::bench {
namespace {

// "" when the ring's answer equals the direct step's, bit for bit; else the first difference.
template <typename T>
std::string first_difference(const char* what, const std::vector<T>& ring, const std::vector<T>& direct) {
  if (ring.size() != direct.size())
    return fmt::format("{}: {} values through the ring, {} directly", what, ring.size(), direct.size());
  for (size_t i = 0; i < ring.size(); ++i)
    if (std::memcmp(&ring[i], &direct[i], sizeof(T)) != 0)
      return fmt::format("{}[{}]: {} through the ring, {} directly", what, i, ring[i], direct[i]);
  return {};
}

std::string compare(const dspark::DraftBatch& ring, const DraftResult& direct) {
  for (const std::string& d :
       {first_difference("ids", ring.ids, direct.ids), first_difference("conf", ring.conf, direct.conf),
        first_difference("conf_logit", ring.conf_logit, direct.conf_logit),
        first_difference("margin", ring.margin, direct.margin)})
    if (!d.empty()) return d;
  return {};
}

using Clock = std::chrono::steady_clock;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}

// Rank 0's drafter behind the step loop, stamping when each step's drafter call starts and returns, so that a
// round trip splits into the way to the drafter, the drafter's call and the way back.
class StampedEngine final : public ForwardingEngine {
 public:
  using ForwardingEngine::ForwardingEngine;
  DraftResult draft(std::span<const DraftRequest> r, bool m) override {
    started_.store(now_ns(), std::memory_order_release);
    DraftResult out = d_.draft(r, m);
    ended_.store(now_ns(), std::memory_order_release);
    return out;
  }
  DraftResult insert_and_draft(std::span<const ContextBlock> b, const bf16_t* rows,
                               std::span<const DraftRequest> r, bool m) override {
    started_.store(now_ns(), std::memory_order_release);
    DraftResult out = d_.insert_and_draft(b, rows, r, m);
    ended_.store(now_ns(), std::memory_order_release);
    return out;
  }
  // The last step's drafter call, steady-clock nanoseconds (read by the host thread once the answer is in:
  // the ring's publish orders them before it).
  int64_t started() const { return started_.load(std::memory_order_acquire); }
  int64_t ended() const { return ended_.load(std::memory_order_acquire); }

 private:
  std::atomic<int64_t> started_{0}, ended_{0};
};

// An engine is another process, on CPUs of its own; this thread stands in for it inside rank 0, which
// mpirun binds to one core by default (--bind-to core up to two ranks). There the host's spin while it
// waits for an answer would take turns with the drafter's own spin on its ticket. So the thread moves to
// the machine's CPUs outside rank 0's binding; the number of them, or 0 where there are none (an unbound
// process: the scheduler places both) or the move is refused.
int move_off_the_drafters_cpus() {
  cpu_set_t mine;
  CPU_ZERO(&mine);
  if (pthread_getaffinity_np(pthread_self(), sizeof(mine), &mine) != 0) return 0;
  const long n = sysconf(_SC_NPROCESSORS_CONF);
  cpu_set_t others;
  CPU_ZERO(&others);
  for (long c = 0; c < n && c < CPU_SETSIZE; ++c)
    if (!CPU_ISSET(c, &mine)) CPU_SET(c, &others);
  if (CPU_COUNT(&others) == 0 || pthread_setaffinity_np(pthread_self(), sizeof(others), &others) != 0)
    return 0;
  return CPU_COUNT(&others);
}

struct ClientSteps {
  // Per batch size, us: the round trips, and each one's parts before, in and after the drafter's call.
  std::vector<std::vector<double>> round_trips, to_drafter, in_drafter, from_drafter;
  std::string error;  // what failed ("" when every step went through)
};

// The host's side: attach, every batch size's warm-up and timed steps, detach.
void drive(const std::string& ring, const std::vector<StepPlan>& plans,
           const std::vector<DraftResult>& direct, const BenchOptions& opt, const StampedEngine& engine,
           ClientSteps& out) {
  dspark::Client c(ring, 30000);
  const size_t row_values = c.row_values();
  for (size_t i = 0; i < plans.size(); ++i) {
    const StepPlan& plan = plans[i];
    std::vector<dspark::Context> ctx;
    size_t at = 0;
    for (const ContextBlock& b : plan.contexts) {
      ctx.push_back({b.slot, b.first_pos, b.rows, plan.rows.data() + at});
      at += static_cast<size_t>(b.rows) * row_values;
    }
    std::vector<dspark_draft_request> reqs;
    for (const DraftRequest& d : plan.drafts)
      reqs.push_back({d.slot, d.anchor_token, d.anchor_pos, d.window_low, d.outputs, 0, 0});
    const auto step = [&] { return c.step({}, ctx, reqs, plan.margin); };
    if (const std::string d = compare(step(), direct[i]); !d.empty())
      throw Error(fmt::format("B = {}: the drafts through the ring differ from the step's: {}",
                              plan.drafts.size(), d));
    for (int w = 1; w < opt.warmup; ++w) step();
    std::vector<double>& us = out.round_trips.emplace_back();
    std::vector<double>& to = out.to_drafter.emplace_back();
    std::vector<double>& in = out.in_drafter.emplace_back();
    std::vector<double>& from = out.from_drafter.emplace_back();
    for (int n = 0; n < opt.iters; ++n) {
      const int64_t t0 = now_ns();
      step();
      const int64_t t1 = now_ns(), s0 = engine.started(), s1 = engine.ended();
      us.push_back(static_cast<double>(t1 - t0) / 1e3);
      to.push_back(static_cast<double>(s0 - t0) / 1e3);
      in.push_back(static_cast<double>(s1 - s0) / 1e3);
      from.push_back(static_cast<double>(t1 - s1) / 1e3);
    }
  }
  c.detach();
}

}  // namespace

std::vector<Measurement> ring_steps(Bench& bench, Drafter& drafter, Communicator& comm,
                                    const RingStepOptions& options) {
  const ModelConfig& cfg = drafter.config();
  const DrafterOptions& dopt = drafter.options();
  std::vector<StepPlan> plans;
  std::vector<Measurement> rows;
  std::vector<DraftResult> direct;
  int64_t max_rows = 1;
  for (const int64_t B : options.batches) {
    plans.push_back(bench.step_plan(B));
    rows.push_back(bench.step_shape(plans.back(), "step_ring"));
    const StepResult r = execute_step(drafter, comm, plans.back());
    if (!r.status.ok()) fail("bench: the B = {} step failed: {}", B, r.status.message);
    direct.push_back(r.draft);
    max_rows = std::max<int64_t>(max_rows, static_cast<int64_t>(plans.back().rows.size()) / cfg.row_dim());
  }

  const StepLimits limits{dopt.slots,         dopt.max_batch,     max_rows,
                          dopt.max_model_len, dopt.max_model_len, cfg.vocab_size,
                          cfg.block_size,     cfg.row_dim(),      dopt.max_distributions};
  std::atomic<bool> stop{false};
  ClientSteps steps;
  int rc = 0;
  if (comm.rank() == 0) {
    // A name of this process's own, in the default socket directory.
    const std::string ring = fmt::format("dspark-bench-{}", getpid());
    const host::ServerOptions so{
        host::socket_path(ring),
        "",
        std::chrono::milliseconds(5000),
        nullptr,
        describe_taps(cfg),
        host::SamplingLimits{static_cast<uint32_t>(dopt.max_distributions), kMaxTemperature},
        host::spin_ahead_setting().value_or(options.cuda_backend)};
    const ServedLimits served{dopt.slots, dopt.max_batch, max_rows, dopt.max_model_len, comm.size()};
    host::HostServer server(so, describe_model(cfg, served), stop);
    const LoadedFormats formats = loaded_formats(drafter.weights());
    server.set_weight_formats(formats.bits, format_code(drafter.weights().head.format));
    server.set_serving();
    StampedEngine engine(drafter);
    std::thread host([&] {
      if (const int cpus = move_off_the_drafters_cpus(); cpus > 0)
        spdlog::info("the ring's host thread runs on the {} CPUs outside rank 0's binding", cpus);
      else
        spdlog::info("the ring's host thread runs on rank 0's CPUs (the process is not bound, or no others)");
      try {
        drive(ring, plans, direct, bench.options(), engine, steps);
      } catch (const std::exception& e) {
        steps.error = e.what();
      }
      stop.store(true);
    });
    try {
      rc = run_step_loop(engine, comm, &server, limits, LoopOptions{});
    } catch (...) {
      stop.store(true);
      server.set_unhealthy();  // a host waiting on the failed step hears so at once
      host.join();
      throw;
    }
    host.join();
  } else {
    rc = run_step_loop(drafter, comm, nullptr, limits, LoopOptions{});
  }
  if (comm.any(rc != 0 || !steps.error.empty()))
    fail("bench: the steps through the ring failed{}", !steps.error.empty() ? ": " + steps.error
                                                       : rc != 0 ? fmt::format(" (step loop exit {})", rc)
                                                                 : std::string(" on another rank"));
  if (comm.rank() != 0) return {};
  for (size_t i = 0; i < rows.size(); ++i) {
    rows[i].latency = summarize(steps.round_trips[i]);
    rows[i].ring_to_drafter = summarize(steps.to_drafter[i]);
    rows[i].ring_drafter = summarize(steps.in_drafter[i]);
    rows[i].ring_from_drafter = summarize(steps.from_drafter[i]);
  }
  return rows;
}

}  // namespace dspark::bench
