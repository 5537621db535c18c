#include "lib/host/host_door.hpp"

#include <poll.h>
#include <spdlog/spdlog.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <exception>

#include "lib/core/error.hpp"
#include "lib/host/liveness.hpp"
#include "lib/host/protocol_version.hpp"
#include "lib/host/socket_io.hpp"

namespace dspark::host {
namespace {

constexpr int kPollMs = 100;
constexpr auto kHeartbeat = std::chrono::milliseconds(100);
constexpr int kAcceptsPerWake = 16;  // then the loop looks at releases and the host's socket again

const char* state_name(WorkerState s) {
  switch (s) {
    case WorkerState::starting:
      return "starting";
    case WorkerState::serving:
      return "serving";
    case WorkerState::draining:
      return "draining";
    case WorkerState::unhealthy:
      return "unhealthy";
    case WorkerState::stopped:
      return "stopped";
  }
  return "in an unknown state";
}

std::optional<uint32_t> resolve_group(const std::string& name) {
  if (name.empty()) return std::nullopt;
  const std::optional<uint32_t> gid = group_id(name);
  if (!gid) fail("ring.group: this system has no group named '{}'", name);
  return gid;
}

}  // namespace

HostDoor::HostDoor(DoorOptions options, Observe observe)
    : opt_(std::move(options)),
      observe_(std::move(observe)),
      gid_(resolve_group(opt_.group)),
      listener_(opt_.path, gid_),
      wake_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      model_(opt_.model) {
  if (!wake_) fail("cannot create an eventfd for the socket {}: {}", opt_.path, std::strerror(errno));
  door_ = std::thread([this] { door_loop(); });
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
  spdlog::info("host interface: socket {} (uid {}{}), serving {}", opt_.path, ::geteuid(),
               gid_ ? fmt::format(" and group {}", opt_.group) : std::string(), served_versions());
}

HostDoor::~HostDoor() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    quit_ = true;
  }
  cv_.notify_all();
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
  door_.join();
  heartbeat_.join();
}

void HostDoor::set_model(const ModelDescription& m) {
  std::lock_guard<std::mutex> lock(mu_);
  model_ = m;
}

void HostDoor::set_state(WorkerState s) {
  std::lock_guard<std::mutex> lock(mu_);
  state_.store(static_cast<uint32_t>(s));
  if (live_) live_->areas.worker().worker_state.store(static_cast<uint32_t>(s));
}

std::shared_ptr<AdmittedHost> HostDoor::wait_admitted(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait_for(lock, timeout, [this] { return pending_ != nullptr || quit_.load(); });
  return std::exchange(pending_, nullptr);
}

void HostDoor::release() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_.reset();
    pending_.reset();
    release_requested_ = true;
  }
  const uint64_t one = 1;
  (void)!write(wake_.get(), &one, sizeof(one));
}

void HostDoor::heartbeat_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!quit_.load()) {
    if (live_ && opt_.stamp_heartbeat) live_->areas.worker().worker_heartbeat_ns.store(monotonic_ns());
    cv_.wait_for(lock, kHeartbeat, [this] { return quit_.load(); });
  }
}

void HostDoor::door_loop() {
  while (!quit_.load()) {
    pollfd fds[3] = {{listener_.fd(), POLLIN, 0}, {wake_.get(), POLLIN, 0}, {host_socket_.get(), 0, 0}};
    const bool watch_host = host_socket_ && !hung_up_.load();
    if (watch_host) fds[2].events = POLLIN | POLLRDHUP;
    if (poll(fds, watch_host ? 3 : 2, kPollMs) < 0 && errno != EINTR) {
      spdlog::error("socket {}: poll failed: {}", path(), std::strerror(errno));
      std::this_thread::sleep_for(std::chrono::milliseconds(kPollMs));
      continue;
    }
    if (fds[1].revents != 0) {
      uint64_t n = 0;
      (void)!read(wake_.get(), &n, sizeof(n));
    }
    if (watch_host && fds[2].revents != 0) {
      hung_up_ = true;  // closed, or bytes the protocol does not have: either way the host is done
      spdlog::info("host pid {}: its socket closed", host_pid_.load());
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (release_requested_) {
        release_requested_ = false;
        host_pid_ = 0;  // before the socket closes: a host that saw it close finds the worker free
        host_socket_.reset();
      }
    }
    if ((fds[0].revents & POLLIN) == 0) continue;
    for (int i = 0; i < kAcceptsPerWake && !quit_.load(); ++i) {
      UniqueFd conn(accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!conn) break;
      try {
        handle(std::move(conn));
      } catch (const std::exception& e) {
        spdlog::warn("socket {}: a connection failed: {}", path(), e.what());
      }
    }
  }
}

bool HostDoor::allowed(uint32_t uid) const {
  return uid == ::geteuid() || (gid_ && uid_in_group(uid, *gid_));
}

void HostDoor::refuse(int conn, Admission a, const std::string& why, bool count,
                      std::optional<uint32_t> version) {
  if (count) {  // before the reply: a peer that has it sees itself counted
    ++refused_;
    spdlog::info("socket {}: refused a connection: {}", path(), why);
  }
  // In the peer's version and layout once its hello is read; before, in the oldest served layout, which
  // every version's client reads (a refusal's reason is in the frozen head).
  const SocketReply r = make_reply(a, why, version.value_or(kProtocolVersion));
  (void)send_message(conn, &r, socket_reply_bytes(version.value_or(kMinProtocolVersion)));
}

void HostDoor::refuse_version(int conn, uint32_t version) {
  const std::string why = version_refusal(version);
  ++refused_;
  spdlog::info("socket {}: refused a connection: {}", path(), why);
  // The head alone: the one reply a peer of any protocol version can read (protocol.hpp).
  const SocketReplyHead r = make_reply(Admission::refused, why).head;
  (void)send_message(conn, &r, sizeof(r));
}

void HostDoor::handle(UniqueFd conn) {
  const PeerCred peer = peer_cred(conn.get());
  // Another user gets the refusal and nothing else: not a byte of it is read.
  if (!allowed(peer.uid)) {
    refuse(conn.get(), Admission::refused,
           fmt::format("uid {} (pid {}) may not use this worker: it admits uid {}{}", peer.uid, peer.pid,
                       ::geteuid(), gid_ ? fmt::format(" and the members of group {}", opt_.group) : ""),
           true);
    return;
  }
  SocketHello hello{};
  const Received got = receive_message(conn.get(), &hello, sizeof(hello), opt_.hello_timeout);
  if (got == Received::closed || got == Received::timed_out) return;  // nothing asked, nothing to answer
  if (got == Received::malformed || hello.magic != kSocketMagic) {
    refuse(conn.get(), Admission::refused, fmt::format("pid {} did not send a dspark hello", peer.pid), true);
    return;
  }
  if (!protocol_served(hello.version)) {
    refuse_version(conn.get(), hello.version);
    return;
  }
  if (hello.kind == static_cast<uint32_t>(PeerKind::observer)) {
    observe(conn.get(), hello.version);
  } else if (hello.kind == static_cast<uint32_t>(PeerKind::host)) {
    admit(std::move(conn), peer, hello.version);
  } else {
    refuse(conn.get(), Admission::refused, fmt::format("unknown peer kind {}", hello.kind), true,
           hello.version);
  }
}

void HostDoor::observe(int conn, uint32_t version) {
  SocketReply r = make_reply(Admission::accepted, "", version);
  Observation& o = r.observation;
  o.state = state_.load();
  o.worker_pid = static_cast<int32_t>(getpid());
  o.host_pid = host_pid_.load();
  {
    std::lock_guard<std::mutex> lock(mu_);
    o.model = model_;
  }
  observe_(o, r.observation_more);
  o.stats.hosts_refused = refused_.load();
  (void)send_message(conn, &r, socket_reply_bytes(version));
}

void HostDoor::admit(UniqueFd conn, const PeerCred& peer, uint32_t version) {
  const auto state = static_cast<WorkerState>(state_.load());
  if (state != WorkerState::serving) {
    refuse(conn.get(), Admission::not_ready, fmt::format("the worker is {}", state_name(state)), false,
           version);
    return;
  }
  if (host_socket_) {
    // A host whose socket closed is on its way out (the server releases it within its poll): try again.
    pollfd p{host_socket_.get(), POLLIN | POLLRDHUP, 0};
    if (hung_up_.load() || poll(&p, 1, 0) != 0) {
      hung_up_ = true;
      refuse(conn.get(), Admission::not_ready,
             fmt::format("the previous host (pid {}) is gone; its session is ending", host_pid_.load()),
             false, version);
      return;
    }
    refuse(conn.get(), Admission::refused, fmt::format("another host (pid {}) is attached", host_pid_.load()),
           true, version);
    return;
  }
  ModelDescription model;
  {
    std::lock_guard<std::mutex> lock(mu_);
    model = model_;
  }
  auto host = std::make_shared<AdmittedHost>(AdmittedHost{
      peer, sessions_ + 1, monotonic_ns(),
      SessionAreas::create(model, sessions_ + 1, state, version, opt_.max_distributions), version});
  const SocketReply r = make_reply(Admission::accepted, "", version);
  const int fds[2] = {host->areas.worker_fd(), host->areas.host_fd()};
  if (!send_message(conn.get(), &r, socket_reply_bytes(version), fds)) {
    spdlog::info("host pid {}: gone before its memory could be sent ({})", peer.pid, std::strerror(errno));
    return;
  }
  host->areas.drop_fds();  // the host holds the only descriptors now
  ++sessions_;
  host_socket_ = std::move(conn);
  host_pid_ = peer.pid;
  hung_up_ = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    live_ = host;
    pending_ = host;
  }
  cv_.notify_all();
  spdlog::info("host pid {} (uid {}) admitted: session {}", peer.pid, peer.uid, host->session);
}

}  // namespace dspark::host
