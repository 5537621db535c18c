// Internal: one dspark_step over a connection: argument checks, the split into messages, the round trips and
// the copy of the draft answer into the caller's arrays.
#pragma once

#include <span>
#include <vector>

#include "connection.hpp"
#include "dspark_client.h"
#include "step_split.hpp"

namespace dspark::client {

struct StepArgs {
  std::span<const int32_t> resets;
  std::span<const dspark_context_block> contexts;
  std::span<const dspark_draft_request> drafts;
  const dspark_sampling* sampling = nullptr;  // one per draft request, or null: greedy
  bool margins = true;
  dspark_draft_output out{};
  dspark_sampled_output sampled{};
};

// Kept in the handle so that a steady stream of steps reuses its buffers instead of allocating.
struct StepScratch {
  std::vector<MessagePlan> plans;
  host::Request req;
  host::Response resp;
};

Outcome run_step(Connection& c, const StepArgs& a, const Deadline& d, StepScratch& s);

}  // namespace dspark::client
