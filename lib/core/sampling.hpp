// The host side of sampled drafts (SPEC §4, "Sampled drafts"): the temperature rule, and the reference scan
// of one shard of biased logits into its MarkovRecord (markov_record.hpp), which the CPU backend's Markov
// loop and the tests follow. The draw is Gumbel-max over z_v = (logit_v + bias_v) / tau: tok = argmax_v z_v +
// g(seed, pos, v) (gumbel.hpp), ties to the lower id, which samples q = softmax(z).
#pragma once

#include <cstdint>
#include <string>

#include "lib/core/markov_record.hpp"

namespace dspark {

// The largest temperature a request may ask for: beyond it q is uniform to within float rounding anyway.
constexpr float kMaxTemperature = 100.0f;

// Empty when tau is a valid temperature (0: greedy; (0, kMaxTemperature]); else why not.
std::string temperature_problem(float tau);

// Folds one more id into a record built in ascending id order: merge_markov(r, markov_single(...)) with the
// same bits, without its second exp.
void markov_scan_add(MarkovRecord& r, float value, int32_t id, float tau, uint64_t seed, uint32_t pos);

// The record of values[0..n) (ids first_id..first_id + n - 1, each a biased logit) at temperature tau (0:
// the top-2 only) for the noise of (seed, pos): markov_single of each id folded in id order.
MarkovRecord markov_scan(const float* values, int64_t n, int32_t first_id, float tau, uint64_t seed,
                         uint32_t pos);

}  // namespace dspark
