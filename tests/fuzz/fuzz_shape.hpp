// The small model the host-message fuzz runs: its limits (what check_plan and the codec see) and the
// description the codec sizes rows by.
#pragma once

#include <cstdint>

#include "lib/api/step_plan.hpp"
#include "lib/host/protocol.hpp"

namespace dspark::fuzz {

struct Shape {
  int64_t slots = 8;
  int64_t window = 16;  // W: the ring positions a slot holds
  int64_t row_dim = 6;  // bf16 values per context row (taps * H = 3 * 2): 12-byte rows leave padding
  int64_t vocab = 50;
  int64_t k = 4;
  int64_t max_batch = 4;
  int64_t max_context_rows = 32;
  int64_t max_model_len = 256;
  int64_t max_distributions = 2;  // sampled requests per step that may ask for their whole distribution

  StepLimits limits() const {
    return {slots, max_batch, max_context_rows, max_model_len,    max_model_len,
            vocab, k,         row_dim,          max_distributions};
  }
  host::ModelDescription description() const {
    host::ModelDescription m{};
    m.vocab_size = static_cast<uint32_t>(vocab);
    m.hidden = static_cast<uint32_t>(row_dim / 3);
    m.taps = 3;
    m.row_bytes = static_cast<uint32_t>(row_dim * 2);
    m.block_size = static_cast<uint32_t>(k);
    m.window = static_cast<uint32_t>(window);
    m.slots = static_cast<uint32_t>(slots);
    m.max_batch = static_cast<uint32_t>(max_batch);
    m.max_context_rows = static_cast<uint32_t>(max_context_rows);
    m.tp = 1;
    m.max_model_len = max_model_len;
    return m;
  }
};

// A context row's digest and the draft answer derived from a slot's visible context: shared by the fake
// drafter (what it answers) and the naive model (what it expects), so a draft checks that the fake saw
// exactly the rows the model says the slot holds.
uint64_t row_digest(const bf16_t* row, int64_t n);
uint64_t mix(uint64_t a, uint64_t b);
int32_t answer_id(uint64_t context, int32_t token, int32_t pos, int64_t j, int64_t vocab);

}  // namespace dspark::fuzz
