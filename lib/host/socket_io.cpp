#include "lib/host/socket_io.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dspark::host {
namespace {

constexpr size_t kMaxFds = 4;

}  // namespace

UniqueFd connect_socket(const std::string& path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    errno = ENAMETOOLONG;
    return UniqueFd();
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  UniqueFd fd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  if (connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    fd.reset();
    errno = err;
  }
  return fd;
}

bool send_message(int socket_fd, const void* data, size_t bytes, std::span<const int> fds) {
  if (fds.size() > kMaxFds) {
    errno = EINVAL;
    return false;
  }
  iovec iov{const_cast<void*>(data), bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  if (!fds.empty()) {
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = sendmsg(socket_fd, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n >= 0) return static_cast<size_t>(n) == bytes;
    if (errno != EINTR) return false;
  }
}

Received receive_message(int socket_fd, void* data, size_t bytes, std::chrono::milliseconds timeout,
                         std::vector<UniqueFd>* fds, size_t max_fds, size_t* received) {
  pollfd p{socket_fd, POLLIN, 0};
  int ready = 0;
  do {
    ready = poll(&p, 1, static_cast<int>(std::max<int64_t>(timeout.count(), 0)));
  } while (ready < 0 && errno == EINTR);
  if (ready == 0) return Received::timed_out;
  if (ready < 0) return Received::closed;
  iovec iov{data, bytes};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kMaxFds)] = {};
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n = 0;
  bool reset_seen = false;
  for (;;) {
    n = recvmsg(socket_fd, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n >= 0 || errno == EINTR) {
      if (n >= 0) break;
      continue;
    }
    // A peer that closed before reading what this side sent reports ECONNRESET once, ahead of the message it
    // sent before closing (a refusal): the error is cleared by reporting it, so read again.
    if (errno != ECONNRESET || reset_seen) break;
    reset_seen = true;
  }
  if (n < 0) return errno == EAGAIN ? Received::timed_out : Received::closed;
  if (n == 0) return Received::closed;
  // Every descriptor that came is owned here first, so none leaks whatever the verdict.
  std::vector<UniqueFd> got;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd = -1;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      got.emplace_back(fd);
    }
  }
  const bool sized = received != nullptr ? static_cast<size_t>(n) <= bytes : static_cast<size_t>(n) == bytes;
  if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0 || !sized || got.size() > max_fds)
    return Received::malformed;
  if (received != nullptr) *received = static_cast<size_t>(n);
  if (fds != nullptr) *fds = std::move(got);
  return Received::message;
}

SocketReply make_reply(Admission admission, const std::string& reason, uint32_t version) {
  SocketReply r{};
  r.head.magic = kSocketMagic;
  r.head.version = version;
  r.head.admission = static_cast<uint32_t>(admission);
  const size_t n = std::min(reason.size(), kReasonBytes - 1);
  std::memcpy(r.head.reason, reason.data(), n);
  r.head.reason[n] = '\0';
  return r;
}

}  // namespace dspark::host
