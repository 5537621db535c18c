// The host interface (SPEC §7): how a host reaches rank 0, the layout of the shared memory of one attach,
// and the messages that cross it. Host and worker are separate processes of the same machine, built from this
// one header.
//
// Attach: the worker listens on a Unix socket (SOCK_SEQPACKET; its path: socket_path.hpp). A host connects,
// checks the worker's credentials (SO_PEERCRED: the uid it expects) and sends a SocketHello; the worker
// checks the host's (its own uid, or a member of ring.group) and answers a SocketReply. A host accepted while
// no other host is attached receives, with the reply (SCM_RIGHTS), two fresh sealed memfds:
//   the worker area: [WorkerHeader][response ring data], written by the worker alone: sealed against
//     shrinking, growing and any new writable mapping (F_SEAL_FUTURE_WRITE), so the host maps it read-only;
//   the host area: [HostHeader][request ring data], written by the host: sealed against shrinking and
//   growing.
// Each ring's control words are split in two halves (RingProducerControl, RingConsumerControl), each in the
// memory of the side that writes it. Nothing the host writes is trusted: ring counters and message headers
// are checked before use, the host heartbeat against the worker's clock. The host then sends an attach
// message on the request ring; the answer carries the model description. Detach: a detach message; the worker
// resets the host's slots and closes the socket. A host is lost when its socket closes or sends anything,
// when its heartbeat is older than health.host_timeout_ms or more than kHeartbeatFutureSlackNs ahead of the
// worker's clock, when a message header is corrupt, or when it stops reading answers: its slots are reset and
// the next host gets new memfds, so a former host keeps nothing that reaches its successor's rings. Worker
// liveness, for the host: the socket (closed when rank 0 exits), worker_state and worker_heartbeat_ns
// (refreshed by a thread of rank 0 whatever the steps do). An observer connects the same way, asks for an
// Observation and gets it in the reply: no memory, no slot.
//
// Protocol versions: kProtocolVersion names the layout of everything in this header but the frozen parts
// below, and changes with any of it (a field, a message, a struct's size). The worker serves the versions in
// [kMinProtocolVersion, kProtocolVersion] (those whose layouts it still speaks) and refuses any other with a
// reason naming the client's version and the served ones (version_refusal, protocol_version.hpp); an admitted
// peer's replies, areas and messages carry the version it asked for. Frozen across every version, so that
// peers of different versions can still say so: SocketHello, and SocketReplyHead, which a version refusal
// sends alone.
//
// Version 4 adds DraftWire::accepted (a request's report of its slot's previous draft); a version 3 peer's
// drafts are DraftWireV3 and report nothing. Version 5 adds ModelTaps after the attach answer's
// AttachResponse (the tapped target layers and the noise token); versions 3 and 4 answer without it. Version
// 6 adds StatsMore after the stats answer's StatsResponse and after an observer's Observation (acceptance and
// the Markov bias cache); versions 3 to 5 answer without it. Version 7 adds sampled drafts (SPEC §4): a draft
// request's temperature, seed and distribution flag (DraftWire; versions 4 to 6 send DraftWireV4, always
// greedy), q(tok) and the asked whole distributions in the step answer (DraftResponse), and SamplingLimits
// after the attach answer's ModelTaps. Everything else is the same in all five.
//
// Ring framing: a message is a MessageHeader followed by its payload, padded to 8 bytes; a message never
// wraps: when it does not fit before the ring's end, the producer writes a MessageHeader of type kPadding
// covering the rest and continues at offset 0.
#pragma once

#include <atomic>
#include <cstdint>

namespace dspark::host {

constexpr uint64_t kMagic = 0x324b52415053445aull;        // "ZDSPARK2": the worker area
constexpr uint64_t kSocketMagic = 0x4b434f5353505344ull;  // "DSPSSOCK": socket messages
constexpr uint32_t kProtocolVersion = 7;                  // the version this build speaks
constexpr uint32_t kMinProtocolVersion = 3;               // the oldest version it still serves
static_assert(kMinProtocolVersion <= kProtocolVersion);
constexpr uint32_t kMessageAlign = 8;

enum class WorkerState : uint32_t { starting = 0, serving = 1, draining = 2, unhealthy = 3, stopped = 4 };

// Weight representations as the model description names them: ModelDescription::head_format holds one,
// weight_formats a bit (1 << code) per representation present.
constexpr uint32_t kFormatDense = 0;
constexpr uint32_t kFormatFp8Block = 1;
constexpr uint32_t kFormatFp4 = 2;
constexpr uint32_t kFormatExl3 = 3;

// What attach returns and the header carries: everything a host needs to size its messages, and the weight
// formats the worker loaded (SPEC §7).
struct ModelDescription {
  uint32_t vocab_size;
  uint32_t hidden;      // H
  uint32_t taps;        // context row = taps * H bf16 values
  uint32_t row_bytes;   // taps * H * 2
  uint32_t block_size;  // k
  uint32_t window;      // W
  uint32_t slots;
  uint32_t max_batch;
  uint32_t max_context_rows;  // per step message
  uint32_t tp;
  int64_t max_model_len;    // the configured limit (set_max_model_len may lower it)
  uint32_t weight_formats;  // bit (1 << kFormat*) of every representation of the loaded linear
                            // weights, the head included; 0 while the worker is starting
  uint32_t head_format;     // the head as loaded: kFormatDense as stored, kFormatFp8Block when re-quantised
                            // at load (weights.head: fp8)
};

// What a host needs besides ModelDescription to build context rows and read drafts (SPEC §2, §7): the
// target layers whose streams form a row's taps, in row order, and the token that fills block positions
// 1..k-1. Follows AttachResponse in the attach answer from protocol version 5 on.
constexpr uint32_t kMaxTappedLayers = 16;  // dspark_target_layer_ids holds at most 16 (model_config.cpp)
struct ModelTaps {
  int32_t noise_token;
  uint32_t layers;                      // ModelDescription::taps
  int32_t layer_ids[kMaxTappedLayers];  // the first `layers` in row order, the rest 0
};

// A ring's control words, in two halves: each written by one side only and placed in that side's memory.
// The consumer sleeps on the producer's seq, the producer (waiting for space) on the consumer's.
struct alignas(64) RingProducerControl {
  std::atomic<uint64_t> head;  // bytes ever published
  char pad0[56];
  std::atomic<uint32_t> seq;      // futex word: bumped after each publish
  std::atomic<uint32_t> waiting;  // 1: the producer sleeps on the consumer's seq, waiting for space
  char pad1[56];
};

struct alignas(64) RingConsumerControl {
  std::atomic<uint64_t> tail;  // bytes ever consumed
  char pad0[56];
  std::atomic<uint32_t> seq;      // futex word: bumped after a release while the producer waits
  std::atomic<uint32_t> waiting;  // 1: the consumer sleeps on the producer's seq, waiting for a message
  char pad1[56];
};

// The worker area's header; the response ring's data follows at area_data_offset(). Written by the worker
// only (the host's mapping is read-only).
struct alignas(64) WorkerHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;   // sizeof(WorkerHeader)
  uint64_t request_bytes;  // ring capacities (powers of 2); the request ring's data is in the host area
  uint64_t response_bytes;
  ModelDescription model;
  uint64_t session;  // which attach of this worker the areas belong to (1, 2, ...)
  // Liveness. Heartbeats are CLOCK_MONOTONIC nanoseconds (one machine), refreshed by a thread on each side.
  std::atomic<uint32_t> worker_state;  // WorkerState
  std::atomic<int32_t> worker_pid;
  std::atomic<uint64_t> worker_heartbeat_ns;
  RingProducerControl response;  // the worker produces answers
  RingConsumerControl request;   // and consumes requests
};

// The host area's header; the request ring's data follows at area_data_offset(). Written by the host; the
// worker only reads it and checks what it reads.
struct alignas(64) HostHeader {
  RingProducerControl request;   // the host produces requests
  RingConsumerControl response;  // and consumes answers
  std::atomic<uint64_t> host_heartbeat_ns;
};

// Where a ring's data starts in its area.
template <typename Header>
constexpr uint64_t area_data_offset() {
  return (sizeof(Header) + 63) / 64 * 64;
}

// A heartbeat more than this far ahead of the reader's clock is forged or broken: stale, never fresh.
constexpr uint64_t kHeartbeatFutureSlackNs = 1'000'000'000;

enum class MessageType : uint32_t {
  padding = 0,  // fills the ring's tail; skip to offset 0
  attach = 1,
  detach = 2,
  step =
      3,  // resets + context rows + one draft batch (each part optional): reset, context and draft are steps
  set_max_model_len = 4,
  stats = 5,
  health = 6,
};

struct MessageHeader {
  uint32_t bytes;  // the whole message with this header, a multiple of 8
  uint32_t type;   // MessageType
  uint64_t id;     // chosen by the host, echoed by the answer
};

// ---- request payloads (after the MessageHeader)

struct AttachRequest {
  uint32_t version;  // kProtocolVersion
  int32_t pid;
};

// Followed by: int32 resets[n_resets]; ContextWire contexts[n_contexts]; DraftWire drafts[n_drafts];
// (padding to 8) then the bulk rows: for each context in order, rows * row_bytes bytes of bf16.
struct StepRequest {
  uint32_t n_resets;
  uint32_t n_contexts;
  uint32_t n_drafts;
  uint32_t flags;  // kStepMargins
};
constexpr uint32_t kStepMargins = 1;

struct ContextWire {
  int32_t slot;
  int32_t first_pos;
  int32_t rows;
};

struct DraftWire {
  int32_t slot;
  int32_t token;      // anchor token
  int32_t pos;        // anchor position P
  int32_t low;        // -1: default window low max(0, P - W)
  int32_t outputs;    // k' (1..k; 0 = k)
  int32_t accepted;   // tokens of the slot's previous draft the target accepted (0..k); -1: not reported
  float temperature;  // 0: greedy; (0, 100]: sampled (SPEC §4)
  uint32_t flags;     // kDraftDistribution
  uint64_t seed;      // the Gumbel noise's seed
};
constexpr uint32_t kDraftDistribution = 1;  // the answer carries this request's whole draft distribution

// A draft request of protocol versions 4 to 6 (greedy only).
struct DraftWireV4 {
  int32_t slot, token, pos, low, outputs, accepted;
};

// A draft request of protocol version 3 (no report).
struct DraftWireV3 {
  int32_t slot, token, pos, low, outputs;
};

struct SetMaxModelLenRequest {
  int64_t max_model_len;
};

// ---- response payloads (after the MessageHeader, which echoes type and id)

// Every answer starts with this; `message_bytes` of UTF-8 text (padded to 8) follow, then the typed payload.
struct ResponseStatus {
  uint32_t status;  // dspark::Status
  uint32_t message_bytes;
};

struct AttachResponse {
  uint32_t version;
  uint32_t pad;
  uint64_t session;
  ModelDescription model;
};

// Followed by int32 ids[n*k], float conf[n*k], float conf_logit[n*k], float margin[n*k]; from version 7 on
// float q[n*k] (the drafted token's probability: 1 greedy, 0 past k'; padded to 8 bytes) and then
// DistributionHead.
struct DraftResponse {
  uint32_t n;
  uint32_t k;
};

// Version 7 on, after a step answer's q: the whole draft distributions its requests asked for, `rows` of
// `vocab` floats in request then position order, after int32 row_index[rows] (request * k + position; padded
// to 8 bytes).
struct DistributionHead {
  uint32_t rows;
  uint32_t vocab;  // V when rows > 0, else 0
};

// Version 7 on, after the attach answer's ModelTaps: what a sampled draft may ask for.
struct SamplingLimits {
  uint32_t max_distributions;  // requests per step that may ask for their whole distribution
  float max_temperature;
};

struct StatsResponse {
  uint64_t steps, failed_steps, rejected_messages;
  uint64_t drafts, context_rows, resets;
  uint64_t hosts_attached, hosts_lost;
  double step_us_p50, step_us_p99, step_us_max;  // over the recent steps
  uint64_t hosts_refused;  // connections refused: another uid, a second host, a bad hello
};

// What the stats answer adds from protocol version 6 on: the host's acceptance reports (AcceptanceBook's
// counted ones) and the Markov bias cache's look-ups, hits and hottest uncached previous tokens (SPEC §4),
// since the worker started.
constexpr uint32_t kHotUncachedTokens = 8;
struct StatsMore {
  uint64_t acceptance_reports, accepted_tokens;  // accepted / reports: the mean accepted length
  uint64_t markov_lookups, markov_hits;          // hits / lookups: the cache's hit rate
  uint32_t hot_uncached;                         // entries in use below (most seen first); the rest zero
  uint32_t pad;
  int32_t hot_tokens[kHotUncachedTokens];
  uint64_t hot_seen[kHotUncachedTokens];  // how often each was a previous token
};

struct HealthResponse {
  uint32_t state;  // WorkerState
  uint32_t tp;
  uint64_t steps;
  uint32_t failed_in_a_row;
  uint32_t pad;
};

// ---- the socket's messages (one SOCK_SEQPACKET message each)

enum class PeerKind : uint32_t { host = 1, observer = 2 };

// Frozen: the same bytes in every protocol version.
struct SocketHello {
  uint64_t magic;    // kSocketMagic
  uint32_t version;  // the version the peer speaks
  uint32_t kind;     // PeerKind
};

enum class Admission : uint32_t {
  accepted = 0,   // a host: the two memfds come with the reply; an observer: `observation` holds the answer
  refused = 1,    // `reason` says why; trying again will not help
  not_ready = 2,  // the worker is not serving yet (`reason`: its state): try again
};

constexpr size_t kReasonBytes = 256;

// What an observer gets: the worker's state and counters, read without taking the host's place.
struct Observation {
  uint32_t state;  // WorkerState
  uint32_t failed_in_a_row;
  int32_t worker_pid;
  int32_t host_pid;  // the attached host (SO_PEERCRED), 0 when none
  ModelDescription model;
  StatsResponse stats;
};

// Frozen: the start of every reply in every protocol version, and the whole of a version refusal.
struct SocketReplyHead {
  uint64_t magic;    // kSocketMagic
  uint32_t version;  // the version the worker answers in (the one asked for when it is served)
  uint32_t admission;
  char reason[kReasonBytes];  // NUL-terminated
};
static_assert(sizeof(SocketHello) == 16 && sizeof(SocketReplyHead) == 272);

struct SocketReply {
  SocketReplyHead head;
  Observation observation;
  StatsMore observation_more;  // version 6 on: a peer of an older version gets the reply without it
};
// The bytes of a reply in `version`'s layout.
constexpr size_t socket_reply_bytes(uint32_t version) {
  return version >= 6 ? sizeof(SocketReply) : sizeof(SocketReply) - sizeof(StatsMore);
}
static_assert(sizeof(SocketReply) == sizeof(SocketReplyHead) + sizeof(Observation) + sizeof(StatsMore));

}  // namespace dspark::host
