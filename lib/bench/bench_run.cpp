#include "lib/bench/bench_run.hpp"

#include <fmt/format.h>

#include <random>
#include <set>
#include <utility>

#include "lib/api/step_plan.hpp"
#include "lib/core/error.hpp"
#include "lib/core/numeric.hpp"
#include "lib/runtime/step_loop.hpp"

namespace dspark::bench {
namespace {

// n random context rows [n, 3H] (bf16 bits), unit variance like the normalised hidden states they stand for,
// in row memory as a worker's decoded rows are (page-locked on the cuda backend).
RowVector random_rows(const ModelConfig& cfg, int64_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> z;
  RowVector rows(static_cast<size_t>(n * cfg.row_dim()));
  for (bf16_t& v : rows) v = float_to_bf16(z(g));
  return rows;
}

}  // namespace

Bench::Bench(Drafter& drafter, Backend& backend, BenchClock& clock, Communicator& comm, double bandwidth,
             BenchOptions options)
    : drafter_(drafter),
      be_(backend),
      clock_(clock),
      comm_(comm),
      bandwidth_(bandwidth),
      opt_(std::move(options)) {
  if (opt_.iters < 1 || opt_.warmup < 0) fail("bench: iters must be positive and warmup non-negative");
  if (opt_.context_rows < 1) fail("bench: context rows must be positive");
}

void Bench::fill_context() {
  const DrafterOptions& o = drafter_.options();
  for (int64_t s = 0; s < o.slots; ++s) {
    const RowVector rows =
        random_rows(drafter_.config(), opt_.context_rows, opt_.seed * 1000 + static_cast<uint64_t>(s));
    drafter_.insert(s, 0, rows.data(), opt_.context_rows);
  }
  be_.synchronize();
}

std::vector<DraftRequest> Bench::requests(int64_t batch) const {
  // The same seed on every rank: every rank must draft the same batch.
  std::mt19937_64 g(opt_.seed * 7919 + static_cast<uint64_t>(batch));
  std::uniform_int_distribution<int32_t> token(0, static_cast<int32_t>(drafter_.config().vocab_size - 1));
  std::vector<DraftRequest> reqs;
  for (int64_t b = 0; b < batch; ++b)
    reqs.push_back({static_cast<int32_t>(b), token(g), static_cast<int32_t>(opt_.context_rows), -1, 0});
  return reqs;
}

// One untimed draft with the routing traced: routing is replicated (identical on every rank) and
// deterministic, so the timed calls with the same batch select the same experts.
std::vector<std::vector<int32_t>> Bench::routed_experts(const std::vector<DraftRequest>& reqs) {
  const int64_t stages = drafter_.config().n_mtp_layers;
  std::vector<std::set<int32_t>> sets(static_cast<size_t>(stages));
  drafter_.set_trace([&](const std::string& name, const Tensor& t) {
    for (int64_t i = 0; i < stages; ++i) {
      if (name != fmt::format("stage{}.route_ids", i)) continue;
      std::vector<int32_t> ids(static_cast<size_t>(t.numel()));
      be_.download(ids.data(), t);
      sets[static_cast<size_t>(i)].insert(ids.begin(), ids.end());
    }
  });
  try {
    drafter_.draft(reqs);
  } catch (...) {
    drafter_.set_trace({});
    throw;
  }
  drafter_.set_trace({});
  std::vector<std::vector<int32_t>> out;
  for (const auto& s : sets) out.emplace_back(s.begin(), s.end());
  return out;
}

void Bench::collectives(int64_t batch, Measurement& m) {
  const ModelConfig& cfg = drafter_.config();
  if (comm_.size() == 1) return;  // the communicator returns at once: nothing crosses ranks
  const Tensor partial = be_.alloc(DType::f32, {batch * cfg.block_size, cfg.dim});
  // Zeros: records the merge folds like any others (what is timed is the exchange, not its values).
  const Tensor cand = be_.alloc(DType::i32, {batch, kMarkovRecordWords});
  for (int i = 0; i < opt_.warmup; ++i) {
    comm_.all_reduce_sum(partial);
    comm_.argmax_exchange(cand);
  }
  m.all_reduce_us =
      summarize(clock_.time_queued(comm_, opt_.iters, [&] { comm_.all_reduce_sum(partial); })).median_us;
  m.exchange_us =
      summarize(clock_.time_queued(comm_, opt_.iters, [&] { comm_.argmax_exchange(cand); })).median_us;
  m.collectives_us = 2.0 * static_cast<double>(cfg.n_mtp_layers) * m.all_reduce_us +
                     static_cast<double>(cfg.block_size) * m.exchange_us;

  // The same collectives recorded back to back in one graph, as a replayed draft step runs them (there
  // between kernels): what the step pays for them, without the eager launches.
  if (!drafter_.options().use_graphs) return;
  const auto step_collectives = [&] {
    for (int64_t i = 0; i < 2 * cfg.n_mtp_layers; ++i) comm_.all_reduce_sum(partial);
    for (int64_t j = 0; j < cfg.block_size; ++j) comm_.argmax_exchange(cand);
  };
  be_.begin_capture();
  try {
    step_collectives();
  } catch (...) {
    be_.end_capture();
    throw;
  }
  const std::shared_ptr<void> graph = be_.end_capture();
  if (!graph) fail("bench: recording the collectives of a B = {} step failed", batch);
  for (int i = 0; i < opt_.warmup; ++i) be_.replay(graph);
  m.collectives_graph_us =
      summarize(clock_.time_queued(comm_, opt_.iters, [&] { be_.replay(graph); })).median_us;
}

StepBytes Bench::draft_bytes(const std::vector<DraftRequest>& reqs, Measurement& m, int64_t cached_rows) {
  const ModelConfig& cfg = drafter_.config();
  const int64_t batch = static_cast<int64_t>(reqs.size());
  DraftTouch touch;
  touch.experts = routed_experts(reqs);
  std::set<int32_t> tokens{static_cast<int32_t>(cfg.noise_token_id)};
  for (const DraftRequest& r : reqs) tokens.insert(r.anchor_token);
  touch.embed_rows = static_cast<int64_t>(tokens.size());
  // A cached position reads its bias row, not markov_embed's row and markov_head.
  touch.markov_embed_rows = batch * cfg.block_size - cached_rows;
  touch.markov_positions = cached_rows == batch * cfg.block_size ? 0 : cfg.block_size;
  touch.markov_cached_rows = cached_rows;
  // The whole distribution's pass reads markov_head once more (the bias rows of up to 32 positions).
  for (const DraftRequest& r : reqs) touch.markov_positions += r.distribution ? 1 : 0;
  touch.rows = batch * cfg.block_size;
  for (const auto& e : touch.experts) m.experts.push_back(static_cast<int64_t>(e.size()));
  return draft_step_bytes(drafter_.weights(), touch);
}

Measurement Bench::draft(int64_t batch) {
  Measurement m = timed_draft(requests(batch), "draft");
  collectives(batch, m);
  return m;
}

Measurement Bench::draft_local(int64_t batch) {
  return timed_draft(requests(batch), "draft_local");
}

DraftResult Bench::answer(int64_t batch, bool eager) {
  if (!eager) return drafter_.draft(requests(batch));
  drafter_.set_trace([](const std::string&, const Tensor&) {});
  try {
    DraftResult r = drafter_.draft(requests(batch));
    drafter_.set_trace({});
    return r;
  } catch (...) {
    drafter_.set_trace({});
    throw;
  }
}

Measurement Bench::draft_sampled(int64_t batch, bool distribution) {
  std::vector<DraftRequest> reqs = requests(batch);
  for (size_t b = 0; b < reqs.size(); ++b) {
    reqs[b].temperature = 1.0f;
    reqs[b].seed = opt_.seed * 7919 + b;
  }
  reqs[0].distribution = distribution;
  return timed_draft(reqs, distribution ? "draft_sampled_q" : "draft_sampled");
}

Measurement Bench::timed_draft(const std::vector<DraftRequest>& reqs, const char* kind) {
  Measurement m;
  m.kind = kind;
  m.size = static_cast<int64_t>(reqs.size());
  m.bytes = draft_bytes(reqs, m);
  m.floor_us = floor_us(m.bytes);

  for (int i = 0; i < opt_.warmup; ++i) drafter_.draft(reqs);
  m.latency = summarize(time_host(
      clock_, comm_, opt_.iters, [&] { drafter_.draft(reqs); }, CallEnd::done));
  // The same step's recording replayed on its own: the call above less the host's planning and its wait
  // for the answer.
  if (drafter_.replay_last_draft())
    m.replay = summarize(clock_.time_queued(comm_, opt_.iters, [&] { drafter_.replay_last_draft(); }));
  return m;
}

Measurement Bench::draft_cached(int64_t batch) {
  const std::vector<DraftRequest> reqs = requests(batch);
  const int64_t k = drafter_.config().block_size;
  const DraftResult first = drafter_.draft(reqs);
  std::set<int32_t> prev;
  for (int64_t b = 0; b < batch; ++b) {
    prev.insert(reqs[static_cast<size_t>(b)].anchor_token);
    for (int64_t j = 0; j + 1 < k; ++j) prev.insert(first.ids[static_cast<size_t>(b * k + j)]);
  }
  drafter_.set_markov_cache(std::vector<int32_t>(prev.begin(), prev.end()));
  Measurement m;
  m.kind = "draft_cached";
  m.size = batch;
  m.bytes = draft_bytes(reqs, m, batch * k);
  m.floor_us = floor_us(m.bytes);
  for (int i = 0; i < opt_.warmup; ++i) drafter_.draft(reqs);
  const DraftResult check = drafter_.draft(reqs);
  if (check.ids != first.ids || check.markov_hits != check.markov_lookups)
    fail("bench: the draft with its tokens cached changed ({} of {} positions hit)", check.markov_hits,
         check.markov_lookups);
  m.latency = summarize(time_host(
      clock_, comm_, opt_.iters, [&] { drafter_.draft(reqs); }, CallEnd::done));
  if (drafter_.replay_last_draft())
    m.replay = summarize(clock_.time_queued(comm_, opt_.iters, [&] { drafter_.replay_last_draft(); }));
  drafter_.set_markov_cache({});
  return m;
}

Measurement Bench::insert(int64_t rows) {
  Measurement m;
  m.kind = "insert";
  m.size = rows;
  m.bytes = insert_bytes(drafter_.weights(), rows);
  m.floor_us = floor_us(m.bytes);
  // Slot 0 just past its context; re-inserting the same positions leaves the ring as the first call did.
  const RowVector data = random_rows(drafter_.config(), rows, opt_.seed * 1000 + 999);
  const auto call = [&] { drafter_.insert(0, opt_.context_rows, data.data(), rows); };
  for (int i = 0; i < opt_.warmup; ++i) call();
  m.latency = summarize(time_host(clock_, comm_, opt_.iters, call, CallEnd::queued));
  if (drafter_.replay_last_insert())
    m.replay = summarize(clock_.time_queued(comm_, opt_.iters, [&] { drafter_.replay_last_insert(); }));
  m.host_link_bytes = static_cast<uint64_t>(data.size() * sizeof(bf16_t));
  const std::vector<double> link = clock_.host_link_us(m.host_link_bytes, opt_.iters);
  if (!link.empty()) m.host_link = summarize(link);
  return m;
}

StepPlan Bench::step_plan(int64_t batch) const {
  const int64_t n = opt_.accepted_rows;
  StepPlan plan;
  plan.drafts = requests(batch);
  for (DraftRequest& r : plan.drafts) {
    plan.contexts.push_back({r.slot, static_cast<int32_t>(opt_.context_rows), static_cast<int32_t>(n)});
    r.anchor_pos = static_cast<int32_t>(opt_.context_rows + n);
  }
  // Every call writes the same rows at the same positions: the rings stay as the first call left them.
  plan.rows = random_rows(drafter_.config(), batch * n, opt_.seed * 1000 + 998);
  return plan;
}

Measurement Bench::step_shape(const StepPlan& plan, const char* kind) {
  Measurement m;
  m.kind = kind;
  m.size = static_cast<int64_t>(plan.drafts.size());
  // The plan's rows first (the same rows at the same positions as every timed call), so that the traced
  // draft routes as the step's draft does, after its insert.
  drafter_.insert_blocks(plan.contexts, plan.rows.data());
  const StepBytes draft = draft_bytes(plan.drafts, m),
                  insert = insert_bytes(drafter_.weights(),
                                        static_cast<int64_t>(plan.rows.size()) / drafter_.config().row_dim());
  m.floor_us = floor_us(draft) + floor_us(insert);
  m.bytes = draft;
  m.bytes.dense += insert.total();
  return m;
}

Measurement Bench::step(int64_t batch, bool one_replay) {
  const StepPlan plan = step_plan(batch);
  Measurement m = step_shape(plan, one_replay ? "step" : "step2");
  const auto call = [&] {
    if (one_replay) {
      const StepResult r = execute_step(drafter_, comm_, plan);
      if (!r.status.ok()) fail("bench: the step failed: {}", r.status.message);
    } else {
      drafter_.insert_blocks(plan.contexts, plan.rows.data());
      drafter_.draft(plan.drafts);
    }
  };
  for (int i = 0; i < opt_.warmup; ++i) call();
  m.latency = summarize(time_host(clock_, comm_, opt_.iters, call, CallEnd::done));
  return m;
}

}  // namespace dspark::bench
