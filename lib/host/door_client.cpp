#include "lib/host/door_client.hpp"

#include <cerrno>
#include <cstring>
#include <vector>

#include "lib/core/error.hpp"
#include "lib/host/socket_io.hpp"

namespace dspark::host {

DoorAnswer knock(const std::string& path, uint32_t expected_uid, PeerKind kind,
                 std::chrono::milliseconds timeout) {
  DoorAnswer a;
  UniqueFd fd = connect_socket(path);
  if (!fd) {
    const int err = errno;
    const bool absent = err == ENOENT || err == ECONNREFUSED;
    a.kind = absent ? DoorAnswer::Kind::no_worker : DoorAnswer::Kind::refused;
    a.why = absent ? fmt::format("no worker serves {} ({})", path, std::strerror(err))
                   : fmt::format("cannot connect to {}: {}", path, std::strerror(err));
    return a;
  }
  try {
    a.worker = peer_cred(fd.get());
  } catch (const Error& e) {
    a.kind = DoorAnswer::Kind::refused;
    a.why = fmt::format("{}: {}", path, e.what());
    return a;
  }
  if (a.worker.uid != expected_uid) {
    a.kind = DoorAnswer::Kind::wrong_owner;
    a.why = fmt::format("the worker at {} runs as uid {}, expected {}", path, a.worker.uid, expected_uid);
    return a;
  }
  const SocketHello hello{kSocketMagic, kProtocolVersion, static_cast<uint32_t>(kind)};
  // A worker refusing this peer's credentials answers and closes before it reads the hello: a failed send
  // still reads the refusal waiting in the socket.
  const bool sent = send_message(fd.get(), &hello, sizeof(hello));
  const int send_error = errno;
  SocketReply reply{};
  size_t bytes = 0;
  std::vector<UniqueFd> fds;
  const Received got = receive_message(fd.get(), &reply, sizeof(reply),
                                       sent ? timeout : std::chrono::milliseconds(0), &fds, 2, &bytes);
  if (!sent && (got == Received::closed || got == Received::timed_out)) {
    a.kind = DoorAnswer::Kind::no_worker;  // it closed meanwhile (a worker that is stopping)
    a.why = fmt::format("the worker at {} closed the connection: {}", path, std::strerror(send_error));
    return a;
  }
  if (got == Received::timed_out) {
    a.kind = DoorAnswer::Kind::not_ready;
    a.why = fmt::format("the worker (pid {}) at {} did not answer within {} ms", a.worker.pid, path,
                        timeout.count());
    return a;
  }
  if (got == Received::closed) {
    a.kind = DoorAnswer::Kind::no_worker;
    a.why =
        fmt::format("the worker (pid {}) at {} closed the connection without an answer", a.worker.pid, path);
    return a;
  }
  SocketReplyHead& head = reply.head;
  a.kind = DoorAnswer::Kind::refused;
  if (got == Received::malformed || bytes < sizeof(head) || head.magic != kSocketMagic) {
    a.why = fmt::format("the worker (pid {}) at {} did not answer with a dspark reply", a.worker.pid, path);
    return a;
  }
  head.reason[kReasonBytes - 1] = '\0';
  a.why = head.reason;
  // A worker of another version says so in the frozen head: its reason names both versions.
  if (head.version != kProtocolVersion) {
    if (head.admission != static_cast<uint32_t>(Admission::refused) || a.why.empty())
      a.why = fmt::format("the worker (pid {}) at {} answers in protocol version {}; this client speaks {}",
                          a.worker.pid, path, head.version, kProtocolVersion);
    return a;
  }
  // A refusal may come in the oldest layout (sent before the worker read the hello); an admission is whole.
  const bool admitted = head.admission == static_cast<uint32_t>(Admission::accepted);
  if (admitted ? bytes != sizeof(reply) : bytes < socket_reply_bytes(kMinProtocolVersion)) {
    a.why = fmt::format("the worker (pid {}) at {} sent a reply of {} bytes, not {}", a.worker.pid, path,
                        bytes, sizeof(reply));
    return a;
  }
  switch (static_cast<Admission>(head.admission)) {
    case Admission::accepted:
      if (kind == PeerKind::host) {
        if (fds.size() != 2) {
          a.kind = DoorAnswer::Kind::refused;
          a.why = fmt::format("the worker (pid {}) accepted this host but sent {} memfds, not 2",
                              a.worker.pid, fds.size());
          return a;
        }
        a.worker_area = std::move(fds[0]);
        a.host_area = std::move(fds[1]);
        a.socket = std::move(fd);
      }
      a.observation = reply.observation;
      a.observation_more = reply.observation_more;
      a.kind = DoorAnswer::Kind::accepted;
      return a;
    case Admission::not_ready:
      a.kind = DoorAnswer::Kind::not_ready;
      return a;
    default:
      a.kind = DoorAnswer::Kind::refused;
      return a;
  }
}

}  // namespace dspark::host
