// The C API of dspark_client.h: thin shims over dspark::client::Connection. No exception crosses this
// boundary; every failure becomes a status and a reason for dspark_last_error().
#include "dspark_client.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <exception>
#include <memory>
#include <new>
#include <span>
#include <string>

#include "connection.hpp"
#include "step_call.hpp"

using dspark::client::Connection;
using dspark::client::Deadline;
using dspark::client::failed;
using dspark::client::Outcome;
using dspark::client::StepArgs;

// The C header's format codes are the wire's.
static_assert(DSPARK_HOT_UNCACHED_TOKENS == dspark::host::kHotUncachedTokens);
static_assert(uint32_t{DSPARK_FORMAT_DENSE} == dspark::host::kFormatDense &&
              uint32_t{DSPARK_FORMAT_FP8_BLOCK} == dspark::host::kFormatFp8Block &&
              uint32_t{DSPARK_FORMAT_FP4} == dspark::host::kFormatFp4 &&
              uint32_t{DSPARK_FORMAT_EXL3} == dspark::host::kFormatExl3);

struct dspark_client {
  std::unique_ptr<Connection> conn;  // never null while the handle exists
  int32_t timeout_ms = 30000;
  mutable std::string last_error;
  dspark::client::StepScratch scratch;
};

namespace {

// Failures of attach, and of calls made with a NULL handle.
thread_local std::string t_error;

void set_error(std::string& where, std::string&& what) noexcept {
  try {
    where = std::move(what);
  } catch (...) {
    where.clear();  // out of memory for the message: an empty reason beats an escaping exception
  }
}

template <typename F>
dspark_status guarded(const dspark_client* c, F&& body) noexcept {
  std::string& err = c != nullptr ? c->last_error : t_error;
  try {
    Outcome o = body();
    if (!o.ok()) set_error(err, std::move(o.message));
    return o.status;
  } catch (const std::bad_alloc&) {
    set_error(err, "dspark_client: out of memory");
  } catch (const std::exception& e) {
    set_error(err, std::string("dspark_client: internal error: ") + e.what());
  } catch (...) {
    set_error(err, "dspark_client: internal error");
  }
  return DSPARK_INTERNAL;
}

Outcome null_handle() {
  return failed(DSPARK_INVALID_ARGUMENT, "the client handle is NULL");
}

template <typename F>
dspark_status with_client(dspark_client* c, F&& body) noexcept {
  return guarded(c, [&]() -> Outcome {
    if (c == nullptr) return null_handle();
    return body(*c);
  });
}

dspark_status step(dspark_client* c, const StepArgs& a) noexcept {
  return with_client(c, [&](dspark_client& h) {
    return dspark::client::run_step(*h.conn, a, Deadline(h.timeout_ms), h.scratch);
  });
}

template <typename T>
std::span<const T> span_of(const T* p, uint32_t n) {
  return {p, n};
}

}  // namespace

extern "C" {

dspark_status dspark_attach_as(const char* name, uint32_t worker_uid, int32_t timeout_ms,
                               dspark_client** out) {
  return guarded(nullptr, [&]() -> Outcome {
    if (out == nullptr) return failed(DSPARK_INVALID_ARGUMENT, "dspark_attach: out is NULL");
    *out = nullptr;
    if (name == nullptr || *name == '\0')
      return failed(DSPARK_INVALID_ARGUMENT, "dspark_attach: no ring name");
    if (timeout_ms < 0)
      return failed(DSPARK_INVALID_ARGUMENT,
                    "dspark_attach: timeout_ms " + std::to_string(timeout_ms) + " is negative");
    auto handle = std::make_unique<dspark_client>();
    Outcome o = Connection::attach(name, worker_uid, timeout_ms, handle->conn);
    if (o.ok()) *out = handle.release();
    return o;
  });
}

dspark_status dspark_attach(const char* name, int32_t timeout_ms, dspark_client** out) {
  return dspark_attach_as(name, static_cast<uint32_t>(geteuid()), timeout_ms, out);
}

void dspark_detach(dspark_client* c) {
  if (c == nullptr) return;
  try {
    c->conn->detach(c->timeout_ms);
  } catch (...) {
    // Detach cannot report: closing the handle closes the socket, and the worker ends the session itself.
  }
  delete c;
}

const char* dspark_last_error(const dspark_client* c) {
  return c != nullptr ? c->last_error.c_str() : t_error.c_str();
}

const char* dspark_status_name(dspark_status s) {
  switch (s) {
    case DSPARK_OK:
      return "OK";
    case DSPARK_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case DSPARK_RESOURCE_EXHAUSTED:
      return "RESOURCE_EXHAUSTED";
    case DSPARK_UNAVAILABLE:
      return "UNAVAILABLE";
    case DSPARK_INTERNAL:
      return "INTERNAL";
  }
  return "UNKNOWN";
}

uint32_t dspark_protocol_version(void) {
  return dspark::host::kProtocolVersion;
}

dspark_status dspark_set_timeout(dspark_client* c, int32_t timeout_ms) {
  return with_client(c, [&](dspark_client& h) -> Outcome {
    if (timeout_ms < 0)
      return failed(DSPARK_INVALID_ARGUMENT, "dspark_set_timeout: timeout_ms " + std::to_string(timeout_ms) +
                                                 " is negative (the limit stays " +
                                                 std::to_string(h.timeout_ms) + " ms)");
    h.timeout_ms = timeout_ms;
    return {};
  });
}

dspark_status dspark_model(const dspark_client* c, dspark_model_info* out) {
  return guarded(c, [&]() -> Outcome {
    if (c == nullptr) return null_handle();
    if (out == nullptr) return failed(DSPARK_INVALID_ARGUMENT, "dspark_model: out is NULL");
    const dspark::host::ModelDescription& m = c->conn->model();
    *out = {m.vocab_size,
            m.hidden,
            m.taps,
            m.row_bytes,
            m.block_size,
            m.window,
            m.slots,
            m.max_batch,
            m.max_context_rows,
            m.tp,
            c->conn->max_model_len(),
            m.weight_formats,
            m.head_format};
    return {};
  });
}

dspark_status dspark_model_taps(const dspark_client* c, int32_t* layer_ids, uint32_t capacity, uint32_t* taps,
                                int32_t* noise_token) {
  return guarded(c, [&]() -> Outcome {
    if (c == nullptr) return null_handle();
    if (layer_ids == nullptr && capacity != 0)
      return failed(DSPARK_INVALID_ARGUMENT,
                    fmt::format("dspark_model_taps: layer_ids is NULL with a capacity of {}", capacity));
    const dspark::host::ModelTaps& t = c->conn->taps();
    for (uint32_t i = 0; i < t.layers && i < capacity; ++i) layer_ids[i] = t.layer_ids[i];
    if (taps != nullptr) *taps = t.layers;
    if (noise_token != nullptr) *noise_token = t.noise_token;
    return {};
  });
}

dspark_status dspark_reset(dspark_client* c, const int32_t* slots, uint32_t n) {
  StepArgs a;
  a.resets = span_of(slots, n);
  return step(c, a);
}

dspark_status dspark_context(dspark_client* c, int32_t slot, int32_t first_pos, const void* rows,
                             int32_t n_rows) {
  const dspark_context_block ctx{slot, first_pos, n_rows, rows};
  StepArgs a;
  a.contexts = span_of(&ctx, 1);
  return step(c, a);
}

dspark_status dspark_draft(dspark_client* c, const dspark_draft_request* reqs, uint32_t n, int margins,
                           dspark_draft_output out) {
  StepArgs a;
  a.drafts = span_of(reqs, n);
  a.margins = margins != 0;
  a.out = out;
  return step(c, a);
}

dspark_status dspark_step(dspark_client* c, const int32_t* resets, uint32_t n_resets,
                          const dspark_context_block* ctx, uint32_t n_ctx, const dspark_draft_request* reqs,
                          uint32_t n, int margins, dspark_draft_output out) {
  StepArgs a;
  a.resets = span_of(resets, n_resets);
  a.contexts = span_of(ctx, n_ctx);
  a.drafts = span_of(reqs, n);
  a.margins = margins != 0;
  a.out = out;
  return step(c, a);
}

dspark_status dspark_step_sampled(dspark_client* c, const int32_t* resets, uint32_t n_resets,
                                  const dspark_context_block* ctx, uint32_t n_ctx,
                                  const dspark_draft_request* reqs, const dspark_sampling* sampling,
                                  uint32_t n, int margins, dspark_draft_output out,
                                  dspark_sampled_output sampled) {
  StepArgs a;
  a.resets = span_of(resets, n_resets);
  a.contexts = span_of(ctx, n_ctx);
  a.drafts = span_of(reqs, n);
  a.sampling = sampling;
  a.margins = margins != 0;
  a.out = out;
  a.sampled = sampled;
  return step(c, a);
}

dspark_status dspark_sampling_limits(const dspark_client* c, uint32_t* max_distributions,
                                     float* max_temperature) {
  return guarded(c, [&]() -> Outcome {
    if (c == nullptr) return null_handle();
    if (max_distributions != nullptr) *max_distributions = c->conn->sampling().max_distributions;
    if (max_temperature != nullptr) *max_temperature = c->conn->sampling().max_temperature;
    return {};
  });
}

dspark_status dspark_set_max_model_len(dspark_client* c, int64_t max_model_len) {
  return with_client(c, [&](dspark_client& h) {
    dspark::host::Request r;
    r.type = dspark::host::MessageType::set_max_model_len;
    r.max_model_len = max_model_len;
    Outcome o = h.conn->call(r, Deadline(h.timeout_ms), h.scratch.resp);
    if (o.ok()) h.conn->set_max_model_len(max_model_len);
    return o;
  });
}

dspark_status dspark_serving_stats_get(dspark_client* c, dspark_stats* out, dspark_serving_stats* more) {
  return with_client(c, [&](dspark_client& h) {
    dspark::host::Request r;
    r.type = dspark::host::MessageType::stats;
    Outcome o = h.conn->call(r, Deadline(h.timeout_ms), h.scratch.resp);
    if (!o.ok()) return o;
    const dspark::host::StatsResponse& s = h.scratch.resp.stats;
    if (out != nullptr)
      *out = {s.steps,        s.failed_steps, s.rejected_messages, s.drafts,
              s.context_rows, s.resets,       s.hosts_attached,    s.hosts_lost,
              s.step_us_p50,  s.step_us_p99,  s.step_us_max,       s.hosts_refused};
    if (more != nullptr) {
      const dspark::host::StatsMore& m = h.scratch.resp.stats_more;
      *more = {
          m.acceptance_reports, m.accepted_tokens, m.markov_lookups, m.markov_hits, m.hot_uncached, {}, {}};
      for (uint32_t i = 0; i < DSPARK_HOT_UNCACHED_TOKENS; ++i) {
        more->hot_tokens[i] = m.hot_tokens[i];
        more->hot_seen[i] = m.hot_seen[i];
      }
    }
    return o;
  });
}

dspark_status dspark_stats_get(dspark_client* c, dspark_stats* out) {
  if (out == nullptr) {
    return guarded(
        c, [&]() -> Outcome { return failed(DSPARK_INVALID_ARGUMENT, "dspark_stats_get: out is NULL"); });
  }
  return dspark_serving_stats_get(c, out, nullptr);
}

dspark_status dspark_health_get(dspark_client* c, dspark_health* out) {
  return with_client(c, [&](dspark_client& h) {
    if (out == nullptr) return failed(DSPARK_INVALID_ARGUMENT, "dspark_health_get: out is NULL");
    dspark::host::Request r;
    r.type = dspark::host::MessageType::health;
    Outcome o = h.conn->call(r, Deadline(h.timeout_ms), h.scratch.resp);
    if (!o.ok()) return o;
    const dspark::host::HealthResponse& hr = h.scratch.resp.health;
    *out = {hr.state, hr.tp, hr.steps, hr.failed_in_a_row};
    return o;
  });
}

}  // extern "C"
