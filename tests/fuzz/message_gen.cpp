#include "tests/fuzz/message_gen.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <limits>

#include "tests/support/byte_mutate.hpp"

namespace dspark::fuzz {
namespace {

constexpr int32_t kI32Min = std::numeric_limits<int32_t>::min();
constexpr int32_t kI32Max = std::numeric_limits<int32_t>::max();

template <typename T, size_t N>
T pick(std::mt19937_64& rng, const T (&v)[N]) {
  return v[rng() % N];
}

int64_t uniform(std::mt19937_64& rng, int64_t lo, int64_t hi) {  // [lo, hi]
  return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
}

}  // namespace

MessageGen::MessageGen(const Shape& shape, uint64_t seed)
    : shape_(shape), model_(shape.description()), rng_(seed) {}

int32_t MessageGen::any_int32() {
  return static_cast<int32_t>(static_cast<uint32_t>(rng_()));
}

host::Request MessageGen::step(int64_t mml) {
  host::Request r;
  r.type = host::MessageType::step;
  StepPlan& p = r.step;
  p.margin = rng_() % 2 == 0;
  for (int64_t n = rng_() % 2 ? uniform(rng_, 1, 3) : 0; n > 0; --n)
    p.resets.push_back(static_cast<int32_t>(uniform(rng_, 0, shape_.slots - 1)));
  int64_t budget = shape_.max_context_rows;
  for (int64_t n = uniform(rng_, 0, 3); n > 0 && budget > 0; --n) {
    // Mostly a few rows, sometimes more than the window (the drafter then keeps the last W).
    const int64_t want =
        rng_() % 8 == 0 ? uniform(rng_, shape_.window, shape_.window + 8) : uniform(rng_, 1, 6);
    const int64_t rows = std::min({want, budget, mml});
    const int64_t first = uniform(rng_, 0, mml - rows);
    p.contexts.push_back({static_cast<int32_t>(uniform(rng_, 0, shape_.slots - 1)),
                          static_cast<int32_t>(first), static_cast<int32_t>(rows)});
    budget -= rows;
    for (int64_t i = 0; i < rows * shape_.row_dim; ++i) {
      auto v = static_cast<bf16_t>(rng_());
      if ((v & 0x7f80) == 0x7f80) v = static_cast<bf16_t>(v & ~0x0080);  // finite: not all exponent ones
      p.rows.push_back(v);
    }
  }
  int64_t distributions = 0;
  for (int64_t n = uniform(rng_, 0, shape_.max_batch); n > 0; --n) {
    DraftRequest d;
    d.slot = static_cast<int32_t>(uniform(rng_, 0, shape_.slots - 1));
    d.anchor_token = static_cast<int32_t>(uniform(rng_, 0, shape_.vocab - 1));
    d.anchor_pos = static_cast<int32_t>(uniform(rng_, 0, mml - 1));
    d.window_low = rng_() % 2 ? -1 : static_cast<int32_t>(uniform(rng_, 0, d.anchor_pos));
    d.outputs = static_cast<int32_t>(uniform(rng_, 0, shape_.k));
    d.accepted = static_cast<int32_t>(uniform(rng_, -1, shape_.k));  // -1: no report
    if (rng_() % 4 == 0) {  // a sampled request, now and then asking for its distribution
      d.temperature = static_cast<float>(uniform(rng_, 1, 200)) / 100.0f;
      d.seed = rng_();
      d.distribution = rng_() % 3 == 0 && distributions < shape_.max_distributions;
      distributions += d.distribution ? 1 : 0;
    }
    p.drafts.push_back(d);
  }
  return r;
}

host::Request MessageGen::valid(int64_t mml) {
  const uint64_t kind = rng_() % 100;
  if (kind < 75) return step(mml);
  host::Request r;
  if (kind < 85) {
    r.type = host::MessageType::set_max_model_len;
    r.max_model_len = rng_() % 2 ? shape_.max_model_len : uniform(rng_, 1, shape_.max_model_len);
  } else {
    const host::MessageType others[] = {host::MessageType::attach, host::MessageType::detach,
                                        host::MessageType::stats, host::MessageType::health};
    r.type = pick(rng_, others);
    r.attach = {host::kProtocolVersion, static_cast<int32_t>(rng_() % 100000)};
  }
  return r;
}

void MessageGen::mutate_fields(host::Request& r, int64_t mml) {
  if (r.type == host::MessageType::set_max_model_len) {
    const int64_t bad[] = {0,
                           -1,
                           shape_.max_model_len + 1,
                           std::numeric_limits<int64_t>::max(),
                           std::numeric_limits<int64_t>::min(),
                           static_cast<int64_t>(rng_())};
    r.max_model_len = pick(rng_, bad);
    return;
  }
  StepPlan& p = r.step;
  const int32_t S = static_cast<int32_t>(shape_.slots);
  const int32_t bad_slots[] = {-1, S, S + 1, kI32Max, kI32Min, any_int32()};
  auto ensure_context = [&] {
    if (!p.contexts.empty()) return;
    p.contexts.push_back({0, 0, 1});
    p.rows.resize(p.rows.size() + static_cast<size_t>(shape_.row_dim), 0x3f80);
  };
  auto ensure_draft = [&] {
    if (p.drafts.empty()) p.drafts.push_back({0, 1, static_cast<int32_t>(mml - 1), -1, 0});
  };
  auto a_context = [&]() -> ContextBlock& { return p.contexts[rng_() % p.contexts.size()]; };
  auto a_draft = [&]() -> DraftRequest& { return p.drafts[rng_() % p.drafts.size()]; };
  switch (rng_() % 12) {
    case 0:
      p.resets.insert(p.resets.begin() + static_cast<std::ptrdiff_t>(rng_() % (p.resets.size() + 1)),
                      pick(rng_, bad_slots));
      break;
    case 1:
      ensure_context();
      a_context().slot = pick(rng_, bad_slots);
      break;
    case 2: {
      ensure_context();
      ContextBlock& c = a_context();
      const int32_t bad[] = {
          -1,         static_cast<int32_t>(mml - c.rows + 1), static_cast<int32_t>(mml), kI32Max, kI32Min,
          any_int32()};
      c.first_pos = pick(rng_, bad);
    } break;
    case 3: {  // more rows than max_context_rows, in valid blocks
      const int64_t rows =
          std::min<int64_t>(mml, shape_.max_context_rows + 1 + static_cast<int64_t>(rng_() % 40));
      p.contexts.push_back({static_cast<int32_t>(rng_() % shape_.slots), 0, static_cast<int32_t>(rows)});
      p.rows.resize(p.rows.size() + static_cast<size_t>(rows * shape_.row_dim), 0x3f80);
    } break;
    case 4: {  // a NaN or an infinity in a row
      ensure_context();
      const bf16_t bad[] = {0x7f80, 0xff80, 0x7fc0, 0xffff, 0x7f81};
      p.rows[rng_() % p.rows.size()] = pick(rng_, bad);
    } break;
    case 5:
      ensure_draft();
      a_draft().slot = pick(rng_, bad_slots);
      break;
    case 6: {
      ensure_draft();
      const int32_t V = static_cast<int32_t>(shape_.vocab);
      const int32_t bad[] = {-1, V, V + 1, kI32Max, kI32Min, any_int32()};
      a_draft().anchor_token = pick(rng_, bad);
    } break;
    case 7: {
      ensure_draft();
      const int32_t bad[] = {-1, static_cast<int32_t>(mml), static_cast<int32_t>(mml + 1), kI32Max, kI32Min};
      DraftRequest& d = a_draft();
      d.anchor_pos = pick(rng_, bad);
      d.window_low = -1;
    } break;
    case 8: {
      ensure_draft();
      DraftRequest& d = a_draft();
      const int32_t bad[] = {-2, d.anchor_pos + 1, kI32Min, kI32Max, any_int32()};
      d.window_low = pick(rng_, bad);
    } break;
    case 9: {
      ensure_draft();
      const int32_t K = static_cast<int32_t>(shape_.k);
      const int32_t bad[] = {-1, K + 1, kI32Max, kI32Min};
      a_draft().outputs = pick(rng_, bad);
    } break;
    case 10: {  // a temperature outside [0, 100], a distribution of a greedy draft, too many distributions
      ensure_draft();
      DraftRequest& d = a_draft();
      const float bad[] = {-1.0f, -0.0001f, 100.5f, std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN()};
      switch (rng_() % 3) {
        case 0:
          d.temperature = pick(rng_, bad);
          break;
        case 1:
          d.temperature = 0.0f;
          d.distribution = true;
          break;
        default:
          for (DraftRequest& each : p.drafts) {
            each.temperature = 1.0f;
            each.distribution = true;
          }
          while (static_cast<int64_t>(p.drafts.size()) <= shape_.max_distributions) {
            DraftRequest extra{0, 1, 0, -1, 0};
            extra.temperature = 1.0f;
            extra.distribution = true;
            p.drafts.push_back(extra);
          }
      }
    } break;
    default: {  // a batch over max_batch, now and then a huge one
      const int64_t n = rng_() % 32 == 0 ? 5000 : shape_.max_batch + 1 + static_cast<int64_t>(rng_() % 8);
      while (static_cast<int64_t>(p.drafts.size()) < n) p.drafts.push_back({0, 1, 0, -1, 0});
    }
  }
}

Message MessageGen::next(int64_t mml) {
  host::Request r = valid(mml);
  r.id = ++id_;
  Message m;
  const uint64_t roll = rng_() % 100;
  const bool fields = r.type == host::MessageType::step || r.type == host::MessageType::set_max_model_len;
  if (roll < 25) {
    m.mutation = Mutation::none;
  } else if (roll < 60 && fields) {
    m.mutation = Mutation::field;
    mutate_fields(r, mml);
  } else if (roll < 70 && r.type == host::MessageType::step && !r.step.contexts.empty()) {
    m.mutation = Mutation::wire_rows;
  } else {
    m.mutation = Mutation::bytes;
  }
  m.bytes.resize(host::encoded_size(r, model_));
  host::encode_request(r, model_, m.bytes.data());
  if (m.mutation == Mutation::wire_rows) {  // a context's row count on the wire, past what the payload holds
    const size_t i = rng_() % r.step.contexts.size();
    const size_t at = sizeof(host::MessageHeader) + sizeof(host::StepRequest) + 4 * r.step.resets.size() +
                      sizeof(host::ContextWire) * i + offsetof(host::ContextWire, rows);
    const int32_t rows = r.step.contexts[i].rows;
    const int32_t bad[] = {0, -1, kI32Min, kI32Max, rows + 1, rows - 1, rows * 2};
    const int32_t v = pick(rng_, bad);
    std::memcpy(m.bytes.data() + at, &v, sizeof(v));
  }
  if (m.mutation == Mutation::bytes) test::mutate_bytes(m.bytes, rng_);
  return m;
}

}  // namespace dspark::fuzz
