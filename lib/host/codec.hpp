// Encoding and checked decoding of the messages of protocol.hpp. Decoders read only from a private copy of
// the message (the other process may still write the shared bytes) and check every count and length against
// the message's size before use: a malformed message decodes to INVALID_ARGUMENT with a reason, never to a
// crash.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "lib/api/status.hpp"
#include "lib/api/step_plan.hpp"
#include "lib/host/protocol.hpp"

namespace dspark::host {

// Limits of the codec: the counts of a step message, and the text of an answer (cut at encode when longer).
constexpr uint32_t kMaxStepCount = 1u << 16;  // resets, contexts, drafts
constexpr uint32_t kMaxStatusMessageBytes = 4096;

// The largest step message and draft answer of a model (what the rings are sized for): the answer with
// max_distributions requests' whole distributions.
uint64_t max_step_bytes(const ModelDescription& m);
uint64_t max_draft_answer_bytes(const ModelDescription& m, uint32_t max_distributions);

std::string message_type_name(MessageType t);

// ---- requests (host encodes, worker decodes)

struct Request {
  MessageType type = MessageType::health;
  uint64_t id = 0;
  AttachRequest attach{};
  StepPlan step;              // type step: resets, contexts (+ rows), drafts, margin
  int64_t max_model_len = 0;  // type set_max_model_len
  // Type step, encode only: when not empty, the context rows are these byte ranges in order (the caller's
  // buffers, written into the message without a copy into step.rows) and step.rows must be empty.
  std::vector<std::span<const uint8_t>> row_parts;
};

// The bytes of one draft request in a step message of protocol `version` (served versions only).
constexpr uint64_t draft_wire_bytes(uint32_t version) {
  return version >= 7 ? sizeof(DraftWire) : version >= 4 ? sizeof(DraftWireV4) : sizeof(DraftWireV3);
}

// Bytes of the encoded message (a multiple of 8), in the layout of protocol `version` (a served one).
uint32_t encoded_size(const Request& r, const ModelDescription& m, uint32_t version = kProtocolVersion);
// Writes the message into dst (encoded_size bytes).
void encode_request(const Request& r, const ModelDescription& m, uint8_t* dst,
                    uint32_t version = kProtocolVersion);
// `bytes` is the whole message: a private copy, or the ring's shared bytes themselves. The decoder reads
// every byte once, in order, into private memory (the rows straight into out.step.rows) and trusts only what
// it has read, so a host writing the shared bytes meanwhile can make the message invalid but never make the
// decoder read past it or see two values of one field. Structural checks only (sizes, counts, row bytes
// against m.row_bytes, unknown type), and a set_max_model_len below 1 (which a plan could not tell from "no
// change"); value ranges are check_plan's job. Padding bytes must be zero and flags
// known: a message decodes only when encoding the result gives back the same bytes. On error `out` is default
// but for the header's type and id, when the header was readable, so that the answer can echo them.
StatusOr decode_request(std::span<const uint8_t> bytes, const ModelDescription& m, Request& out,
                        uint32_t version = kProtocolVersion);

// ---- responses (worker encodes, host decodes)
//
// The typed payload follows only an OK status: attach -> AttachResponse (and ModelTaps from version 5 on,
// SamplingLimits from 7 on); step -> DraftResponse and its arrays (n = 0 for a step without drafts; from
// version 7 on q and the DistributionHead with its rows); stats -> StatsResponse (and
// StatsMore from version 6 on); health ->
// HealthResponse (a starting or draining worker answers health with OK and its state); detach and
// set_max_model_len -> none. An error answer carries its status and text only, and may echo any type but
// padding (the request's type may be unknown).

struct Response {
  MessageType type = MessageType::health;
  uint64_t id = 0;
  StatusOr status;
  AttachResponse attach{};
  ModelTaps taps{};           // attach, version 5 on
  SamplingLimits sampling{};  // attach, version 7 on
  // type step: n = draft.batch, k = draft.k; an empty margin or q encodes as zeros; q and the distributions
  // from version 7 on
  DraftResult draft;
  StatsResponse stats{};
  StatsMore stats_more{};  // stats, version 6 on
  HealthResponse health{};
};

// In the layout of `version` (a served one: the peer's).
uint32_t encoded_size(const Response& r, uint32_t version = kProtocolVersion);
void encode_response(const Response& r, uint8_t* dst, uint32_t version = kProtocolVersion);
// As decode_request: checked, exact, `out` default but for type and id on error.
StatusOr decode_response(std::span<const uint8_t> bytes, Response& out, uint32_t version = kProtocolVersion);

}  // namespace dspark::host
