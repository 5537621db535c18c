// A draft request and its answer: plain data shared by the model, the step plan and the host protocol.
#pragma once

#include <cstdint>
#include <vector>

namespace dspark {

struct DraftRequest {
  int32_t slot = 0;
  int32_t anchor_token = 0;  // last accepted token a
  int32_t anchor_pos = 0;    // its position P (= last context position + 1)
  int32_t window_low = -1;   // lowest ring position attended; -1 = max(0, P - W); may only raise it
  int32_t outputs = 0;       // k' <= k; 0 = k
  // How many tokens of this slot's previous draft the target accepted (0..k), for the acceptance metrics;
  // -1: not reported. It does not change this draft.
  int32_t accepted = -1;
  // Sampled drafts (SPEC §4): temperature tau (0: greedy; (0, 100]) and the seed of the Gumbel noise; with
  // `distribution` (tau > 0 only) the answer also carries the whole draft distribution q_j of every position.
  float temperature = 0.0f;
  bool distribution = false;
  uint64_t seed = 0;
};

struct DraftResult {
  int64_t batch = 0;
  int64_t k = 0;
  std::vector<int32_t> ids;  // [batch, k]; 0 past a request's k'
  std::vector<float> conf;   // sigmoid of the confidence logit
  std::vector<float> conf_logit;
  std::vector<float> margin;  // top1 - top2 of logits + Markov bias (0 when not asked for)
  std::vector<float>
      q;  // q_j(tok_j): the drafted token's probability under the draft distribution (1 greedy)
  // The whole draft distribution of the positions j < k' of the requests that asked for it, in request then
  // position order: row r is distribution[r V, (r + 1) V), for request distribution_rows[r] / k at position
  // distribution_rows[r] % k. Filled on rank 0 (the answer's rank) only.
  std::vector<float> distribution;
  std::vector<int32_t> distribution_rows;
  // The Markov positions drafted (each a look-up of its previous token in the bias cache), and those whose
  // previous token had a cached row.
  int64_t markov_lookups = 0, markov_hits = 0;
};

}  // namespace dspark
