// Which context rows of a step an insert has to write: the rows of several blocks (slots) go through one
// insert chunk, so that a step pays one replay for all of them.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_set>
#include <vector>

#include "lib/api/step_plan.hpp"

namespace dspark {

// One row to write: the step's row `src` (index into the rows in block order) at (slot, pos).
struct InsertRow {
  int32_t slot = 0, pos = 0;
  int64_t src = 0;
};

// The rows of `blocks` whose entries survive inserting the blocks one after the other into rings of W
// entries (entry pos mod W): for every (slot, entry), the last row written there. Each row's KV depends only
// on the row and its position, so writing these once, in any order, leaves the rings as the sequential
// inserts would. Kept in step order. `seen` is scratch (reused, no allocation once grown).
void pack_insert_rows(std::span<const ContextBlock> blocks, int64_t W, std::vector<InsertRow>& out,
                      std::unordered_set<uint64_t>& seen);

}  // namespace dspark
