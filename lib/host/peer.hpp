// Who is at the other end of a Unix socket (SO_PEERCRED, filled by the kernel: it cannot be forged), and
// group membership for ring.group.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dspark::host {

struct PeerCred {
  int32_t pid = 0;  // as this process's pid namespace sees it
  uint32_t uid = 0;
  uint32_t gid = 0;
};

// The credentials of the socket's peer (for a connected client: the process that called listen()). Throws
// dspark::Error when the socket has none.
PeerCred peer_cred(int socket_fd);

// The id of group `name`, or nothing when the system has no such group.
std::optional<uint32_t> group_id(const std::string& name);

// Whether user `uid` is a member of group `gid` (its primary group or a supplementary one, getgrouplist).
bool uid_in_group(uint32_t uid, uint32_t gid);

}  // namespace dspark::host
