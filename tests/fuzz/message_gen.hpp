// The host messages the fuzz sends: a valid request of every kind (steps mixing resets, contexts and drafts
// in every order, set_max_model_len, attach, detach, stats, health), then, most of the time, mutated: a field
// set out of range (slots, tokens, positions, window lows, k', max_model_len), counts over the limits, a NaN
// or Inf in a row, a context's wire row count patched to 0, negative or huge, or the encoded bytes mutated
// (tests/support/byte_mutate.hpp: bytes, fields, truncation, extension, misalignment).
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "lib/host/codec.hpp"
#include "tests/fuzz/fuzz_shape.hpp"

namespace dspark::fuzz {

enum class Mutation { none, field, wire_rows, bytes };

struct Message {
  std::vector<uint8_t> bytes;
  Mutation mutation = Mutation::none;
};

class MessageGen {
 public:
  MessageGen(const Shape& shape, uint64_t seed);
  // A message for a worker whose max_model_len is now `max_model_len` (valid positions stay below it).
  Message next(int64_t max_model_len);

 private:
  host::Request valid(int64_t max_model_len);
  host::Request step(int64_t max_model_len);
  void mutate_fields(host::Request& r, int64_t max_model_len);
  int32_t any_int32();

  Shape shape_;
  host::ModelDescription model_;
  std::mt19937_64 rng_;
  uint64_t id_ = 0;
};

}  // namespace dspark::fuzz
