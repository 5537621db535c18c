#include "lib/bench/ring_steps.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <string>
#include <thread>

#include "client/dspark_client.hpp"
#include "lib/core/error.hpp"
#include "lib/core/sampling.hpp"
#include "lib/host/ring.hpp"
#include "lib/host/socket_path.hpp"
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

struct ClientSteps {
  std::vector<std::vector<double>> round_trips;  // per batch size, us
  std::string error;                             // what failed ("" when every step went through)
};

// The host's side: attach, every batch size's warm-up and timed steps, detach.
void drive(const std::string& ring, const std::vector<StepPlan>& plans,
           const std::vector<DraftResult>& direct, const BenchOptions& opt, ClientSteps& out) {
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
    for (int n = 0; n < opt.iters; ++n) {
      const auto t0 = std::chrono::steady_clock::now();
      step();
      us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
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
    std::thread host([&] {
      try {
        drive(ring, plans, direct, bench.options(), steps);
      } catch (const std::exception& e) {
        steps.error = e.what();
      }
      stop.store(true);
    });
    try {
      rc = run_step_loop(drafter, comm, &server, limits, LoopOptions{});
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
  for (size_t i = 0; i < rows.size(); ++i) rows[i].latency = summarize(steps.round_trips[i]);
  return rows;
}

}  // namespace dspark::bench
