#include "connection.hpp"

#include <fmt/format.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <span>
#include <thread>
#include <utility>

#include "lib/core/error.hpp"
#include "lib/host/liveness.hpp"
#include "lib/host/socket_path.hpp"
#include "liveness.hpp"

namespace dspark::client {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kPoll(10);         // attach: retrying a worker that is not there or not serving yet
constexpr milliseconds kWaitSlice(50);    // between liveness checks while a call waits
constexpr milliseconds kReplyWait(5000);  // attach: the most one try waits for the worker's reply
constexpr int32_t kDetachWaitMs = 2000;   // detach: how long to wait for the worker to end the session

void sleep_within(const Deadline& d, milliseconds step) {
  std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(step, d.left()));
}

bool model_ok(const host::ModelDescription& m) {
  return m.vocab_size > 0 && m.hidden > 0 && m.taps > 0 &&
         uint64_t{m.row_bytes} == uint64_t{m.taps} * m.hidden * 2 && m.block_size > 0 && m.slots > 0 &&
         m.max_batch > 0 && m.max_context_rows > 0 && m.max_model_len > 0;
}

}  // namespace

Connection::Connection(host::DoorAnswer door, host::SessionAreas areas)
    : socket_(std::move(door.socket)),
      worker_pid_(door.worker.pid),
      areas_(std::move(areas)),
      writer_(areas_.requests()),
      reader_(areas_.responses()),
      model_(areas_.worker().model),
      max_model_len_(model_.max_model_len),
      next_id_(host::monotonic_ns()) {}  // ids differ across handles and sessions: stale answers never match

Connection::~Connection() = default;

Outcome Connection::attach(const std::string& name, uint32_t expected_uid, int32_t timeout_ms,
                           std::unique_ptr<Connection>& out) {
  out.reset();
  const Deadline d(timeout_ms);
  std::string path;
  try {
    path = host::socket_path(name);
  } catch (const std::exception& e) {
    return failed(DSPARK_INVALID_ARGUMENT, fmt::format("attach {}: {}", name, e.what()));
  }
  for (;;) {
    const auto wait =
        std::clamp(std::chrono::duration_cast<milliseconds>(d.left()), milliseconds(1), kReplyWait);
    host::DoorAnswer a = host::knock(path, expected_uid, host::PeerKind::host, wait);
    using Kind = host::DoorAnswer::Kind;
    if (a.kind == Kind::wrong_owner || a.kind == Kind::refused)
      return failed(DSPARK_UNAVAILABLE, fmt::format("attach {}: {}", name, a.why));
    if (a.kind == Kind::accepted) {
      std::optional<host::SessionAreas> areas;
      try {
        areas.emplace(host::SessionAreas::open(std::move(a.worker_area), std::move(a.host_area)));
      } catch (const std::exception& e) {
        return failed(DSPARK_UNAVAILABLE, fmt::format("attach {}: the worker (pid {}) at {}: {}", name,
                                                      a.worker.pid, path, e.what()));
      }
      std::unique_ptr<Connection> conn(new Connection(std::move(a), std::move(*areas)));
      Outcome o = conn->exchange_attach(d);
      if (!o.ok()) return failed(o.status, fmt::format("attach {}: {}", name, o.message));
      out = std::move(conn);
      return {};
    }
    if (d.expired())
      return failed(DSPARK_UNAVAILABLE,
                    fmt::format("attach {}: not serving after {} ms: {}", name, d.ms(), a.why));
    sleep_within(d, kPoll);
  }
}

Outcome Connection::exchange_attach(const Deadline& d) {
  heartbeat_ = std::make_unique<Heartbeat>(areas_.host().host_heartbeat_ns);
  host::Request r;
  r.type = host::MessageType::attach;
  r.attach = {host::kProtocolVersion, static_cast<int32_t>(getpid())};
  host::Response resp;
  Outcome o = call(r, d, resp);
  if (o.ok() && resp.attach.version != host::kProtocolVersion)
    o = failed(DSPARK_INVALID_ARGUMENT,
               fmt::format("the worker answers in protocol version {}; this client speaks {}",
                           resp.attach.version, host::kProtocolVersion));
  if (o.ok() && !model_ok(resp.attach.model))
    o = failed(DSPARK_INTERNAL, "the worker's attach answer describes an invalid model");
  if (!o.ok()) return o;  // the destructor closes the socket: the worker ends the session
  model_ = resp.attach.model;
  taps_ = resp.taps;
  sampling_ = resp.sampling;
  max_model_len_ = model_.max_model_len;
  return {};
}

void Connection::detach(int32_t timeout_ms) {
  if (!problem()) {
    const Deadline d(std::min(std::max(timeout_ms, 0), kDetachWaitMs));
    host::Request r;
    r.type = host::MessageType::detach;
    // The worker resets this host's slots, then closes the socket: waiting for that lets this process attach
    // again at once.
    if (send(r, d).ok()) {
      pollfd p{socket_.get(), POLLIN | POLLRDHUP, 0};
      const auto ms = std::chrono::duration_cast<milliseconds>(d.left()).count();
      (void)poll(&p, 1, static_cast<int>(ms));
    }
  }
  heartbeat_.reset();
  socket_.reset();
}

uint64_t Connection::max_request_bytes() const {
  return host::max_message_bytes(areas_.requests().capacity);
}

std::optional<std::string> Connection::problem() const {
  if (!broken_.empty()) return broken_;
  if (!socket_) return std::string("this host has detached");
  return worker_problem(areas_.worker(), socket_.get(), worker_pid_);
}

Outcome Connection::call(host::Request& r, const Deadline& d, host::Response& resp) {
  resp = host::Response{};
  Outcome o = send(r, d);
  if (!o.ok()) return o;
  // A step's answer is expected about as long after its request as the last two steps' nearer one took: the
  // wait spins around then instead of waking from the futex (ring.hpp, RecentWaits).
  const bool step = r.type == host::MessageType::step;
  const auto sent = std::chrono::steady_clock::now();
  const host::SpinWindow window = step ? step_answers_.window(sent) : host::SpinWindow{};
  o = receive(r.id, r.type, d, resp, window);
  if (step && o.ok()) step_answers_.record(std::chrono::steady_clock::now() - sent);
  return o;
}

Outcome Connection::send(host::Request& r, const Deadline& d) {
  if (auto p = problem()) return failed(DSPARK_UNAVAILABLE, *p);
  r.id = next_id_++;
  const uint32_t bytes = host::encoded_size(r, model_);
  if (bytes > max_request_bytes())
    return failed(DSPARK_RESOURCE_EXHAUSTED,
                  fmt::format("a message of {} bytes is over the request ring's limit "
                              "of {} bytes",
                              bytes, max_request_bytes()));
  uint8_t* dst = nullptr;
  while ((dst = writer_.reserve(bytes, std::min<std::chrono::nanoseconds>(d.left(), kWaitSlice))) ==
         nullptr) {
    if (auto p = problem()) return failed(DSPARK_UNAVAILABLE, *p);
    if (d.expired())
      return failed(DSPARK_UNAVAILABLE,
                    fmt::format("the request ring stayed full for {} ms: the worker is not "
                                "taking requests",
                                d.ms()));
  }
  host::encode_request(r, model_, dst);
  writer_.publish();
  return {};
}

Outcome Connection::receive(uint64_t id, host::MessageType type, const Deadline& d, host::Response& out,
                            const host::SpinWindow& window) {
  for (;;) {
    bool corrupt = false;
    const host::MessageHeader* m = reader_.peek(corrupt);
    if (corrupt) {
      broken_ = "the response ring is corrupt; detach and attach again";
      return failed(DSPARK_UNAVAILABLE, broken_);
    }
    if (m != nullptr) {
      // Copy out first: decoding reads a private copy, and the ring space goes back to the worker at once.
      rx_.resize(reader_.peeked_bytes());  // the length peek() checked, not a second read of shared memory
      std::memcpy(rx_.data(), m, rx_.size());
      reader_.consume();
      host::MessageHeader mh;
      std::memcpy(&mh, rx_.data(), sizeof(mh));
      if (mh.id != id) {
        ++skipped_;  // the answer of an earlier request that timed out
        continue;
      }
      host::Response resp;
      const StatusOr s = host::decode_response(rx_, resp);
      if (!s.ok()) return failed(DSPARK_INTERNAL, "malformed answer from the worker: " + s.message);
      if (resp.type != type)
        return failed(DSPARK_INTERNAL,
                      fmt::format("the worker answered a {} request with a {} answer",
                                  host::message_type_name(type), host::message_type_name(resp.type)));
      out = std::move(resp);
      if (!out.status.ok()) return failed(to_c_status(out.status.status), out.status.message);
      return {};
    }
    if (auto p = problem()) return failed(DSPARK_UNAVAILABLE, *p);
    if (d.expired())
      return failed(
          DSPARK_UNAVAILABLE,
          fmt::format("no answer from the worker within {} ms{}", d.ms(),
                      skipped_ ? fmt::format(" ({} stale answers skipped)", skipped_) : std::string()));
    reader_.wait(std::min<std::chrono::nanoseconds>(d.left(), kWaitSlice), window);
  }
}

}  // namespace dspark::client
