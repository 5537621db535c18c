// The measurements of dspark_bench on a built Drafter (any backend with its BenchClock, any communicator):
// draft-step latency per batch size and context-insert latency per row count, each beside its
// memory-bandwidth floor (SPEC §8), and the collectives' share of a draft step. Every rank runs the same
// calls (the Drafter's collectives need them); rank 0's numbers are the ones reported.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.hpp"
#include "lib/api/step_plan.hpp"
#include "lib/bench/bench_clock.hpp"
#include "lib/bench/step_bytes.hpp"
#include "lib/bench/timing.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/drafter.hpp"

namespace dspark::bench {

struct BenchOptions {
  std::vector<int64_t> batches{1, 2, 4, 8, 16};  // draft requests per step (each on its own slot)
  std::vector<int64_t> insert_rows{1, 16, 128};  // rows per context insert
  int iters = 50;                                // timed calls per measurement
  int warmup = 5;                                // untimed calls before them
  int64_t context_rows = 128;                    // random context rows every slot holds before drafting
  uint64_t seed = 0;                             // context rows and anchor tokens
  int64_t accepted_rows = 0;  // > 0: also time whole steps, this many new context rows per sequence
  // Also time each draft with every previous token's bias row in the Markov cache (100 % hits; the drafter
  // needs room for max batch x k rows); the other draft rows run with the cache empty (0 % hits).
  bool markov_cache = false;
  // Also time each draft with every request sampled (tau = 1), and with the first one also asking for its
  // whole draft distribution ('draft sampled' and 'draft sampled+q' rows).
  bool sampled = false;
};

struct Measurement {
  std::string kind;     // "draft", "draft_cached" (every Markov position a cache hit), "draft_sampled" (every
                        // request at tau = 1), "draft_sampled_q" (and the first one's whole distribution),
                        // "insert", "step" (one replay), "step2" (insert, then draft) or "step_ring"
                        // (the step through the host ring: lib/bench/ring_steps.hpp) or "draft_local" (the
                        // draft with its exchanges replaced by local copies: lib/bench/exchange_cost.hpp)
  int64_t size = 0;     // draft, step: batch B; insert: rows
  Stats latency;        // host wall-clock per call
  Stats replay;         // draft: the recorded step's replay alone (device time, rank 0's stream)
  StepBytes bytes;      // weight bytes the call reads on this rank
  double floor_us = 0;  // bytes.total() / measured bandwidth
  std::vector<int64_t> experts;     // draft: distinct routed experts per stage
  double all_reduce_us = 0;         // draft: one all_reduce_sum of [k B, H] f32 (median)
  double exchange_us = 0;           // draft: one argmax_exchange of B records (median)
  double collectives_us = 0;        // draft: 2 all-reduces per stage + k exchanges
  double collectives_graph_us = 0;  // draft: the same collectives recorded in one graph, one replay (median;
                                    // 0 without graphs)
  // draft_local: what the exchanges cost the draft step of the same B, the draft's median less this one's
  // (of the replays where both have one, else of the whole calls), and how many exchanges a step makes.
  double exchanges_us = 0;
  bool exchanges_by_replay = false;
  int64_t exchanges = 0;
  bool drafts_match_real = true;  // draft_local: it drafted what the real step drafted, bit for bit
  // step_ring: each round trip in three parts, from the host's call to the drafter's step call (the request
  // written, the worker's wake-up, decode, checks and plan), the drafter's call, and from its return to the
  // host's (the answer encoded, the host's wake-up and decode).
  Stats ring_to_drafter, ring_drafter, ring_from_drafter;
  // insert: one copy of its rows from page-locked host memory to the device (BenchClock::host_link_us;
  // empty where the backend needs none), the least the rows' way there takes.
  Stats host_link;
  uint64_t host_link_bytes = 0;
};

class Bench {
 public:
  // The drafter must have slots >= max batch and max_batch >= max batch. bandwidth in bytes/s.
  Bench(Drafter& drafter, Backend& backend, BenchClock& clock, Communicator& comm, double bandwidth,
        BenchOptions options);

  // Gives every slot the options' context rows at positions [0, context_rows).
  void fill_context();
  Measurement draft(int64_t batch);
  // The same draft with the previous tokens of its Markov positions (its anchors and drafted tokens, from
  // one untimed draft) in the bias cache, which is emptied again after.
  Measurement draft_cached(int64_t batch);
  // The draft with every request sampled at tau = 1; with `distribution`, the first also asks for its whole
  // draft distribution.
  Measurement draft_sampled(int64_t batch, bool distribution);
  // The draft as draft() times it, without the collectives' own timings: for a drafter whose exchanges
  // are local copies (exchange_cost.hpp).
  Measurement draft_local(int64_t batch);
  // The answer of draft(batch)'s requests, untimed; eager: the ops run one by one, not a recording's replay
  // (a trace is set for the call, which turns the recordings off).
  DraftResult answer(int64_t batch, bool eager);
  Measurement insert(int64_t rows);
  // The step an engine sends: accepted_rows new rows for each of B sequences and their draft. one_replay:
  // through the step loop's execute_step (one recording where the drafter holds the pair); else an insert
  // and then a draft, each replayed on its own. Floor: the draft's bytes plus the insert's.
  Measurement step(int64_t batch, bool one_replay);
  // That step's plan: accepted_rows new rows for each of the first B slots at positions [context_rows,
  // context_rows + accepted_rows), each slot's draft anchored after them (the same on every call).
  StepPlan step_plan(int64_t batch) const;
  // A measurement of `kind` for a plan of that shape: its size, weight bytes (the insert's, and the draft's
  // from one traced draft after the plan's insert: collective) and floor; no timing.
  Measurement step_shape(const StepPlan& plan, const char* kind);
  const BenchOptions& options() const { return opt_; }

 private:
  std::vector<DraftRequest> requests(int64_t batch) const;
  // Times drafter_.draft(reqs) (and the replay of its recording alone) beside the floor of its bytes.
  Measurement timed_draft(const std::vector<DraftRequest>& reqs, const char* kind);
  std::vector<std::vector<int32_t>> routed_experts(const std::vector<DraftRequest>& reqs);
  // The weight bytes of a draft of reqs (its experts found by one traced draft).
  // cached_rows: the (request, position) pairs that read a cached bias row instead of markov_head (all of
  // them or none).
  StepBytes draft_bytes(const std::vector<DraftRequest>& reqs, Measurement& m, int64_t cached_rows = 0);
  void collectives(int64_t batch, Measurement& m);
  double floor_us(const StepBytes& b) const { return static_cast<double>(b.total()) / bandwidth_ * 1e6; }

  Drafter& drafter_;
  Backend& be_;
  BenchClock& clock_;
  Communicator& comm_;
  double bandwidth_;
  BenchOptions opt_;
};

}  // namespace dspark::bench
