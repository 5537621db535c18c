// The sampled drafts' arithmetic (lib/core/philox.hpp, gumbel.hpp, markov_record.hpp, sampling.hpp) against
// independent answers: Random123's published known-answer vectors for Philox-4x32-10, the noise of a known
// block by its closed form, the drawn tokens' frequencies against softmax computed in long double
// (chi-square), the scan against the fold of single-id records, shards merged against the whole row, and the
// tau -> 0 limit against the greedy argmax.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "lib/core/gumbel.hpp"
#include "lib/core/philox.hpp"
#include "lib/core/sampling.hpp"

namespace dspark {
namespace {

void expect_block(const PhiloxBlock& b, uint32_t w0, uint32_t w1, uint32_t w2, uint32_t w3) {
  EXPECT_EQ(b.v[0], w0);
  EXPECT_EQ(b.v[1], w1);
  EXPECT_EQ(b.v[2], w2);
  EXPECT_EQ(b.v[3], w3);
}

TEST(Philox, RandomOneTwoThreesKnownAnswers) {
  expect_block(philox4x32_10({{0, 0, 0, 0}}, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
  expect_block(
      philox4x32_10({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu),
      0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu);
  expect_block(
      philox4x32_10({{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u),
      0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

// Seed 0, position 0, id 0 is the first vector's block: u = (0x6627e8d5 + 1/2) / 2^32.
TEST(GumbelNoise, IsMinusLogMinusLogOfTheBlocksFirstWord) {
  const long double u = (static_cast<long double>(0x6627e8d5u) + 0.5L) / 4294967296.0L;
  EXPECT_EQ(gumbel_noise(0, 0, 0), static_cast<float>(-std::log(-std::log(u))));
  // The key is the seed's low word then its high word: seed 2^32 keys (0, 1), another block.
  EXPECT_NE(gumbel_noise(uint64_t{1} << 32, 0, 0), gumbel_noise(0, 0, 0));
  EXPECT_NE(gumbel_noise(0, 1, 0), gumbel_noise(0, 0, 1));  // position and id are different counter words
}

TEST(Temperature, ZeroToTheMaximumIsValidAndTheRestIsNamed) {
  for (const float tau : {0.0f, 1e-6f, 0.7f, 1.0f, kMaxTemperature}) EXPECT_EQ(temperature_problem(tau), "");
  EXPECT_EQ(temperature_problem(-0.5f), "temperature -0.5 is negative");
  EXPECT_EQ(temperature_problem(std::nanf("")), "temperature is NaN");
  EXPECT_EQ(temperature_problem(1e4f), "temperature 10000 is above 100");
  EXPECT_EQ(temperature_problem(INFINITY), "temperature inf is above 100");
}

// Biased logits v = logit + bias in float, as a backend adds them.
std::vector<float> biased(const std::vector<float>& logits, const std::vector<float>& bias) {
  std::vector<float> v(logits.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = logits[i] + (bias.empty() ? 0.0f : bias[i]);
  return v;
}

// 40000 seeds at one position over 8 ids: the counts against N q_v, q = softmax((logit + bias) / tau) in long
// double. Chi-square with 7 degrees of freedom stays below 24.32 with probability 0.999.
TEST(SampledDraws, FollowTheSoftmaxOfTheBiasedLogitsOverTemperature) {
  const std::vector<float> logits{0.0f, 0.5f, 1.0f, -1.0f, 2.0f, 0.25f, -0.5f, 1.5f};
  const std::vector<float> bias{0.1f, -0.2f, 0.0f, 0.3f, -0.4f, 0.0f, 0.2f, 0.1f};
  const std::vector<float> values = biased(logits, bias);
  const float tau = 0.7f;
  const int n = 40000;
  std::vector<long double> q(8);
  long double total = 0;
  for (size_t v = 0; v < 8; ++v) total += q[v] = std::exp((long double)(logits[v] + bias[v]) / tau);
  std::vector<int> count(8, 0);
  for (int s = 0; s < n; ++s) {
    const MarkovRecord r = markov_scan(values.data(), 8, 0, tau, static_cast<uint64_t>(s), 17);
    ASSERT_GE(r.sample_index, 0);
    ++count[static_cast<size_t>(r.sample_index)];
  }
  long double chi2 = 0;
  for (size_t v = 0; v < 8; ++v) {
    const long double expected = n * q[v] / total;
    chi2 += (count[v] - expected) * (count[v] - expected) / expected;
  }
  EXPECT_LT(chi2, 24.32L);
}

// markov_scan's one-id fold (markov_scan_add) is merge_markov of markov_single, bit for bit: the CPU loop and
// the kernels' tile merges follow one rule.
TEST(SampledDraws, TheScanIsTheFoldOfSingleIdRecords) {
  std::mt19937 g(11);
  std::normal_distribution<float> z(0.0f, 3.0f);
  std::vector<float> values(300);
  for (float& v : values) v = z(g);
  values[100] = values[40];  // a tie: the lower id keeps it
  for (const float tau : {0.0f, 0.3f, 1.0f, 7.0f})
    for (uint64_t seed = 0; seed < 20; ++seed) {
      MarkovRecord fold = markov_empty();
      for (int32_t i = 0; i < 300; ++i)
        fold = merge_markov(
            fold, markov_single(values[static_cast<size_t>(i)], 50 + i, tau,
                                tau > 0.0f ? gumbel_noise(seed, 9, static_cast<uint32_t>(50 + i)) : 0.0f));
      const MarkovRecord scan = markov_scan(values.data(), 300, 50, tau, seed, 9);
      EXPECT_EQ(std::memcmp(&fold, &scan, sizeof(MarkovRecord)), 0) << "tau " << tau << " seed " << seed;
      EXPECT_EQ(scan.sample_index >= 0, tau > 0.0f);
    }
}

// A row of 1000 ids cut into 2 and 3 uneven shards, merged in order: the same token and perturbed score (the
// same per-id arithmetic), the same max, the sum within rounding, q summing to 1; the top-2 is the whole
// row's exactly.
TEST(SampledDraws, ShardsMergedInOrderDrawWhatTheWholeRowDraws) {
  const int64_t V = 1000;
  std::mt19937 g(3);
  std::normal_distribution<float> z(0.0f, 2.0f);
  std::vector<float> logits(V), bias(V);
  for (int64_t v = 0; v < V; ++v) logits[v] = z(g), bias[v] = 0.1f * z(g);
  const std::vector<float> values = biased(logits, bias);
  const float tau = 0.9f;
  for (uint64_t seed = 0; seed < 200; ++seed) {
    const MarkovRecord whole = markov_scan(values.data(), V, 0, tau, seed, 40);
    for (const std::vector<int64_t>& cuts :
         {std::vector<int64_t>{0, 512, V}, std::vector<int64_t>{0, 256, 768, V}}) {
      MarkovRecord merged = markov_empty();
      for (size_t k = 0; k + 1 < cuts.size(); ++k)
        merged = merge_markov(merged, markov_scan(values.data() + cuts[k], cuts[k + 1] - cuts[k],
                                                  static_cast<int32_t>(cuts[k]), tau, seed, 40));
      EXPECT_EQ(merged.sample_index, whole.sample_index) << "seed " << seed;
      EXPECT_EQ(merged.score, whole.score);
      EXPECT_EQ(merged.z, whole.z);
      EXPECT_EQ(merged.z_max, whole.z_max);
      EXPECT_NEAR(merged.z_sum, whole.z_sum, 1e-5f * whole.z_sum);
      EXPECT_EQ(merged.index, whole.index);
      EXPECT_EQ(merged.best, whole.best);
      EXPECT_EQ(merged.second, whole.second);
    }
  }
  const MarkovRecord r = markov_scan(values.data(), V, 0, tau, 7, 40);
  double sum = 0;
  for (int64_t v = 0; v < V; ++v) sum += std::exp(values[v] / tau - r.z_max) / r.z_sum;
  EXPECT_NEAR(sum, 1.0, 1e-5);
  EXPECT_NEAR(drafted_probability(r), std::exp(values[r.sample_index] / tau - r.z_max) / r.z_sum, 1e-7);
}

// At tau = 1e-4 the biased logits' gaps (>= 0.1, so >= 1000 in z) dwarf the noise (|g| < 25 for every u the
// generator can give): every seed draws the greedy argmax, whose q is 1.
TEST(SampledDraws, TheZeroTemperatureLimitIsTheGreedyToken) {
  const std::vector<float> logits{0.3f, 1.2f, -0.4f, 1.0f, 0.6f};
  for (uint64_t seed = 0; seed < 100; ++seed) {
    const MarkovRecord r = markov_scan(logits.data(), 5, 0, 1e-4f, seed, 3);
    EXPECT_EQ(r.sample_index, 1);
    EXPECT_EQ(drafted_token(r), r.index);
    EXPECT_NEAR(drafted_probability(r), 1.0f, 1e-6f);
  }
  const MarkovRecord greedy = markov_scan(logits.data(), 5, 0, 0.0f, 1, 3);
  EXPECT_EQ(greedy.sample_index, -1);
  EXPECT_EQ(drafted_token(greedy), 1);
  EXPECT_EQ(drafted_probability(greedy), 1.0f);
}

TEST(SampledDraws, AnEmptyShardLeavesAMergeAsItWas) {
  const std::vector<float> logits{0.5f, -0.5f};
  const MarkovRecord r = markov_scan(logits.data(), 2, 10, 1.0f, 1, 1);
  const MarkovRecord empty = markov_scan(logits.data(), 0, 12, 1.0f, 1, 1);
  EXPECT_EQ(empty.sample_index, -1);
  for (const MarkovRecord& m : {merge_markov(empty, r), merge_markov(r, empty)})
    EXPECT_EQ(std::memcmp(&m, &r, sizeof(MarkovRecord)), 0);
}

}  // namespace
}  // namespace dspark
