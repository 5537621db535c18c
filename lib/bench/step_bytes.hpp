// Weight bytes a drafter call reads on this rank (SPEC §8): the numerator of the memory-bandwidth floor.
// Counted from the rank's DrafterWeights, so shards are counted at their real size.
#pragma once

#include <cstdint>
#include <vector>

#include "lib/model/weights.hpp"

namespace dspark::bench {

// What one draft step of B requests touches beyond the weights every step reads.
struct DraftTouch {
  std::vector<std::vector<int32_t>> experts;  // per stage: the distinct routed experts selected
  int64_t embed_rows = 0;                     // distinct block tokens (anchors and the noise token)
  int64_t markov_embed_rows = 0;              // markov_embed rows: one per (request, position), B k
  int64_t markov_positions = 0;               // Markov positions: the markov_head shard is read once each
  int64_t markov_cached_rows = 0;             // (request, position) pairs reading a cached bias row
  int64_t rows = 0;                           // the step's rows, B k (which copy of wkv the step reads)
};

struct StepBytes {
  uint64_t dense = 0;    // per stage: attention, norms, mHC mixes, gate, shared expert; the final norm
  uint64_t experts = 0;  // routed experts selected, this rank's intermediate channels
  uint64_t head = 0;     // the head shard and the confidence projection
  uint64_t markov = 0;   // the markov_head shard x positions, markov_embed rows
  uint64_t embed = 0;    // embedding rows
  uint64_t total() const { return dense + experts + head + markov + embed; }
};

StepBytes draft_step_bytes(const DrafterWeights& w, const DraftTouch& touch);
// A context insert of `rows` rows (one chunk): main_proj, main_norm, and per stage wkv and kv_norm; main_proj
// and wkv as their bf16 copies where they have one and the chunk has at least kDequantisedMinRows rows
// (LinearWeight::dequantised).
StepBytes insert_bytes(const DrafterWeights& w, int64_t rows);

}  // namespace dspark::bench
