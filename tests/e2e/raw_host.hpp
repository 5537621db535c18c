// A host speaking the protocol by hand to a real worker: the attach over the socket, then messages written
// straight into the request ring. It keeps copies of the memfds it was handed, so that tests can try what a
// hostile host would do with them.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "lib/host/codec.hpp"
#include "lib/host/door_client.hpp"
#include "lib/host/liveness.hpp"
#include "lib/host/session_areas.hpp"
#include "lib/host/socket_path.hpp"

namespace dspark::test {

class RawHost {
 public:
  // Knocks until the worker admits this host (or the time is up: attached() false, why() says why).
  explicit RawHost(const std::string& ring, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    const auto end = std::chrono::steady_clock::now() + limit;
    for (;;) {
      host::DoorAnswer a =
          host::knock(host::socket_path(ring), ::geteuid(), host::PeerKind::host, std::chrono::seconds(2));
      why_ = a.why;
      if (a.kind == host::DoorAnswer::Kind::accepted) {
        worker_fd_ = host::UniqueFd(dup(a.worker_area.get()));
        host_fd_ = host::UniqueFd(dup(a.host_area.get()));
        areas_.emplace(host::SessionAreas::open(std::move(a.worker_area), std::move(a.host_area)));
        socket_ = std::move(a.socket);
        reader_.emplace(areas_->responses());
        beat();
        return;
      }
      if (a.kind == host::DoorAnswer::Kind::refused || std::chrono::steady_clock::now() >= end) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }
  ~RawHost() {
    if (!attached() || closed_by_worker(std::chrono::milliseconds(0))) return;
    host::Request d;
    d.type = host::MessageType::detach;
    send(d);
    (void)closed_by_worker(std::chrono::seconds(2));
  }
  bool attached() const { return areas_.has_value(); }
  const std::string& why() const { return why_; }
  host::SessionAreas& areas() { return *areas_; }
  const host::ModelDescription& model() const { return areas_->worker().model; }
  int worker_fd() const { return worker_fd_.get(); }
  int host_fd() const { return host_fd_.get(); }

  void beat() { areas_->host().host_heartbeat_ns.store(host::monotonic_ns()); }
  // Whether the worker closes this host's socket within `limit` (it ended the session).
  bool closed_by_worker(std::chrono::milliseconds limit) {
    pollfd p{socket_.get(), POLLIN | POLLRDHUP, 0};
    return poll(&p, 1, static_cast<int>(limit.count())) == 1;
  }

  void send(const host::Request& r) {
    beat();
    std::vector<uint8_t> bytes(host::encoded_size(r, model()));
    host::encode_request(r, model(), bytes.data());
    send_bytes(bytes);
  }
  void send_bytes(const std::vector<uint8_t>& bytes) {
    host::RingWriter w(areas_->requests());
    uint8_t* dst = w.reserve(static_cast<uint32_t>(bytes.size()), std::chrono::seconds(5));
    ASSERT_NE(dst, nullptr);
    std::memcpy(dst, bytes.data(), bytes.size());
    w.publish();
  }
  // The next answer (stamping the heartbeat while it waits), or nothing within 10 s.
  std::optional<host::Response> receive() {
    for (int i = 0; i < 100; ++i) {
      beat();
      if (!reader_->wait(std::chrono::milliseconds(100))) continue;
      bool corrupt = false;
      const host::MessageHeader* m = reader_->peek(corrupt);
      if (!m) continue;
      std::vector<uint8_t> copy(reader_->peeked_bytes());
      std::memcpy(copy.data(), m, copy.size());
      reader_->consume();
      host::Response out;
      EXPECT_TRUE(host::decode_response(copy, out).ok());
      return out;
    }
    return std::nullopt;
  }
  host::Response call(host::Request r) {
    r.id = ++next_id_;
    send(r);
    std::optional<host::Response> got = receive();
    EXPECT_TRUE(got.has_value()) << "no answer";
    return got.value_or(host::Response{});
  }

 private:
  std::string why_;
  host::UniqueFd socket_, worker_fd_, host_fd_;
  std::optional<host::SessionAreas> areas_;
  std::optional<host::RingReader> reader_;
  uint64_t next_id_ = 1000;
};

}  // namespace dspark::test
