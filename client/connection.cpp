#include "connection.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <span>
#include <thread>
#include <utility>

#include "liveness.hpp"

namespace dspark::client {
namespace {

using std::chrono::milliseconds;
constexpr milliseconds kPoll(10);        // attach: segment, state and host-slot polling
constexpr milliseconds kWaitSlice(50);   // between liveness checks while a call waits
constexpr int32_t kDetachWaitMs = 2000;  // detach: how long to wait for the worker to release the slot

void sleep_within(const Deadline& d, milliseconds step) {
  std::this_thread::sleep_for(std::min<std::chrono::nanoseconds>(step, d.left()));
}

// A segment whose worker serves, or the reason to keep waiting.
std::optional<std::string> not_serving(const host::SegmentHeader& h) {
  if (auto p = worker_problem(h)) return p;
  const uint32_t state = h.worker_state.load(std::memory_order_acquire);
  if (state != static_cast<uint32_t>(host::WorkerState::serving))
    return fmt::format("the worker is {}", worker_state_name(state));
  return std::nullopt;
}

enum class Claim { claimed, refused, worker_lost };

// Claims host_pid by CAS 0 -> pid. The heartbeat is stamped first so that the worker never sees this host
// claimed with the previous host's stale heartbeat. A live holder with a fresh heartbeat is another attached
// host (refused at once); a dead or silent one is cleared by the worker within its host timeout (waited for).
Claim claim_host(host::SegmentHeader& h, int32_t pid, const Deadline& d, std::string& why) {
  for (;;) {
    if (auto p = worker_problem(h)) {
      why = *p;
      return Claim::worker_lost;
    }
    int32_t holder = h.host_pid.load(std::memory_order_acquire);
    if (holder == 0) {
      h.host_heartbeat_ns.store(host::monotonic_ns(), std::memory_order_release);
      if (h.host_pid.compare_exchange_strong(holder, pid, std::memory_order_acq_rel)) return Claim::claimed;
    }
    if (holder != 0) {
      const uint64_t age = heartbeat_age_ns(h.host_heartbeat_ns.load(std::memory_order_acquire));
      const bool alive = host::process_alive(holder);
      if (alive && age < kWorkerStaleNs) {
        why = holder == pid ? fmt::format("this process (pid {}) is already attached", pid)
                            : fmt::format("another host (pid {}) is attached", holder);
        return Claim::refused;
      }
      why = fmt::format(
          "the previous host (pid {}, {}) still holds the segment; the worker releases it within its "
          "host timeout",
          holder, alive ? "not responding" : "gone");
    }
    if (d.expired()) return Claim::refused;
    sleep_within(d, kPoll);
  }
}

bool model_ok(const host::ModelDescription& m) {
  return m.vocab_size > 0 && m.hidden > 0 && m.taps > 0 &&
         uint64_t{m.row_bytes} == uint64_t{m.taps} * m.hidden * 2 && m.block_size > 0 && m.slots > 0 &&
         m.max_batch > 0 && m.max_context_rows > 0 && m.max_model_len > 0;
}

}  // namespace

Connection::Connection(host::Segment seg, int32_t pid)
    : seg_(std::move(seg)),
      writer_(seg_.requests()),
      reader_(seg_.responses()),
      model_(seg_.header().model),
      max_model_len_(model_.max_model_len),
      pid_(pid),
      next_id_(host::monotonic_ns()) {}  // ids differ across handles and sessions: stale answers never match

Connection::~Connection() = default;

Outcome Connection::attach(const std::string& name, int32_t timeout_ms, std::unique_ptr<Connection>& out) {
  out.reset();
  const Deadline d(timeout_ms);
  const auto pid = static_cast<int32_t>(getpid());
  std::string why = "not tried";
  for (;;) {
    std::optional<host::Segment> seg;
    try {
      seg.emplace(host::Segment::open(name));
    } catch (const std::exception& e) {
      why = e.what();
    }
    // A dead or stopped worker's segment is stale: its restarted worker creates the name anew, so reopen.
    while (seg) {
      auto p = not_serving(seg->header());
      if (!p) break;
      why = *p;
      if (worker_problem(seg->header()) || d.expired()) seg.reset();
      if (seg) sleep_within(d, kPoll);
    }
    if (seg) {
      const Claim c = claim_host(seg->header(), pid, d, why);
      if (c == Claim::refused) return failed(DSPARK_UNAVAILABLE, fmt::format("attach {}: {}", name, why));
      if (c == Claim::claimed) {
        std::unique_ptr<Connection> conn(new Connection(std::move(*seg), pid));
        Outcome o = conn->exchange_attach(d);
        if (!o.ok()) return failed(o.status, fmt::format("attach {}: {}", name, o.message));
        out = std::move(conn);
        return {};
      }
    }
    if (d.expired())
      return failed(DSPARK_UNAVAILABLE,
                    fmt::format("attach {}: not serving after {} ms: {}", name, d.ms(), why));
    sleep_within(d, kPoll);
  }
}

Outcome Connection::exchange_attach(const Deadline& d) {
  host::SegmentHeader& h = seg_.header();
  h.host_heartbeat_ns.store(host::monotonic_ns(), std::memory_order_release);
  heartbeat_ = std::make_unique<Heartbeat>(h, pid_);
  host::Request r;
  r.type = host::MessageType::attach;
  r.attach = {host::kProtocolVersion, pid_};
  host::Response resp;
  Outcome o = call(r, d, resp);
  const bool answered = resp.id == r.id && resp.type == host::MessageType::attach;
  if (o.ok() && resp.attach.version != host::kProtocolVersion)
    o = failed(DSPARK_INVALID_ARGUMENT, fmt::format("the worker speaks protocol version {}, this client {}",
                                                    resp.attach.version, host::kProtocolVersion));
  if (o.ok() && !model_ok(resp.attach.model))
    o = failed(DSPARK_INTERNAL, "the worker's attach answer describes an invalid model");
  if (!o.ok()) {
    if (answered || worker_problem(h)) {
      // Both rings are empty (or the worker is gone): the slot can be given back directly.
      release_claim();
    } else {
      // The attach may still sit in the ring: a detach lets the worker empty both rings before it frees the
      // slot.
      host::Request bye;
      bye.type = host::MessageType::detach;
      (void)send(bye, Deadline(100));
    }
    heartbeat_.reset();
    return o;
  }
  model_ = resp.attach.model;
  max_model_len_ = model_.max_model_len;
  session_ = resp.attach.session;
  // The worker bumps host_session when it accepts an attach; once it shows ours, a change means this host was
  // replaced. (Waited for briefly in case the worker stores it after answering.)
  const Deadline settle(200);
  while (h.host_session.load(std::memory_order_acquire) != session_ && !settle.expired())
    std::this_thread::sleep_for(milliseconds(1));
  check_session_ = h.host_session.load(std::memory_order_acquire) == session_;
  return {};
}

void Connection::release_claim() {
  int32_t expected = pid_;
  seg_.header().host_pid.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
}

void Connection::detach(int32_t timeout_ms) {
  host::SegmentHeader& h = seg_.header();
  if (worker_problem(h)) {
    release_claim();  // no worker to do it; a restarted worker creates a fresh segment anyway
  } else if (!problem()) {
    const Deadline d(std::min(std::max(timeout_ms, 0), kDetachWaitMs));
    host::Request r;
    r.type = host::MessageType::detach;
    // The worker empties both rings, then frees the slot: waiting for that lets this process attach again at
    // once.
    if (send(r, d).ok())
      while (h.host_pid.load(std::memory_order_acquire) == pid_ && !d.expired() && !worker_problem(h))
        std::this_thread::sleep_for(milliseconds(1));
  }
  heartbeat_.reset();
}

uint64_t Connection::max_request_bytes() const {
  return host::max_message_bytes(seg_.requests().capacity);
}

std::optional<std::string> Connection::problem() const {
  if (!broken_.empty()) return broken_;
  const host::SegmentHeader& h = seg_.header();
  if (auto p = worker_problem(h)) return p;
  const int32_t holder = h.host_pid.load(std::memory_order_acquire);
  if (holder != pid_)
    return fmt::format("the worker dropped this host (the host slot is now {}); attach again",
                       holder == 0 ? std::string("free") : fmt::format("held by pid {}", holder));
  if (check_session_ && h.host_session.load(std::memory_order_acquire) != session_)
    return std::string("the worker ended this host's session (it accepted another attach); attach again");
  return std::nullopt;
}

Outcome Connection::call(host::Request& r, const Deadline& d, host::Response& resp) {
  resp = host::Response{};
  Outcome o = send(r, d);
  if (!o.ok()) return o;
  return receive(r.id, r.type, d, resp);
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

Outcome Connection::receive(uint64_t id, host::MessageType type, const Deadline& d, host::Response& out) {
  for (;;) {
    bool corrupt = false;
    const host::MessageHeader* m = reader_.peek(corrupt);
    if (corrupt) {
      broken_ = "the response ring is corrupt; detach and attach again";
      return failed(DSPARK_UNAVAILABLE, broken_);
    }
    if (m != nullptr) {
      // Copy out first: decoding reads a private copy, and the ring space goes back to the worker at once.
      rx_.resize(m->bytes);
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
    reader_.wait(std::min<std::chrono::nanoseconds>(d.left(), kWaitSlice));
  }
}

}  // namespace dspark::client
