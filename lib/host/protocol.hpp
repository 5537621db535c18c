// The shared-memory host interface (SPEC §7): the layout of the segment rank 0 creates and the messages that
// cross it. Host and worker are separate processes of the same machine, built from this one header.
//
// Segment: [SegmentHeader][request ring bytes][response ring bytes]. Each ring is single-producer
// single-consumer: the host alone writes requests, the worker alone writes responses. A message is a
// MessageHeader followed by its payload, padded to 8 bytes; a message never wraps: when it does not fit
// before the ring's end, the producer writes a MessageHeader of type kPadding covering the rest and continues
// at offset 0.
//
// Attach: the host opens the segment, waits for worker_state == serving, claims host_pid by CAS 0 -> its pid
// (a live holder means "another host is attached"; a dead one is cleared by the worker within its host
// timeout), starts refreshing host_heartbeat_ns, then sends an attach message; the answer carries the model
// description. Detach: the host sends a detach message (no answer) and stops its heartbeat. On a detach, or a
// host found dead (pid gone or heartbeat older than health.host_timeout_ms), the worker resets the host's
// slots, empties both rings and only then stores host_pid = 0, so the next host starts on clean rings. Worker
// liveness: a host waiting for an answer checks worker_pid and worker_heartbeat_ns (refreshed by a thread of
// rank 0 whatever the steps do) and returns UNAVAILABLE when the worker is gone or stopped.
#pragma once

#include <atomic>
#include <cstdint>

namespace dspark::host {

constexpr uint64_t kMagic = 0x314b52415053445aull;  // "ZDSPARK1"
constexpr uint32_t kProtocolVersion = 2;
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

// Control words of one ring; head and tail on their own cache lines.
struct alignas(64) RingControl {
  std::atomic<uint64_t> head;  // bytes ever written (producer)
  char pad0[56];
  std::atomic<uint64_t> tail;  // bytes ever consumed (consumer)
  char pad1[56];
  std::atomic<uint32_t> seq;      // futex word: bumped by the producer after each publish
  std::atomic<uint32_t> waiting;  // the consumer sleeps on seq: the producer wakes it only then
  char pad2[56];
};

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t header_bytes;                   // sizeof(SegmentHeader)
  uint64_t request_offset, request_bytes;  // ring data: offset from the segment start, capacity (power of 2)
  uint64_t response_offset, response_bytes;
  ModelDescription model;
  // Liveness. Heartbeats are CLOCK_MONOTONIC nanoseconds (one machine), refreshed by a thread on each side.
  std::atomic<uint32_t> worker_state;  // WorkerState
  std::atomic<int32_t> worker_pid;
  std::atomic<uint64_t> worker_heartbeat_ns;
  std::atomic<int32_t> host_pid;  // 0: no host. A host claims the segment by CAS 0 -> its pid.
  std::atomic<uint64_t> host_heartbeat_ns;
  std::atomic<uint64_t> host_session;  // bumped by the worker each time it accepts an attach
  RingControl request_ctl;
  RingControl response_ctl;
};

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
  int32_t token;    // anchor token
  int32_t pos;      // anchor position P
  int32_t low;      // -1: default window low max(0, P - W)
  int32_t outputs;  // k' (1..k; 0 = k)
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

// Followed by int32 ids[n*k], float conf[n*k], float conf_logit[n*k], float margin[n*k].
struct DraftResponse {
  uint32_t n;
  uint32_t k;
};

struct StatsResponse {
  uint64_t steps, failed_steps, rejected_messages;
  uint64_t drafts, context_rows, resets;
  uint64_t hosts_attached, hosts_lost;
  double step_us_p50, step_us_p99, step_us_max;  // over the recent steps
};

struct HealthResponse {
  uint32_t state;  // WorkerState
  uint32_t tp;
  uint64_t steps;
  uint32_t failed_in_a_row;
  uint32_t pad;
};

}  // namespace dspark::host
