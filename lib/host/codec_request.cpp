// Requests: the host encodes, the worker decodes (checked: a corrupt message is rejected, never trusted).
#include <algorithm>

#include "lib/core/error.hpp"
#include "lib/core/non_finite.hpp"
#include "lib/host/codec.hpp"
#include "lib/host/codec_wire.hpp"

namespace dspark::host {
namespace {

using wire::invalid;
using wire::pad8;

// The wire structs are copied whole: no implicit padding may hide in them.
static_assert(sizeof(MessageHeader) == 16 && sizeof(AttachRequest) == 8 && sizeof(StepRequest) == 16);
static_assert(sizeof(ContextWire) == 12 && sizeof(DraftWire) == 40 && sizeof(DraftWireV4) == 24 &&
              sizeof(DraftWireV3) == 20);
static_assert(sizeof(SetMaxModelLenRequest) == 8 && sizeof(bf16_t) == 2);

uint64_t step_head_bytes(uint64_t resets, uint64_t contexts, uint64_t drafts, uint32_t version) {
  return pad8(sizeof(MessageHeader) + sizeof(StepRequest) + resets * sizeof(int32_t) +
              contexts * sizeof(ContextWire) + drafts * draft_wire_bytes(version));
}

// The bytes of the rows of a step request: step.rows, or its row parts.
uint64_t request_row_bytes(const Request& r) {
  if (r.row_parts.empty()) return r.step.rows.size() * sizeof(bf16_t);
  if (!r.step.rows.empty()) fail("step message: rows given both in the plan and as row parts");
  uint64_t n = 0;
  for (const std::span<const uint8_t>& part : r.row_parts) n += part.size();
  return n;
}

// The bytes of a step message; throws when the plan cannot be encoded as one the decoder accepts.
uint64_t step_bytes(const Request& r, const ModelDescription& m, uint32_t version) {
  const StepPlan& p = r.step;
  if (p.resets.size() > kMaxStepCount || p.contexts.size() > kMaxStepCount || p.drafts.size() > kMaxStepCount)
    fail("step message: {} resets, {} contexts, {} drafts; at most {} each", p.resets.size(),
         p.contexts.size(), p.drafts.size(), kMaxStepCount);
  uint64_t rows = 0;
  for (const ContextBlock& c : p.contexts) {
    if (c.rows < 1) fail("step message: the context for slot {} has {} rows; at least 1", c.slot, c.rows);
    rows += static_cast<uint64_t>(c.rows);
  }
  if (!p.contexts.empty() && (m.row_bytes == 0 || m.row_bytes % sizeof(bf16_t) != 0))
    fail("step message: context rows of {} bytes (must be a positive multiple of 2)", m.row_bytes);
  uint64_t row_bytes = 0;
  const uint64_t held = request_row_bytes(r);
  if (__builtin_mul_overflow(rows, uint64_t{m.row_bytes}, &row_bytes) || row_bytes != held)
    fail("step message: {} context rows of {} bytes, but the plan holds {} bytes of rows", rows, m.row_bytes,
         held);
  return step_head_bytes(p.resets.size(), p.contexts.size(), p.drafts.size(), version) + pad8(row_bytes);
}

void encode_step(const Request& r, wire::Writer& w, uint32_t version) {
  const StepPlan& p = r.step;
  w.put(StepRequest{static_cast<uint32_t>(p.resets.size()), static_cast<uint32_t>(p.contexts.size()),
                    static_cast<uint32_t>(p.drafts.size()), p.margin ? kStepMargins : 0u});
  w.bytes(p.resets.data(), p.resets.size() * sizeof(int32_t));
  for (const ContextBlock& c : p.contexts) w.put(ContextWire{c.slot, c.first_pos, c.rows});
  for (const DraftRequest& d : p.drafts) {
    if (version >= 7)
      w.put(DraftWire{d.slot, d.anchor_token, d.anchor_pos, d.window_low, d.outputs, d.accepted,
                      d.temperature, d.distribution ? kDraftDistribution : 0u, d.seed});
    else if (version >= 4)
      w.put(DraftWireV4{d.slot, d.anchor_token, d.anchor_pos, d.window_low, d.outputs, d.accepted});
    else
      w.put(DraftWireV3{d.slot, d.anchor_token, d.anchor_pos, d.window_low, d.outputs});
  }
  w.pad();
  w.bytes(p.rows.data(), p.rows.size() * sizeof(bf16_t));
  for (const std::span<const uint8_t>& part : r.row_parts) w.bytes(part.data(), part.size());
  w.pad();
}

StatusOr decode_step(wire::Reader& in, const ModelDescription& m, StepPlan& p, uint32_t version) {
  StepRequest s{};
  if (!in.get(s)) return invalid("step message: too short for its StepRequest");
  if ((s.flags & ~kStepMargins) != 0) return invalid("step message: unknown flags 0x{:x}", s.flags);
  if (s.n_resets > kMaxStepCount || s.n_contexts > kMaxStepCount || s.n_drafts > kMaxStepCount)
    return invalid("step message: {} resets, {} contexts, {} drafts; at most {} each", s.n_resets,
                   s.n_contexts, s.n_drafts, kMaxStepCount);
  // The counts are bounded, so the fixed part's size cannot overflow: check it whole before reading any of
  // it.
  if (step_head_bytes(s.n_resets, s.n_contexts, s.n_drafts, version) > in.offset() + in.left())
    return invalid("step message: {} resets, {} contexts and {} drafts do not fit its {} bytes", s.n_resets,
                   s.n_contexts, s.n_drafts, in.offset() + in.left());
  p.margin = (s.flags & kStepMargins) != 0;
  p.rows_first_non_finite = kRowsNotScanned;
  p.resets.resize(s.n_resets);
  for (int32_t& r : p.resets) in.get(r);
  p.contexts.resize(s.n_contexts);
  uint64_t rows = 0;
  for (size_t i = 0; i < p.contexts.size(); ++i) {
    ContextWire c{};
    in.get(c);
    if (c.rows < 1)
      return invalid("step message: context {} (slot {}) has {} rows; at least 1", i, c.slot, c.rows);
    p.contexts[i] = ContextBlock{c.slot, c.first_pos, c.rows};
    rows += static_cast<uint64_t>(c.rows);  // at most 2^16 * 2^31: no overflow
  }
  p.drafts.resize(s.n_drafts);
  for (size_t i = 0; i < p.drafts.size(); ++i) {
    DraftRequest& d = p.drafts[i];
    if (version >= 7) {
      DraftWire dw{};
      in.get(dw);
      if ((dw.flags & ~kDraftDistribution) != 0)
        return invalid("step message: draft {} has unknown flags 0x{:x}", i, dw.flags);
      d = DraftRequest{dw.slot, dw.token, dw.pos, dw.low, dw.outputs, dw.accepted};
      d.temperature = dw.temperature;
      d.distribution = (dw.flags & kDraftDistribution) != 0;
      d.seed = dw.seed;
    } else if (version >= 4) {
      DraftWireV4 dw{};
      in.get(dw);
      d = DraftRequest{dw.slot, dw.token, dw.pos, dw.low, dw.outputs, dw.accepted};
    } else {
      DraftWireV3 dw{};
      in.get(dw);
      d = DraftRequest{dw.slot, dw.token, dw.pos, dw.low, dw.outputs, -1};
    }
  }
  if (!in.pad()) return invalid("step message: the padding after its drafts is not zero");
  if (rows > 0) {
    if (m.row_bytes == 0 || m.row_bytes % sizeof(bf16_t) != 0)
      return invalid("step message: context rows of {} bytes (must be a positive multiple of 2)",
                     m.row_bytes);
    if (rows > in.left() / m.row_bytes)
      return invalid("step message: {} context rows of {} bytes do not fit the {} bytes left", rows,
                     m.row_bytes, in.left());
    const uint64_t n = rows * m.row_bytes;
    p.rows.resize(n / sizeof(bf16_t));
    // Copied and scanned for NaN / Inf in one pass: check_plan reads the result instead of a second pass.
    p.rows_first_non_finite =
        copy_bf16_first_non_finite(p.rows.data(), in.take(n), static_cast<int64_t>(p.rows.size()));
    if (!in.pad()) return invalid("step message: the padding after its rows is missing or not zero");
  }
  return {};
}

}  // namespace

std::string message_type_name(MessageType t) {
  switch (t) {
    case MessageType::padding:
      return "padding";
    case MessageType::attach:
      return "attach";
    case MessageType::detach:
      return "detach";
    case MessageType::step:
      return "step";
    case MessageType::set_max_model_len:
      return "set_max_model_len";
    case MessageType::stats:
      return "stats";
    case MessageType::health:
      return "health";
  }
  return fmt::format("unknown type {}", static_cast<uint32_t>(t));
}

uint64_t max_step_bytes(const ModelDescription& m) {
  // The newest layout is the largest of the served ones.
  static_assert(draft_wire_bytes(kProtocolVersion) >= draft_wire_bytes(kMinProtocolVersion));
  const uint64_t contexts = std::min<uint64_t>(m.max_context_rows, kMaxStepCount);  // each has a row at least
  return step_head_bytes(std::min<uint64_t>(m.slots, kMaxStepCount), contexts,
                         std::min<uint64_t>(m.max_batch, kMaxStepCount), kProtocolVersion) +
         pad8(uint64_t{m.max_context_rows} * m.row_bytes);
}

uint32_t encoded_size(const Request& r, const ModelDescription& m, uint32_t version) {
  uint64_t n = sizeof(MessageHeader);
  switch (r.type) {
    case MessageType::attach:
      n += sizeof(AttachRequest);
      break;
    case MessageType::detach:
    case MessageType::stats:
    case MessageType::health:
      break;
    case MessageType::step:
      n = step_bytes(r, m, version);
      break;
    case MessageType::set_max_model_len:
      n += sizeof(SetMaxModelLenRequest);
      break;
    default:
      fail("cannot encode a request of {}", message_type_name(r.type));
  }
  if (n > UINT32_MAX) fail("{} request of {} bytes: over the protocol's 4 GiB", message_type_name(r.type), n);
  return static_cast<uint32_t>(n);
}

void encode_request(const Request& r, const ModelDescription& m, uint8_t* dst, uint32_t version) {
  const uint32_t bytes = encoded_size(r, m, version);
  wire::Writer w(dst);
  w.put(MessageHeader{bytes, static_cast<uint32_t>(r.type), r.id});
  switch (r.type) {
    case MessageType::attach:
      w.put(r.attach);
      break;
    case MessageType::step:
      encode_step(r, w, version);
      break;
    case MessageType::set_max_model_len:
      w.put(SetMaxModelLenRequest{r.max_model_len});
      break;
    default:
      break;
  }
}

StatusOr decode_request(std::span<const uint8_t> bytes, const ModelDescription& m, Request& out,
                        uint32_t version) {
  out = Request{};
  wire::Reader in(bytes);
  MessageHeader h{};
  if (!in.get(h)) return invalid("request of {} bytes: shorter than a message header", bytes.size());
  out.type = static_cast<MessageType>(h.type);
  out.id = h.id;
  const std::string name = message_type_name(out.type);
  if (h.bytes != bytes.size() || bytes.size() % kMessageAlign != 0)
    return invalid("{} request: its header says {} bytes, the message has {}", name, h.bytes, bytes.size());
  StatusOr st;
  switch (out.type) {
    case MessageType::attach:
      if (!in.get(out.attach)) st = invalid("attach request: too short for its payload");
      break;
    case MessageType::detach:
    case MessageType::stats:
    case MessageType::health:
      break;
    case MessageType::step:
      out.step.id = h.id;
      st = decode_step(in, m, out.step, version);
      break;
    case MessageType::set_max_model_len: {
      SetMaxModelLenRequest s{};
      if (!in.get(s)) {
        st = invalid("set_max_model_len request: too short for its payload");
      } else if (s.max_model_len < 1) {
        // A plan's max_model_len 0 means "unchanged": a request for 0 (or less) must not pass as a no-op.
        st = invalid("set_max_model_len request: max_model_len {} must be at least 1", s.max_model_len);
      }
      out.max_model_len = s.max_model_len;
      break;
    }
    case MessageType::padding:
      st = invalid("a padding message is not a request");
      break;
    default:
      st = invalid("request of {}", name);
  }
  if (st.ok() && in.left() != 0) st = invalid("{} request: {} bytes past its payload", name, in.left());
  if (!st.ok()) {
    out = Request{};
    out.type = static_cast<MessageType>(h.type);
    out.id = h.id;
  }
  return st;
}

}  // namespace dspark::host
