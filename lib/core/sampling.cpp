#include "lib/core/sampling.hpp"

#include <fmt/format.h>

#include <cmath>

#include "lib/core/philox.hpp"

namespace dspark {

std::string temperature_problem(float tau) {
  if (std::isnan(tau)) return "temperature is NaN";
  if (tau < 0.0f) return fmt::format("temperature {} is negative", tau);
  if (tau > kMaxTemperature) return fmt::format("temperature {} is above {}", tau, kMaxTemperature);
  return {};
}

float gumbel_noise(uint64_t seed, uint32_t pos, uint32_t v) {
  const PhiloxBlock r =
      philox4x32_10({{pos, v, 0u, 0u}}, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  const double u = (static_cast<double>(r.v[0]) + 0.5) * 0x1p-32;  // exact: 33 significant bits
  return static_cast<float>(-std::log(-std::log(u)));
}

SampleRecord sample_shard(const float* logits, const float* bias, int64_t n, int32_t first_id, float tau,
                          uint64_t seed, uint32_t pos) {
  SampleRecord r;
  if (n <= 0) return r;
  float z_max = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    const float z = (logits[i] + (bias ? bias[i] : 0.0f)) / tau;
    z_max = std::fmax(z_max, z);
    const int32_t id = first_id + static_cast<int32_t>(i);
    const float s = z + gumbel_noise(seed, pos, static_cast<uint32_t>(id));
    if (r.index < 0 || s > r.best) {  // strict: an equal score keeps the lower id
      r.best = s;
      r.index = id;
    }
  }
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += std::exp((logits[i] + (bias ? bias[i] : 0.0f)) / tau - z_max);
  r.z_max = z_max;
  r.z_sum = sum;
  return r;
}

SampleRecord merge_samples(const SampleRecord& a, const SampleRecord& b) {
  if (a.index < 0) return b;
  if (b.index < 0) return a;
  SampleRecord out;
  const bool a_wins = a.best > b.best || (a.best == b.best && a.index < b.index);
  out.best = a_wins ? a.best : b.best;
  out.index = a_wins ? a.index : b.index;
  out.z_max = std::fmax(a.z_max, b.z_max);
  out.z_sum = a.z_sum * std::exp(a.z_max - out.z_max) + b.z_sum * std::exp(b.z_max - out.z_max);
  return out;
}

float sampled_probability(const SampleRecord& r, float z_tok) {
  return std::exp(z_tok - r.z_max) / r.z_sum;
}

}  // namespace dspark
