// Sampled drafts recomputed from a drafter's traced logits (SPEC §4, "Sampled drafts"): the Markov bias of
// each position's previous token (markov_bias_rows, the drafter's bits), then z = (logit + bias) / tau,
// Gumbel-max with the noise's own definition, and softmax in double. Tests compare a drafter's answer with
// it, and another run's (tp = N, the GPU) wherever the perturbed scores' top two are further apart than the
// rounding difference of their logits.
#pragma once

#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "lib/api/draft_types.hpp"
#include "lib/core/gumbel.hpp"
#include "lib/model/backend.hpp"
#include "lib/model/weights.hpp"
#include "tests/support/tensor_host.hpp"

namespace dspark::test {

struct SampledPosition {
  int32_t token = -1;        // the draw's token (-1: a greedy request or a position past k')
  float gap = 0.0f;          // its perturbed score less the second best
  double q = 0.0;            // its probability, softmax in double
  std::vector<double> dist;  // the whole distribution
};

// Per request and position of `answer` (from a drafter at tp = 1 whose traced "base_logits" are `logits`,
// [B k, V]): the recomputed draw, with its previous tokens taken from `answer`. be and w: a backend holding
// the drafter's whole markov_head (tp = 1's weights).
inline std::vector<std::vector<SampledPosition>> recompute_draws(Backend& be, const DrafterWeights& w,
                                                                 int64_t V,
                                                                 std::span<const DraftRequest> batch,
                                                                 const DraftResult& answer,
                                                                 const std::vector<float>& logits) {
  const int64_t k = answer.k;
  std::vector<int32_t> prev;
  for (size_t r = 0; r < batch.size(); ++r)
    for (int64_t j = 0; j < k; ++j)
      prev.push_back(j == 0 ? batch[r].anchor_token : answer.ids[r * static_cast<size_t>(k) + j - 1]);
  const auto n = static_cast<int64_t>(prev.size());
  const Tensor bias = be.alloc(DType::f32, {n, V});
  be.markov_bias_rows(w.markov_head, w.markov_head_tiles, w.markov_embed, make_i32(be, {n}, prev), bias);
  const std::vector<float> b = to_floats(be, bias);
  std::vector<std::vector<SampledPosition>> out(batch.size());
  for (size_t r = 0; r < batch.size(); ++r) {
    const DraftRequest& q = batch[r];
    const int64_t outputs = q.outputs == 0 ? k : q.outputs;
    out[r].resize(static_cast<size_t>(k));
    if (q.temperature == 0.0f) continue;
    for (int64_t j = 0; j < outputs; ++j) {
      const size_t t = r * static_cast<size_t>(k) + static_cast<size_t>(j);
      SampledPosition& p = out[r][static_cast<size_t>(j)];
      std::vector<float> z(static_cast<size_t>(V));
      float best = -INFINITY, second = -INFINITY, z_max = -INFINITY;
      for (int64_t v = 0; v < V; ++v) {
        const float value = logits[t * V + v] + b[t * V + v];  // the backends' arithmetic, in float
        z[static_cast<size_t>(v)] = value / q.temperature;
        z_max = std::max(z_max, z[static_cast<size_t>(v)]);
        const float score =
            z[static_cast<size_t>(v)] +
            gumbel_noise(q.seed, static_cast<uint32_t>(q.anchor_pos + j), static_cast<uint32_t>(v));
        if (score > best) {
          second = best, best = score, p.token = static_cast<int32_t>(v);
        } else if (score > second) {
          second = score;
        }
      }
      double sum = 0;
      for (const float x : z) sum += std::exp(double(x) - z_max);
      p.gap = best - second;
      p.dist.resize(static_cast<size_t>(V));
      for (int64_t v = 0; v < V; ++v)
        p.dist[static_cast<size_t>(v)] = std::exp(double(z[static_cast<size_t>(v)]) - z_max) / sum;
      p.q = p.dist[static_cast<size_t>(p.token)];
    }
  }
  return out;
}

}  // namespace dspark::test
