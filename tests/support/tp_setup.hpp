// What the tensor-parallel tests (CPU over MPI, GPU over NCCL) share: a model that splits unevenly, and one
// seeded context + draft batch inserted identically into every drafter under comparison.
#pragma once

#include <initializer_list>
#include <random>
#include <vector>

#include "lib/config/model_config.hpp"
#include "lib/core/numeric.hpp"
#include "lib/model/drafter.hpp"

namespace dspark::test {

// The tiny model reshaped so that every split is exercised unevenly at tp 2 and 3: 12 heads in 6 groups,
// 640 intermediate channels (5 units of 128) and 1280 vocabulary columns (5 tiles of 256); and 320 hidden
// channels, so that rows are wider than one 256-thread block (the GPU's element-wise and norm kernels split
// such rows over blocks; the tiny model's 256 fits one). For `ranks` that 6 groups do not divide, 16 heads in
// 8 groups (tp 4 and 8); for more ranks than 5 units, 1152 intermediate channels (9 units) and 2304
// vocabulary columns (9 tiles): uneven at 8 too.
inline ModelConfig tp_test_config(int ranks = 1) {
  ModelConfig c = tiny_model_config();
  c.dim = 320;
  c.n_heads = 12;
  c.o_groups = 6;
  c.moe_inter_dim = 640;
  c.vocab_size = 1280;
  c.noise_token_id = 1200;
  if (c.o_groups % ranks != 0) {
    c.n_heads = 16;
    c.o_groups = 8;
  }
  if (ranks > 5) {
    c.moe_inter_dim = 1152;
    c.vocab_size = 2304;
  }
  return c;
}

constexpr int64_t kTpRows[4] = {7, 16, 23, 40};  // context rows of slots 0..3 (slot 3 wraps its W = 16 ring)

// Inserts the same seeded rows into slots 0..3 of every drafter and returns one request per slot (same seed
// on every rank: identical context everywhere). With `vary_outputs`, request 1 drafts k' = 3.
inline std::vector<DraftRequest> insert_tp_context(std::initializer_list<Drafter*> drafters, int64_t row_dim,
                                                   bool vary_outputs) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int s = 0; s < 4; ++s) {
    std::vector<bf16_t> rows(static_cast<size_t>(kTpRows[s] * row_dim));
    for (auto& v : rows) v = float_to_bf16(normal(rng));
    for (Drafter* d : drafters) d->insert(s, 0, rows.data(), kTpRows[s]);
  }
  std::vector<DraftRequest> batch;
  for (int s = 0; s < 4; ++s)
    batch.push_back({s, static_cast<int32_t>(rng() % 1000), static_cast<int32_t>(kTpRows[s]), -1,
                     vary_outputs && s == 1 ? 3 : 0});
  return batch;
}

}  // namespace dspark::test
