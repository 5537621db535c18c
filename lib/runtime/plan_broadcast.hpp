// The step plan's broadcast (SPEC §6): rank 0's validated plan to every rank, so that all of them execute the
// same resets, context inserts and draft batch.
#pragma once

#include <cstdint>

#include "comm/communicator.hpp"
#include "lib/api/step_plan.hpp"

namespace dspark {

// Rank `root` sends its plan, every other rank receives into `plan` (a fixed header, the small fields, then
// the rows straight from and into StepPlan::rows); nothing to do with one rank. Throws when a received header
// is inconsistent.
void broadcast_plan(Communicator& comm, StepPlan& plan, int64_t row_dim, int root = 0);

}  // namespace dspark
