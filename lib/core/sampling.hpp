// The arithmetic of sampled drafts (SPEC §4, "Sampled drafts") that every backend shares: the temperature
// rule, the Gumbel noise of a (seed, position, vocabulary id), and the per-shard record of one Markov
// position that ranks merge so that tp = N draws exactly the token tp = 1 draws. The draw is Gumbel-max over
// z_v = (logit_v + bias_v) / tau: tok = argmax_v z_v + g(seed, pos, v), ties to the lower id, which samples
// q = softmax(z); the record also carries q's normaliser as a (max, sum of exp) pair.
#pragma once

#include <cstdint>
#include <string>

namespace dspark {

// The largest temperature a request may ask for: beyond it q is uniform to within float rounding anyway.
constexpr float kMaxTemperature = 100.0f;

// Empty when tau is a valid temperature (0: greedy; (0, kMaxTemperature]); else why not.
std::string temperature_problem(float tau);

// The noise of vocabulary id v at position pos for `seed`: -log(-log(u)), u in (0, 1) from the first word of
// Philox-4x32-10 keyed by the seed (low word, high word), counter (pos, v, 0, 0): u = (x + 1/2) / 2^32, in
// double, rounded to float at the end.
float gumbel_noise(uint64_t seed, uint32_t pos, uint32_t v);

// One shard's part of a sampled position: the best perturbed score and its global id (ties to the lower id),
// the max of z over the shard and the sum of exp(z - max) there.
struct SampleRecord {
  float best = 0.0f;
  int32_t index = -1;  // -1: an empty shard
  float z_max = 0.0f;
  float z_sum = 0.0f;
};

// The record of logits[0..n) + bias[0..n) (ids first_id..first_id + n - 1) at tau > 0, in id order; bias may
// be null (no bias).
SampleRecord sample_shard(const float* logits, const float* bias, int64_t n, int32_t first_id, float tau,
                          uint64_t seed, uint32_t pos);

// The record of the union of two shards' ids: the better perturbed score (ties to the lower id) and the
// normalisers folded to the larger max. Fold records in rank order for identical bits on every rank.
SampleRecord merge_samples(const SampleRecord& a, const SampleRecord& b);

// q(tok) of a merged record: exp(z_tok - z_max) / z_sum, z_tok being the drafted token's z.
float sampled_probability(const SampleRecord& r, float z_tok);

}  // namespace dspark
