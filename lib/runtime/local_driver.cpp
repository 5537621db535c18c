#include "runtime/local_driver.hpp"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include <algorithm>

#include "core/error.hpp"
#include "core/numeric.hpp"

namespace dspark {
namespace {

// Row values from (seed, slot, position) alone: a position re-sent after a reset carries the same row.
void fill_row(bf16_t* row, int64_t n, uint64_t seed, int64_t slot, int64_t pos) {
  std::mt19937_64 g(seed ^ (static_cast<uint64_t>(slot) << 40) ^
                    static_cast<uint64_t>(pos) * 0x9e3779b97f4a7c15ull);
  std::normal_distribution<float> normal;
  for (int64_t i = 0; i < n; ++i) row[i] = float_to_bf16(normal(g));
}

}  // namespace

LocalDriver::LocalDriver(const ModelConfig& cfg, const StepLimits& limits, const LocalDriverOptions& options)
    : cfg_(cfg), limits_(limits), opt_(options), rng_(options.seed) {
  const int64_t n = std::min({opt_.sequences, limits.slots, limits.max_batch});
  if (n < 1)
    fail("local driver: no sequences (sequences {}, slots {}, max_batch {})", opt_.sequences, limits.slots,
         limits.max_batch);
  if (opt_.prefill_rows < 1) fail("local driver: prefill_rows must be positive");
  for (int64_t i = 0; i < n; ++i) seqs_.push_back({static_cast<int32_t>(i), 0, 0, 0, true});
  if (!opt_.drafts_out.empty()) {
    out_.open(opt_.drafts_out);
    if (!out_) fail("local driver: cannot write {}", opt_.drafts_out.string());
  }
}

void LocalDriver::append_rows(StepPlan& plan, const Sequence& s, int64_t first, int64_t n) {
  const int64_t row_dim = cfg_.row_dim();
  const size_t at = plan.rows.size();
  plan.rows.resize(at + static_cast<size_t>(n * row_dim));
  for (int64_t i = 0; i < n; ++i)
    fill_row(plan.rows.data() + at + i * row_dim, row_dim, opt_.seed, s.slot, first + i);
  plan.contexts.push_back({s.slot, static_cast<int32_t>(first), static_cast<int32_t>(n)});
}

std::optional<StepPlan> LocalDriver::next() {
  if (done_ >= opt_.steps) return std::nullopt;
  StepPlan plan;
  plan.id = static_cast<uint64_t>(done_);
  const int64_t k = cfg_.block_size;
  int64_t rows_left = limits_.max_context_rows;
  for (Sequence& s : seqs_) {
    // A sequence about to run past max_model_len starts over (reset + a new prefill).
    if (!s.fresh && s.pos + s.pending + k >= limits_.max_model_len) {
      plan.resets.push_back(s.slot);
      s = {s.slot, 0, 0, 0, true};
    }
    if (s.fresh) {
      const int64_t n = std::min(opt_.prefill_rows, limits_.max_model_len - k - 1);
      if (n > rows_left) continue;  // no room this step: this sequence waits
      append_rows(plan, s, 0, n);
      rows_left -= n;
      s.pos = n;
      s.anchor = static_cast<int32_t>(rng_() % static_cast<uint64_t>(cfg_.vocab_size));
      s.fresh = false;
    } else if (s.pending > 0) {
      if (s.pending > rows_left) continue;
      append_rows(plan, s, s.pos, s.pending);
      rows_left -= s.pending;
      s.pos += s.pending;
      s.pending = 0;
    }
    plan.drafts.push_back({s.slot, s.anchor, static_cast<int32_t>(s.pos), -1, 0});
  }
  started_ = std::chrono::steady_clock::now();
  return plan;
}

void LocalDriver::complete(const StepPlan& plan, const StepResult& result) {
  latencies_.push_back(
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started_).count());
  ++done_;
  if (!result.status.ok()) {
    ++failed_;
    spdlog::warn("step {}: {} {}", plan.id, status_name(result.status.status), result.status.message);
    for (const DraftRequest& r : plan.drafts) seqs_[static_cast<size_t>(r.slot)] = {r.slot, 0, 0, 0, true};
    for (const ContextBlock& c : plan.contexts) seqs_[static_cast<size_t>(c.slot)] = {c.slot, 0, 0, 0, true};
    return;
  }
  const int64_t k = cfg_.block_size;
  nlohmann::json line = {{"step", plan.id}, {"requests", nlohmann::json::array()}};
  for (size_t b = 0; b < plan.drafts.size(); ++b) {
    const DraftRequest& r = plan.drafts[b];
    const auto at = static_cast<std::ptrdiff_t>(b) * k;
    line["requests"].push_back(
        {{"slot", r.slot},
         {"token", r.anchor_token},
         {"pos", r.anchor_pos},
         {"ids", std::vector<int32_t>(result.draft.ids.begin() + at, result.draft.ids.begin() + at + k)},
         {"conf", std::vector<float>(result.draft.conf.begin() + at, result.draft.conf.begin() + at + k)},
         {"margin",
          std::vector<float>(result.draft.margin.begin() + at, result.draft.margin.begin() + at + k)}});
    // Seeded verification: accepted prefix length and the target's next token, independent of the drafts.
    std::bernoulli_distribution accept(opt_.accept_prob);
    int64_t a = 0;
    while (a < k && accept(rng_)) ++a;
    Sequence& s = seqs_[static_cast<size_t>(r.slot)];
    s.pending = a + 1;  // the anchor's row and the accepted tokens' rows
    s.anchor = static_cast<int32_t>(rng_() % static_cast<uint64_t>(cfg_.vocab_size));
  }
  if (out_.is_open()) out_ << line.dump() << "\n";
}

}  // namespace dspark
