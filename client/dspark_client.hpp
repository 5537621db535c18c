// dspark::Client: a header-only C++ wrapper of the C client (dspark_client.h). RAII (detaches on
// destruction), results returned by value, every non-OK status thrown as dspark::ClientError. Like the C
// handle, one Client is used by one thread at a time. C++17 or later.
#pragma once

#include <cstdint>
#include <cstring>
#include <iterator>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dspark_client.h"

namespace dspark {

// One slot's context send of Client::step (the C struct; in C++ the bare name dspark_context is the
// function).
using Context = ::dspark_context_block;

// A read-only view of contiguous values (what std::span<const T> is in C++20): from a pointer and a count, or
// anything with data() and size() of T (std::vector, std::array, std::span, a C array); {} is empty.
template <class T>
class Span {
 public:
  constexpr Span() = default;
  constexpr Span(const T* data, size_t size) : data_(data), size_(size) {}
  template <class C, class = std::enable_if_t<
                         std::is_convertible_v<decltype(std::data(std::declval<const C&>())), const T*>>>
  constexpr Span(const C& c) : data_(std::data(c)), size_(std::size(c)) {}
  constexpr const T* data() const { return data_; }
  constexpr size_t size() const { return size_; }
  constexpr const T& operator[](size_t i) const { return data_[i]; }

 private:
  const T* data_ = nullptr;
  size_t size_ = 0;
};

// The bf16 bits of f rounded to nearest, ties to even (what the worker's rows hold); a NaN stays a NaN.
inline uint16_t to_bf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// One slot's context rows with their size: `rows` holds whole rows of row_values() bf16 values each (the
// client checks), the row count following from it.
struct ContextRows {
  int32_t slot = 0;
  int32_t first_pos = 0;
  Span<uint16_t> rows;
};

class ClientError : public std::runtime_error {
 public:
  ClientError(dspark_status status, const std::string& message)
      : std::runtime_error(std::string(dspark_status_name(status)) + ": " + message), status_(status) {}
  dspark_status status() const { return status_; }

 private:
  dspark_status status_;
};

// The answer of a draft batch: n requests of k outputs each, row-major [n, k].
struct DraftBatch {
  uint32_t n = 0;
  uint32_t k = 0;
  std::vector<int32_t> ids;
  std::vector<float> conf;
  std::vector<float> conf_logit;
  std::vector<float> margin;
  // Sampled drafts (Client::step_sampled): q(tok) per output (1 greedy, 0 past k'), and the whole
  // distributions asked for: row r (vocab values from r * vocab) is request rows[r] / k at position rows[r] %
  // k.
  std::vector<float> q;
  std::vector<float> distribution;
  std::vector<int32_t> distribution_rows;
  uint32_t vocab = 0;

  int32_t id(uint32_t i, uint32_t j) const { return ids[size_t{i} * k + j]; }
};

// The host-interface protocol version the client library speaks (dspark_protocol_version).
inline uint32_t protocol_version() {
  return dspark_protocol_version();
}

class Client {
 public:
  // Attaches to the worker of ring name `name` (e.g. "/dspark-tiny", or a socket path), waiting up to
  // timeout_ms for it to serve. The worker must run as this process's euid (dspark_attach).
  explicit Client(const std::string& name, int32_t timeout_ms = 30000) {
    if (dspark_status s = dspark_attach(name.c_str(), timeout_ms, &c_); s != DSPARK_OK)
      throw ClientError(s, dspark_last_error(nullptr));
    model_ = fetch_model();
  }
  // As above, to a worker that runs as `worker_uid` (dspark_attach_as).
  Client(const std::string& name, int32_t timeout_ms, uint32_t worker_uid) {
    if (dspark_status s = dspark_attach_as(name.c_str(), worker_uid, timeout_ms, &c_); s != DSPARK_OK)
      throw ClientError(s, dspark_last_error(nullptr));
    model_ = fetch_model();
  }
  ~Client() { dspark_detach(c_); }
  Client(Client&& o) noexcept : c_(std::exchange(o.c_, nullptr)), model_(o.model_) {}
  Client& operator=(Client&& o) noexcept {
    if (this != &o) {
      dspark_detach(c_);
      c_ = std::exchange(o.c_, nullptr);
      model_ = o.model_;
    }
    return *this;
  }
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Detaches now (the destructor then does nothing).
  void detach() { dspark_detach(std::exchange(c_, nullptr)); }
  bool attached() const { return c_ != nullptr; }
  dspark_client* handle() const { return c_; }

  // Per-call wait limit (>= 0; negative throws with DSPARK_INVALID_ARGUMENT); a call past it throws with
  // DSPARK_UNAVAILABLE.
  void set_timeout(int32_t timeout_ms) { check(dspark_set_timeout(c_, timeout_ms)); }

  // The model description of the attach answer (max_model_len as last set through this client).
  dspark_model_info model() const { return fetch_model(); }
  // The target layers whose streams make a context row's taps, in row order, and the token that fills block
  // positions 1..k-1 (dspark_model_taps).
  std::vector<int32_t> tapped_layers() const {
    uint32_t n = 0;
    check(dspark_model_taps(c_, nullptr, 0, &n, nullptr));
    std::vector<int32_t> ids(n);
    check(dspark_model_taps(c_, ids.data(), n, &n, nullptr));
    return ids;
  }
  int32_t noise_token() const {
    int32_t t = 0;
    check(dspark_model_taps(c_, nullptr, 0, nullptr, &t));
    return t;
  }
  // bf16 values per context row (taps * H).
  uint32_t row_values() const { return model_.row_bytes / 2; }

  void reset(Span<int32_t> slots) { check(dspark_reset(c_, slots.data(), size32(slots.size()))); }

  // Context rows of one slot from first_pos: `rows` holds n * row_values() bf16 values (raw bits).
  void context(int32_t slot, int32_t first_pos, Span<uint16_t> rows) {
    check(dspark_context(c_, slot, first_pos, rows.data(), row_count(rows.size())));
  }

  DraftBatch draft(Span<dspark_draft_request> reqs, bool margins = true) {
    DraftBatch b = batch_for(reqs.size());
    check(dspark_draft(c_, reqs.data(), b.n, margins ? 1 : 0, outputs(b)));
    return b;
  }

  // Resets, then contexts (each ctx.data pointing at ctx.rows * row_bytes bytes), then one draft batch.
  DraftBatch step(Span<int32_t> resets, Span<Context> contexts, Span<dspark_draft_request> reqs,
                  bool margins = true) {
    DraftBatch b = batch_for(reqs.size());
    check(dspark_step(c_, resets.data(), size32(resets.size()), contexts.data(), size32(contexts.size()),
                      reqs.data(), b.n, margins ? 1 : 0, outputs(b)));
    return b;
  }

  // The same with sized contexts: each one's rows must be whole rows (else DSPARK_INVALID_ARGUMENT, nothing
  // sent).
  DraftBatch step(Span<int32_t> resets, Span<ContextRows> contexts, Span<dspark_draft_request> reqs,
                  bool margins = true) {
    std::vector<Context> c;
    c.reserve(contexts.size());
    for (size_t i = 0; i < contexts.size(); ++i)
      c.push_back({contexts[i].slot, contexts[i].first_pos, row_count(contexts[i].rows.size()),
                   contexts[i].rows.data()});
    return step(resets, Span<Context>(c.data(), c.size()), reqs, margins);
  }

  // A step whose requests may be sampled (protocol version 7): sampling[i] for reqs[i] (empty: greedy).
  DraftBatch step_sampled(Span<int32_t> resets, Span<Context> contexts, Span<dspark_draft_request> reqs,
                          Span<dspark_sampling> sampling, bool margins = true) {
    if (sampling.size() != 0 && sampling.size() != reqs.size())
      throw ClientError(DSPARK_INVALID_ARGUMENT, std::to_string(sampling.size()) + " sampling entries for " +
                                                     std::to_string(reqs.size()) + " requests");
    DraftBatch b = batch_for(reqs.size());
    b.q.resize(b.ids.size());
    uint32_t asked = 0;
    for (size_t i = 0; i < sampling.size(); ++i)
      if ((sampling[i].flags & DSPARK_SAMPLE_DISTRIBUTION) != 0)
        asked += reqs[i].outputs == 0 ? b.k : static_cast<uint32_t>(reqs[i].outputs);
    b.vocab = model_.vocab_size;
    b.distribution.resize(size_t{asked} * b.vocab);
    b.distribution_rows.resize(asked);
    uint32_t rows = 0;
    check(dspark_step_sampled(
        c_, resets.data(), size32(resets.size()), contexts.data(), size32(contexts.size()), reqs.data(),
        sampling.size() == 0 ? nullptr : sampling.data(), b.n, margins ? 1 : 0, outputs(b),
        {b.q.data(), b.distribution.data(), b.distribution_rows.data(), asked, &rows}));
    b.distribution.resize(size_t{rows} * b.vocab);
    b.distribution_rows.resize(rows);
    return b;
  }

  // Requests per step that may ask for their whole distribution (dspark_sampling_limits).
  uint32_t max_distributions() const {
    uint32_t n = 0;
    check(dspark_sampling_limits(c_, &n, nullptr));
    return n;
  }

  void set_max_model_len(int64_t max_model_len) { check(dspark_set_max_model_len(c_, max_model_len)); }

  // Acceptance and the Markov bias cache (protocol version 6): one stats round trip.
  dspark_serving_stats serving_stats() {
    dspark_serving_stats m{};
    check(dspark_serving_stats_get(c_, nullptr, &m));
    return m;
  }
  dspark_stats stats() {
    dspark_stats s{};
    check(dspark_stats_get(c_, &s));
    return s;
  }

  dspark_health health() {
    dspark_health h{};
    check(dspark_health_get(c_, &h));
    return h;
  }

 private:
  void check(dspark_status s) const {
    if (s != DSPARK_OK) throw ClientError(s, dspark_last_error(c_));
  }
  dspark_model_info fetch_model() const {
    dspark_model_info m{};
    check(dspark_model(c_, &m));
    return m;
  }
  static uint32_t size32(size_t n) {
    if (n > UINT32_MAX) throw ClientError(DSPARK_INVALID_ARGUMENT, "more than 2^32 - 1 elements");
    return static_cast<uint32_t>(n);
  }
  int32_t row_count(size_t values) const {
    const uint32_t per_row = row_values();
    if (per_row == 0 || values % per_row != 0 || values / per_row > INT32_MAX)
      throw ClientError(
          DSPARK_INVALID_ARGUMENT,
          std::to_string(values) + " bf16 values are not whole rows of " + std::to_string(per_row));
    return static_cast<int32_t>(values / per_row);
  }
  DraftBatch batch_for(size_t n) const {
    DraftBatch b;
    b.n = size32(n);
    b.k = model_.block_size;
    const size_t nk = size_t{b.n} * b.k;
    b.ids.resize(nk);
    b.conf.resize(nk);
    b.conf_logit.resize(nk);
    b.margin.resize(nk);
    return b;
  }
  static dspark_draft_output outputs(DraftBatch& b) {
    return {b.ids.data(), b.conf.data(), b.conf_logit.data(), b.margin.data()};
  }

  dspark_client* c_ = nullptr;
  dspark_model_info model_{};
};

}  // namespace dspark
