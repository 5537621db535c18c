#include "lib/core/sampling.hpp"

#include <fmt/format.h>

#include <cmath>

#include "lib/core/gumbel.hpp"

namespace dspark {

std::string temperature_problem(float tau) {
  if (std::isnan(tau)) return "temperature is NaN";
  if (tau < 0.0f) return fmt::format("temperature {} is negative", tau);
  if (tau > kMaxTemperature) return fmt::format("temperature {} is above {}", tau, kMaxTemperature);
  return {};
}

void markov_scan_add(MarkovRecord& r, float value, int32_t id, float tau, uint64_t seed, uint32_t pos) {
  if (value > r.best) {  // strict: the first (lowest) id wins a tie
    r.second = r.best;
    r.best = value;
    r.index = id;
  } else if (value > r.second) {
    r.second = value;
  }
  if (!(tau > 0.0f)) return;
  const float z = value / tau, score = z + gumbel_noise(seed, pos, static_cast<uint32_t>(id));
  if (r.sample_index < 0) {
    r.sample_index = id;
    r.score = score;
    r.z = r.z_max = z;
    r.z_sum = 1.0f;
    return;
  }
  if (score > r.score) {
    r.sample_index = id;
    r.score = score;
    r.z = z;
  }
  // merge_markov's fold with exp(0) = 1 left out: the same bits.
  if (z > r.z_max) {
    r.z_sum = r.z_sum * std::exp(r.z_max - z) + 1.0f;
    r.z_max = z;
  } else {
    r.z_sum = r.z_sum + std::exp(z - r.z_max);
  }
}

MarkovRecord markov_scan(const float* values, int64_t n, int32_t first_id, float tau, uint64_t seed,
                         uint32_t pos) {
  MarkovRecord r = markov_empty();
  for (int64_t i = 0; i < n; ++i)
    markov_scan_add(r, values[i], first_id + static_cast<int32_t>(i), tau, seed, pos);
  return r;
}

}  // namespace dspark
