// Internal: how one dspark_step becomes step messages. A message carries at most max_context_rows rows and at
// most the request ring's largest message; larger sends go ahead in context-only messages, resets ride in the
// first message and the draft batch in the last, so the worker applies everything in the caller's order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "dspark_client.h"
#include "outcome.hpp"

namespace dspark::client {

struct SplitLimits {
  uint64_t max_bytes = 0;  // largest message the request ring takes
  int64_t max_rows = 0;    // max_context_rows
  uint32_t row_bytes = 0;
  uint64_t max_count = 1u << 16;  // resets, contexts or drafts in one message (codec.hpp's kMaxStepCount)
};

// `rows` rows of context `ctx`, starting at its row `offset`.
struct Piece {
  uint32_t ctx = 0;
  int32_t offset = 0;
  int32_t rows = 0;
};

struct MessagePlan {
  bool resets = false;  // carries all the resets (the first message)
  bool drafts = false;  // carries the draft batch (the last message)
  std::vector<Piece> pieces;
};

// Bytes of a step message (header, counts, wires, bulk rows; each part padded to 8 as protocol.hpp lays it
// out).
uint64_t step_message_bytes(uint64_t resets, uint64_t contexts, uint64_t drafts, uint64_t rows,
                            uint32_t row_bytes);

// The messages of a step, in sending order. RESOURCE_EXHAUSTED when a message could not hold even its fixed
// part.
Outcome split_step(size_t n_resets, std::span<const dspark_context_block> ctx, size_t n_drafts,
                   const SplitLimits& lim, std::vector<MessagePlan>& out);

}  // namespace dspark::client
