#include "lib/runtime/plan_broadcast.hpp"

#include <cstring>
#include <vector>

#include "lib/core/error.hpp"

namespace dspark {
namespace {

// The fixed part of a broadcast plan; the payload's size follows from the counts.
struct PlanHeader {
  uint64_t magic;
  uint64_t id;
  int64_t max_model_len;
  uint32_t shutdown, margin;
  uint32_t resets, contexts, drafts, pad;
  uint64_t rows;  // bf16 values
};
constexpr uint64_t kPlanMagic = 0x4e414c504b525053ull;  // "SPRKPLAN"

template <typename T>
void append(std::vector<uint8_t>& out, const std::vector<T>& v) {
  const size_t at = out.size();
  out.resize(at + v.size() * sizeof(T));
  if (!v.empty()) std::memcpy(out.data() + at, v.data(), v.size() * sizeof(T));
}

template <typename T>
void take(const std::vector<uint8_t>& in, size_t& at, std::vector<T>& v, size_t n) {
  v.resize(n);
  if (n) std::memcpy(v.data(), in.data() + at, n * sizeof(T));
  at += n * sizeof(T);
}

}  // namespace

void broadcast_plan(Communicator& comm, StepPlan& plan, int64_t row_dim, int root) {
  if (comm.size() == 1) return;  // the root holds the plan already
  PlanHeader h{};
  std::vector<uint8_t> payload;
  if (comm.rank() == root) {
    h = {kPlanMagic,
         plan.id,
         plan.max_model_len,
         plan.shutdown ? 1u : 0u,
         plan.margin ? 1u : 0u,
         static_cast<uint32_t>(plan.resets.size()),
         static_cast<uint32_t>(plan.contexts.size()),
         static_cast<uint32_t>(plan.drafts.size()),
         0,
         plan.rows.size()};
    append(payload, plan.resets);
    append(payload, plan.contexts);
    append(payload, plan.drafts);
  }
  comm.broadcast(&h, sizeof(h), root);
  if (h.magic != kPlanMagic) fail("step plan broadcast: bad header magic {:#x}", h.magic);
  const size_t bytes =
      h.resets * sizeof(int32_t) + h.contexts * sizeof(ContextBlock) + h.drafts * sizeof(DraftRequest);
  if (h.rows % static_cast<uint64_t>(row_dim) != 0) fail("step plan broadcast: {} row values", h.rows);
  payload.resize(bytes);
  comm.broadcast(payload.data(), bytes, root);
  // The rows, the plan's bulk, travel on their own: from and into plan.rows, never through the payload.
  if (comm.rank() != root) plan.rows.resize(h.rows);
  if (h.rows > 0) comm.broadcast(plan.rows.data(), h.rows * sizeof(bf16_t), root);
  if (comm.rank() == root) return;
  RowVector rows = std::move(plan.rows);
  plan = StepPlan{};
  plan.rows = std::move(rows);
  plan.id = h.id;
  plan.max_model_len = h.max_model_len;
  plan.shutdown = h.shutdown != 0;
  plan.margin = h.margin != 0;
  size_t at = 0;
  take(payload, at, plan.resets, h.resets);
  take(payload, at, plan.contexts, h.contexts);
  take(payload, at, plan.drafts, h.drafts);
}

}  // namespace dspark
