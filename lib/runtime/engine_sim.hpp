// A seeded simulated inference engine: sequences get a prefill, then every step drafts for all of them,
// "verifies" with a seeded acceptance model and sends the accepted tokens' rows back. Used by the worker's
// built-in driver and by `dspark_client bench`. The inputs of every step depend on the seed only, never on
// the drafts, so runs at different tp sizes (or through different paths) see identical requests.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "lib/api/step_plan.hpp"

namespace dspark {

struct EngineShape {
  int64_t vocab_size = 0;
  int64_t block_size = 0;  // k
  int64_t row_dim = 0;     // 3H bf16 values per context row
  int64_t slots = 0;
  int64_t max_batch = 0;
  int64_t max_context_rows = 0;  // per step
  int64_t max_model_len = 0;
};

struct EngineSimOptions {
  int64_t sequences = 4;      // slots in use (at most slots and max_batch)
  int64_t prefill_rows = 24;  // context rows inserted when a sequence starts
  double accept_prob = 0.7;  // each drafted token is accepted with this probability until the first rejection
  // > 0: every sequence sends exactly this many rows after each draft (a fixed step shape, as dspark_bench
  // --iteration's --accepted-rows) instead of the seeded acceptance's anchor and accepted tokens.
  int64_t accepted_rows = 0;
  uint64_t seed = 0;
};

class EngineSim {
 public:
  EngineSim(const EngineShape& shape, const EngineSimOptions& options);
  // The next step: resets of sequences that restart, context rows due, one draft per sequence.
  StepPlan next_step();
  // The step's outcome: accepted prefixes are decided (seeded), their rows become due. A failed step restarts
  // the sequences it touched.
  void step_done(const StepPlan& plan, bool ok);
  int64_t sequences() const { return static_cast<int64_t>(seqs_.size()); }
  // Row values depend on (seed, slot, position) alone.
  static void fill_row(bf16_t* row, int64_t n, uint64_t seed, int64_t slot, int64_t pos);

 private:
  struct Sequence {
    int32_t slot = 0;
    int64_t pos = 0;      // next context position = anchor position of the next draft
    int64_t pending = 0;  // rows to send before the next draft
    int32_t anchor = 0;
    bool fresh = true;
  };
  void append_rows(StepPlan& plan, const Sequence& s, int64_t first, int64_t n) const;

  EngineShape shape_;
  EngineSimOptions opt_;
  std::mt19937_64 rng_;
  std::vector<Sequence> seqs_;
  uint64_t steps_ = 0;
};

}  // namespace dspark
