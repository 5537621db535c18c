// How the drafter is split over tp = N ranks (SPEC §5): heads and output groups evenly, expert intermediate
// channels on 128-channel units and the vocabulary on 256-column tiles as evenly as possible (lower ranks
// take the extra unit). Everything else is replicated.
#pragma once

#include <cstdint>
#include <string>

#include "lib/config/model_config.hpp"

namespace dspark {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

constexpr int64_t kInterUnit = 128;  // intermediate channels cut on 128-boundaries (EXL3 Hadamard blocks)
constexpr int64_t kVocabTile = 256;  // vocabulary cut on 256-column tiles

struct ShardPlan {
  int rank = 0;
  int ranks = 1;
  Range heads;         // query heads (and attn_sink entries, wq_b rows / d)
  Range groups;        // wo_a groups (and wo_b input rows / o_lora)
  Range inter;         // routed expert intermediate channels
  Range shared_inter;  // shared expert intermediate channels
  Range vocab;         // head and markov_head.head rows
};

// Part `rank` of `units` units split over `ranks` parts, lower parts taking the remainder.
Range split_even(int64_t units, int rank, int ranks);

// Throws dspark::Error with the reason when the model cannot be split over `ranks`.
ShardPlan make_shard_plan(const ModelConfig& c, int rank, int ranks);

}  // namespace dspark
