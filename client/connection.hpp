// Internal: one attached host session with a worker (the procedure of host/protocol.hpp's top comment):
// attach, one request and its answer at a time, detach.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "heartbeat.hpp"
#include "lib/host/codec.hpp"
#include "lib/host/door_client.hpp"
#include "lib/host/session_areas.hpp"
#include "outcome.hpp"

namespace dspark::client {

class Connection {
 public:
  // Connects to the socket of ring name `name` (retrying until the deadline while nothing listens there or
  // the worker is not serving yet), refuses a worker that does not run as `expected_uid`, maps the session's
  // memfds, starts the heartbeat and exchanges the attach messages. On failure nothing stays attached.
  static Outcome attach(const std::string& name, uint32_t expected_uid, int32_t timeout_ms,
                        std::unique_ptr<Connection>& out);

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  ~Connection();  // stops the heartbeat, closes the socket (the worker then ends the session) and unmaps

  // Sends a detach message and waits (bounded) until the worker has ended the session.
  void detach(int32_t timeout_ms);

  // Sends `r` (its id is assigned here) and waits for its answer until the deadline, checking the worker's
  // liveness between short waits. The answer's status is the outcome's; `resp` holds the decoded answer.
  Outcome call(host::Request& r, const Deadline& d, host::Response& resp);

  const host::ModelDescription& model() const { return model_; }
  const host::ModelTaps& taps() const { return taps_; }               // from the attach answer
  const host::SamplingLimits& sampling() const { return sampling_; }  // from the attach answer
  int64_t max_model_len() const { return max_model_len_; }
  void set_max_model_len(int64_t v) { max_model_len_ = v; }
  // The largest request message the request ring takes.
  uint64_t max_request_bytes() const;

 private:
  Connection(host::DoorAnswer door, host::SessionAreas areas);
  Outcome send(host::Request& r, const Deadline& d);
  Outcome receive(uint64_t id, host::MessageType type, const Deadline& d, host::Response& out,
                  const host::SpinWindow& window = {});
  // The worker gone, stopped or hung, this session ended by the worker, or the ring found corrupt.
  std::optional<std::string> problem() const;
  Outcome exchange_attach(const Deadline& d);

  host::UniqueFd socket_;
  int32_t worker_pid_ = 0;
  host::SessionAreas areas_;
  host::RingWriter writer_;
  host::RingReader reader_;
  host::ModelDescription model_;
  host::ModelTaps taps_{};
  host::SamplingLimits sampling_{};
  int64_t max_model_len_ = 0;
  uint64_t next_id_ = 0;
  uint64_t skipped_ = 0;  // answers of earlier (timed-out) requests dropped while waiting
  std::string broken_;    // set when the response ring is corrupt: every later call fails with it
  std::vector<uint8_t> rx_;
  std::unique_ptr<Heartbeat> heartbeat_;
  host::RecentWaits step_answers_;  // the last two steps' request-to-answer times
};

}  // namespace dspark::client
