#include "lib/runtime/local_driver.hpp"

#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>

#include "lib/core/error.hpp"

namespace dspark {

LocalDriver::LocalDriver(const EngineShape& shape, const LocalDriverOptions& options)
    : engine_(shape, options.engine), opt_(options), k_(shape.block_size) {
  if (!opt_.drafts_out.empty()) {
    out_.open(opt_.drafts_out);
    if (!out_) fail("local driver: cannot write {}", opt_.drafts_out.string());
  }
}

std::optional<StepPlan> LocalDriver::next() {
  if (done_ >= opt_.steps) return std::nullopt;
  StepPlan plan = engine_.next_step();
  started_ = std::chrono::steady_clock::now();
  return plan;
}

void LocalDriver::complete(const StepPlan& plan, const StepResult& result) {
  latencies_.push_back(
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started_).count());
  ++done_;
  engine_.step_done(plan, result.status.ok());
  if (!result.status.ok()) {
    ++failed_;
    spdlog::warn("step {}: {} {}", plan.id, status_name(result.status.status), result.status.message);
    return;
  }
  if (!out_.is_open()) return;
  auto slice = [&](const auto& v, size_t b) {
    const auto at = static_cast<std::ptrdiff_t>(b) * k_;
    return std::vector<typename std::decay_t<decltype(v)>::value_type>(v.begin() + at, v.begin() + at + k_);
  };
  nlohmann::json line = {{"step", plan.id}, {"requests", nlohmann::json::array()}};
  for (size_t b = 0; b < plan.drafts.size(); ++b) {
    const DraftRequest& r = plan.drafts[b];
    line["requests"].push_back({{"slot", r.slot},
                                {"token", r.anchor_token},
                                {"pos", r.anchor_pos},
                                {"ids", slice(result.draft.ids, b)},
                                {"conf", slice(result.draft.conf, b)},
                                {"margin", slice(result.draft.margin, b)}});
  }
  out_ << line.dump() << "\n";
}

}  // namespace dspark
