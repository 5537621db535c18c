// One rank's record of one request at one Markov position (SPEC §4, §5), and the one rule that merges two of
// them. Dependency-free and callable from kernels: the CPU communicators, the NCCL merge kernel, the peer
// commit and the CUDA Markov kernels all fold records with merge_markov, so every rank and every backend
// agree on every Markov token, greedy or sampled.
#pragma once

#include <math.h>  // expf, fmaf, fmaxf, INFINITY: the same names in host and device code

#include <cstdint>

#include "lib/core/host_device.hpp"

namespace dspark {

struct MarkovRecord {
  // The top two of logits + bias over the record's ids: the greedy token `index` (ties to the lower id) and
  // the margin best - second.
  float best;
  float second;
  int32_t index;
  // The sampled draw (temperature tau > 0, SPEC §4 "Sampled drafts"): the id of the best perturbed score
  // z + g (ties to the lower id; -1: no draw: a greedy request, or no ids), that score and its z =
  // (logit + bias) / tau.
  int32_t sample_index;
  float score;
  float z;
  // The draw's normaliser over the record's ids: the largest z and the sum of exp(z - z_max).
  float z_max;
  float z_sum;
};
static_assert(sizeof(MarkovRecord) == 32);
constexpr int64_t kMarkovRecordWords = 8;  // i32 words per record: an exchange buffer is i32 [B, 8]

DSPARK_HOST_DEVICE MarkovRecord markov_empty() {
  return MarkovRecord{-INFINITY, -INFINITY, 0, -1, -INFINITY, 0.0f, 0.0f, 0.0f};
}

// The record of one id whose biased logit is `value`; at tau > 0 also its draw, with the id's noise g.
DSPARK_HOST_DEVICE MarkovRecord markov_single(float value, int32_t id, float tau, float noise) {
  MarkovRecord r = markov_empty();
  r.best = value;
  r.index = id;
  if (tau > 0.0f) {
    const float z = value / tau;
    r.sample_index = id;
    r.score = z + noise;
    r.z = z;
    r.z_max = z;
    r.z_sum = 1.0f;
  }
  return r;
}

// The record of the union of two disjoint id sets. Top-2: the better best (ties to the lower id; on equal
// ids, a) and the larger of the winner's second and the loser's best. Draw: the better score (ties to the
// lower id), the normalisers folded to the larger max. Selects on values rather than references to a or b:
// kernels keep the records in registers. The top-2 part is commutative and associative on distinct ids, so
// any merge order gives a sequential scan's answer; the draw's sum is exact only up to rounding, so ranks
// fold in rank order for identical bits.
// The top-2 part of a merge: best (ties to the lower id), its id and the multiset second largest into out.
DSPARK_HOST_DEVICE void merge_best_two(const MarkovRecord& a, const MarkovRecord& b, MarkovRecord& out) {
  const bool a_wins = a.best > b.best || (a.best == b.best && a.index <= b.index);
  const float w_second = a_wins ? a.second : b.second;
  const float l_best = a_wins ? b.best : a.best;
  out.best = a_wins ? a.best : b.best;
  out.index = a_wins ? a.index : b.index;
  out.second = (w_second < l_best) ? l_best : w_second;
}

DSPARK_HOST_DEVICE MarkovRecord merge_markov(const MarkovRecord& a, const MarkovRecord& b) {
  MarkovRecord out;
  merge_best_two(a, b, out);
  const bool a_none = a.sample_index < 0, b_none = b.sample_index < 0;
  const bool a_draws =
      !a_none && (b_none || a.score > b.score || (a.score == b.score && a.sample_index <= b.sample_index));
  out.sample_index = a_draws ? a.sample_index : b.sample_index;
  out.score = a_draws ? a.score : b.score;
  out.z = a_draws ? a.z : b.z;
  if (a_none || b_none) {
    out.z_max = a_none ? b.z_max : a.z_max;
    out.z_sum = a_none ? b.z_sum : a.z_sum;
  } else {
    out.z_max = fmaxf(a.z_max, b.z_max);
    // One explicit fma: left to the compiler, each kernel that inlines this merge may contract the sum its
    // own way, and ranks folding through different kernels would disagree in the last bits.
    out.z_sum = fmaf(a.z_sum, expf(a.z_max - out.z_max), b.z_sum * expf(b.z_max - out.z_max));
  }
  return out;
}

// merge_markov of records that carry no draw (every request greedy): the top-2 rule alone, with the bits
// merge_markov gives them (their empty draws are all alike).
DSPARK_HOST_DEVICE MarkovRecord merge_greedy(const MarkovRecord& a, const MarkovRecord& b) {
  MarkovRecord out = markov_empty();
  merge_best_two(a, b, out);
  return out;
}

// The drafted token of a merged record (the draw at tau > 0, else the argmax) and its probability under
// the draft distribution: q(tok) = exp(z - z_max) / z_sum when drawn, 1 for a greedy token.
DSPARK_HOST_DEVICE int32_t drafted_token(const MarkovRecord& r) {
  return r.sample_index >= 0 ? r.sample_index : r.index;
}
DSPARK_HOST_DEVICE float drafted_probability(const MarkovRecord& r) {
  return r.sample_index >= 0 ? expf(r.z - r.z_max) / r.z_sum : 1.0f;
}

}  // namespace dspark
