// Responses: the worker encodes, the host decodes (checked the same way: a client must not crash on a corrupt
// answer either).
#include <algorithm>
#include <string_view>

#include "lib/core/error.hpp"
#include "lib/host/codec.hpp"
#include "lib/host/codec_wire.hpp"

namespace dspark::host {
namespace {

using wire::invalid;
using wire::pad8;

static_assert(sizeof(ModelDescription) == 56 && sizeof(ResponseStatus) == 8 && sizeof(AttachResponse) == 72);
static_assert(sizeof(DraftResponse) == 8 && sizeof(StatsResponse) == 96 && sizeof(HealthResponse) == 24);
static_assert(sizeof(ModelTaps) == 72 && sizeof(StatsMore) == 136);
static_assert(sizeof(DistributionHead) == 8 && sizeof(SamplingLimits) == 8);
static_assert(sizeof(int32_t) == sizeof(float));

constexpr uint32_t kMaxDraftDim = 1u << 16;  // n and k of a draft answer
// Bytes per draft cell: id, conf, conf_logit, margin; from version 7 on also q.
constexpr uint64_t draft_cell_bytes(uint32_t version) {
  return version >= 7 ? 5 * 4 : 4 * 4;
}
// Version 7 on: sampled drafts (q, the whole distributions, the attach answer's SamplingLimits).
bool has_sampling(uint32_t version) {
  return version >= 7;
}
constexpr uint32_t kLastStatus = static_cast<uint32_t>(Status::internal);

// The text as sent: at most kMaxStatusMessageBytes, cut at a UTF-8 character boundary.
std::string_view message_text(const std::string& s) {
  if (s.size() <= kMaxStatusMessageBytes) return s;
  size_t n = kMaxStatusMessageBytes;
  while (n > 0 && (static_cast<uint8_t>(s[n]) & 0xC0) == 0x80) --n;
  return std::string_view(s).substr(0, n);
}

// n * k of a draft answer; throws when its arrays do not match its shape.
uint64_t draft_cells(const DraftResult& d) {
  if (d.batch < 0 || d.batch > kMaxDraftDim || d.k < 0 || d.k > kMaxDraftDim)
    fail("draft answer of {} x {}: each at most {}", d.batch, d.k, kMaxDraftDim);
  const uint64_t cells = static_cast<uint64_t>(d.batch * d.k);
  if (d.ids.size() != cells || d.conf.size() != cells || d.conf_logit.size() != cells ||
      (d.margin.size() != cells && !d.margin.empty()) || (d.q.size() != cells && !d.q.empty()))
    fail("draft answer of {} x {}: arrays of {}, {}, {}, {} and {} values", d.batch, d.k, d.ids.size(),
         d.conf.size(), d.conf_logit.size(), d.margin.size(), d.q.size());
  const uint64_t rows = d.distribution_rows.size();
  if (rows > cells || (rows == 0 && !d.distribution.empty()) ||
      (rows > 0 && d.distribution.size() % rows != 0))
    fail("draft answer of {} x {}: {} distribution rows of {} values", d.batch, d.k, rows,
         d.distribution.size());
  return cells;
}

// The bytes after a version 7 step answer's q: the DistributionHead, the row indices and the rows.
uint64_t distribution_bytes(uint64_t rows, uint64_t vocab) {
  return sizeof(DistributionHead) + pad8(rows * sizeof(int32_t)) + rows * vocab * sizeof(float);
}

// Version 5 on: the attach answer carries ModelTaps after its AttachResponse.
bool has_taps(uint32_t version) {
  return version >= 5;
}

// Version 6 on: the stats answer carries StatsMore after its StatsResponse.
bool has_stats_more(uint32_t version) {
  return version >= 6;
}

uint64_t payload_bytes(const Response& r, uint32_t version) {
  if (!r.status.ok()) {
    if (r.type == MessageType::padding) fail("cannot encode an answer of type padding");
    return 0;
  }
  switch (r.type) {
    case MessageType::attach:
      return sizeof(AttachResponse) + (has_taps(version) ? sizeof(ModelTaps) : 0) +
             (has_sampling(version) ? sizeof(SamplingLimits) : 0);
    case MessageType::step: {
      const uint64_t cells = draft_cells(r.draft), rows = r.draft.distribution_rows.size();
      return sizeof(DraftResponse) + pad8(cells * draft_cell_bytes(version)) +
             (has_sampling(version)
                  ? distribution_bytes(rows, rows == 0 ? 0 : r.draft.distribution.size() / rows)
                  : 0);
    }
    case MessageType::stats:
      return sizeof(StatsResponse) + (has_stats_more(version) ? sizeof(StatsMore) : 0);
    case MessageType::health:
      return sizeof(HealthResponse);
    case MessageType::detach:
    case MessageType::set_max_model_len:
      return 0;
    default:
      fail("cannot encode an OK answer of {}", message_type_name(r.type));
  }
}

void encode_draft(const DraftResult& d, wire::Writer& w, uint32_t version) {
  const uint64_t cells = draft_cells(d);
  w.put(DraftResponse{static_cast<uint32_t>(d.batch), static_cast<uint32_t>(d.k)});
  w.bytes(d.ids.data(), cells * sizeof(int32_t));
  w.bytes(d.conf.data(), cells * sizeof(float));
  w.bytes(d.conf_logit.data(), cells * sizeof(float));
  const auto put_or_zeros = [&](const std::vector<float>& v) {
    if (v.empty())
      w.zeros(cells * sizeof(float));
    else
      w.bytes(v.data(), cells * sizeof(float));
  };
  put_or_zeros(d.margin);
  if (!has_sampling(version)) return;
  put_or_zeros(d.q);
  w.pad();
  const uint64_t rows = d.distribution_rows.size();
  w.put(DistributionHead{static_cast<uint32_t>(rows),
                         rows == 0 ? 0u : static_cast<uint32_t>(d.distribution.size() / rows)});
  w.bytes(d.distribution_rows.data(), rows * sizeof(int32_t));
  w.pad();
  w.bytes(d.distribution.data(), d.distribution.size() * sizeof(float));
}

template <typename T>
void read_array(wire::Reader& in, std::vector<T>& v, uint64_t n) {
  v.resize(n);
  if (n != 0) std::memcpy(v.data(), in.take(n * sizeof(T)), n * sizeof(T));
}

StatusOr decode_draft(wire::Reader& in, DraftResult& d, uint32_t version) {
  DraftResponse h{};
  if (!in.get(h)) return invalid("step answer: too short for its DraftResponse");
  if (h.n > kMaxDraftDim || h.k > kMaxDraftDim)
    return invalid("step answer: drafts of {} x {}; each at most {}", h.n, h.k, kMaxDraftDim);
  const uint64_t cells = uint64_t{h.n} * h.k;
  if (pad8(cells * draft_cell_bytes(version)) > in.left())
    return invalid("step answer: {} x {} drafts do not fit the {} bytes left", h.n, h.k, in.left());
  d.batch = h.n;
  d.k = h.k;
  read_array(in, d.ids, cells);
  read_array(in, d.conf, cells);
  read_array(in, d.conf_logit, cells);
  read_array(in, d.margin, cells);
  if (!has_sampling(version)) return {};
  read_array(in, d.q, cells);
  if (!in.pad()) return invalid("step answer: the padding after its q is not zero");
  DistributionHead dh{};
  if (!in.get(dh)) return invalid("step answer: too short for its DistributionHead");
  if (dh.rows > cells || (dh.rows == 0) != (dh.vocab == 0))
    return invalid("step answer: {} distribution rows of {} values for {} x {} drafts", dh.rows, dh.vocab,
                   h.n, h.k);
  // rows <= 2^32 and vocab < 2^32: the product fits; compared with what is left before anything is read.
  if (distribution_bytes(dh.rows, dh.vocab) - sizeof(DistributionHead) > in.left())
    return invalid("step answer: {} distribution rows of {} values do not fit the {} bytes left", dh.rows,
                   dh.vocab, in.left());
  read_array(in, d.distribution_rows, dh.rows);
  for (uint32_t r = 0; r < dh.rows; ++r) {
    const int32_t t = d.distribution_rows[r];
    if (t < 0 || static_cast<uint64_t>(t) >= cells || (r > 0 && t <= d.distribution_rows[r - 1]))
      return invalid("step answer: distribution row {} is for cell {} (ascending, below {})", r, t, cells);
  }
  if (!in.pad()) return invalid("step answer: the padding after its distribution rows is not zero");
  read_array(in, d.distribution, uint64_t{dh.rows} * dh.vocab);
  return {};
}

// The taps must describe the attach answer's own model: as many layers as its taps, the unused ids zero, a
// noise token inside its vocabulary.
StatusOr check_taps(const ModelTaps& t, const ModelDescription& m) {
  if (t.layers != m.taps || t.layers > kMaxTappedLayers)
    return invalid("attach answer: {} tapped layers for a model of {} taps (at most {})", t.layers, m.taps,
                   kMaxTappedLayers);
  for (uint32_t i = t.layers; i < kMaxTappedLayers; ++i)
    if (t.layer_ids[i] != 0) return invalid("attach answer: tapped layer slot {} is unused but not zero", i);
  for (uint32_t i = 0; i < t.layers; ++i)
    if (t.layer_ids[i] < 0) return invalid("attach answer: tapped layer {} is {}", i, t.layer_ids[i]);
  if (t.noise_token < 0 || static_cast<uint32_t>(t.noise_token) >= m.vocab_size)
    return invalid("attach answer: noise token {} outside the vocabulary of {}", t.noise_token, m.vocab_size);
  return {};
}

// Hits within the look-ups, accepted tokens only with reports, the hot list's unused entries zero.
StatusOr check_stats_more(const StatsMore& m) {
  if (m.markov_hits > m.markov_lookups)
    return invalid("stats answer: {} Markov cache hits in {} look-ups", m.markov_hits, m.markov_lookups);
  if (m.accepted_tokens > 0 && m.acceptance_reports == 0)
    return invalid("stats answer: {} accepted tokens without a report", m.accepted_tokens);
  if (m.hot_uncached > kHotUncachedTokens || m.pad != 0)
    return invalid("stats answer: {} hot tokens (at most {}) or non-zero padding", m.hot_uncached,
                   kHotUncachedTokens);
  for (uint32_t i = m.hot_uncached; i < kHotUncachedTokens; ++i)
    if (m.hot_tokens[i] != 0 || m.hot_seen[i] != 0)
      return invalid("stats answer: hot token slot {} is unused but not zero", i);
  return {};
}

StatusOr decode_payload(wire::Reader& in, const std::string& name, Response& out, uint32_t version) {
  switch (out.type) {
    case MessageType::attach:
      if (!in.get(out.attach)) return invalid("attach answer: too short for its AttachResponse");
      if (out.attach.pad != 0) return invalid("attach answer: its padding is not zero");
      if (!has_taps(version)) return {};
      if (!in.get(out.taps)) return invalid("attach answer: too short for its ModelTaps");
      if (StatusOr st = check_taps(out.taps, out.attach.model); !st.ok()) return st;
      if (!has_sampling(version)) return {};
      if (!in.get(out.sampling)) return invalid("attach answer: too short for its SamplingLimits");
      if (out.sampling.max_distributions > out.attach.model.max_batch ||
          !(out.sampling.max_temperature >= 0.0f && out.sampling.max_temperature <= 1e6f))
        return invalid("attach answer: sampling limits of {} distributions (max batch {}), temperature {}",
                       out.sampling.max_distributions, out.attach.model.max_batch,
                       out.sampling.max_temperature);
      return {};
    case MessageType::step:
      return decode_draft(in, out.draft, version);
    case MessageType::stats:
      if (!in.get(out.stats)) return invalid("stats answer: too short for its StatsResponse");
      if (!has_stats_more(version)) return {};
      if (!in.get(out.stats_more)) return invalid("stats answer: too short for its StatsMore");
      return check_stats_more(out.stats_more);
    case MessageType::health:
      if (!in.get(out.health)) return invalid("health answer: too short for its HealthResponse");
      if (out.health.pad != 0) return invalid("health answer: its padding is not zero");
      return {};
    case MessageType::detach:
    case MessageType::set_max_model_len:
      return {};
    default:
      return invalid("OK answer of {}", name);
  }
}

}  // namespace

uint64_t max_draft_answer_bytes(const ModelDescription& m, uint32_t max_distributions) {
  const uint64_t rows = uint64_t{std::min(max_distributions, m.max_batch)} * m.block_size;
  return sizeof(MessageHeader) + sizeof(ResponseStatus) + pad8(kMaxStatusMessageBytes) +
         sizeof(DraftResponse) +
         pad8(uint64_t{m.max_batch} * m.block_size * draft_cell_bytes(kProtocolVersion)) +
         distribution_bytes(rows, m.vocab_size);
}

uint32_t encoded_size(const Response& r, uint32_t version) {
  if (static_cast<uint32_t>(r.status.status) > kLastStatus)
    fail("cannot encode an answer of status {}", static_cast<uint32_t>(r.status.status));
  const uint64_t n = sizeof(MessageHeader) + sizeof(ResponseStatus) +
                     pad8(message_text(r.status.message).size()) + payload_bytes(r, version);
  if (n > UINT32_MAX) fail("{} answer of {} bytes: over the protocol's 4 GiB", message_type_name(r.type), n);
  return static_cast<uint32_t>(n);
}

void encode_response(const Response& r, uint8_t* dst, uint32_t version) {
  const uint32_t bytes = encoded_size(r, version);
  const std::string_view text = message_text(r.status.message);
  wire::Writer w(dst);
  w.put(MessageHeader{bytes, static_cast<uint32_t>(r.type), r.id});
  w.put(ResponseStatus{static_cast<uint32_t>(r.status.status), static_cast<uint32_t>(text.size())});
  w.bytes(text.data(), text.size());
  w.pad();
  if (!r.status.ok()) return;
  switch (r.type) {
    case MessageType::attach: {
      AttachResponse a = r.attach;
      a.pad = 0;
      w.put(a);
      if (has_taps(version)) w.put(r.taps);
      if (has_sampling(version)) w.put(r.sampling);
      break;
    }
    case MessageType::step:
      encode_draft(r.draft, w, version);
      break;
    case MessageType::stats: {
      w.put(r.stats);
      if (!has_stats_more(version)) break;
      StatsMore m = r.stats_more;
      m.pad = 0;
      w.put(m);
      break;
    }
    case MessageType::health: {
      HealthResponse h = r.health;
      h.pad = 0;
      w.put(h);
      break;
    }
    default:
      break;
  }
}

StatusOr decode_response(std::span<const uint8_t> bytes, Response& out, uint32_t version) {
  out = Response{};
  wire::Reader in(bytes);
  MessageHeader h{};
  if (!in.get(h)) return invalid("answer of {} bytes: shorter than a message header", bytes.size());
  out.type = static_cast<MessageType>(h.type);
  out.id = h.id;
  const std::string name = message_type_name(out.type);
  StatusOr st = [&]() -> StatusOr {
    if (h.bytes != bytes.size() || bytes.size() % kMessageAlign != 0)
      return invalid("{} answer: its header says {} bytes, the message has {}", name, h.bytes, bytes.size());
    if (out.type == MessageType::padding) return invalid("a padding message is not an answer");
    ResponseStatus rs{};
    if (!in.get(rs)) return invalid("{} answer: too short for its status", name);
    if (rs.status > kLastStatus) return invalid("{} answer: unknown status {}", name, rs.status);
    if (rs.message_bytes > kMaxStatusMessageBytes)
      return invalid("{} answer: a message of {} bytes; at most {}", name, rs.message_bytes,
                     kMaxStatusMessageBytes);
    const uint8_t* text = in.take(rs.message_bytes);
    if (text == nullptr || !in.pad())
      return invalid("{} answer: its message of {} bytes does not fit, or its padding is not zero", name,
                     rs.message_bytes);
    out.status = StatusOr{static_cast<Status>(rs.status),
                          std::string(reinterpret_cast<const char*>(text), rs.message_bytes)};
    if (out.status.ok()) {
      StatusOr p = decode_payload(in, name, out, version);
      if (!p.ok()) return p;
    }
    if (in.left() != 0) return invalid("{} answer: {} bytes past its payload", name, in.left());
    return {};
  }();
  if (!st.ok()) {
    out = Response{};
    out.type = static_cast<MessageType>(h.type);
    out.id = h.id;
  }
  return st;
}

}  // namespace dspark::host
