// One message at a time over a SOCK_SEQPACKET Unix socket, with descriptors (SCM_RIGHTS) and a time limit.
#pragma once

#include <chrono>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "lib/host/protocol.hpp"
#include "lib/host/unique_fd.hpp"

namespace dspark::host {

// A connected SOCK_SEQPACKET socket to `path` (close-on-exec), or an invalid fd with errno set.
UniqueFd connect_socket(const std::string& path);

// Sends one message (never blocking, never raising SIGPIPE) with `fds` attached. False on failure (errno).
bool send_message(int socket_fd, const void* data, size_t bytes, std::span<const int> fds = {});

enum class Received { message, closed, timed_out, malformed };

// Waits up to `timeout` for one message of exactly `bytes` bytes; received descriptors (close-on-exec) go to
// `fds` (dropped when null). A message of another size, or more descriptors than `max_fds`, is malformed;
// with `received`, a shorter one is taken too and its length stored there.
Received receive_message(int socket_fd, void* data, size_t bytes, std::chrono::milliseconds timeout,
                         std::vector<UniqueFd>* fds = nullptr, size_t max_fds = 0,
                         size_t* received = nullptr);

// A reply with its reason (cut to fit, NUL-terminated) and a zero observation.
// `version`: the one the peer's hello asked for, where it is served.
SocketReply make_reply(Admission admission, const std::string& reason, uint32_t version = kProtocolVersion);

}  // namespace dspark::host
