#include "lib/host/peer.hpp"

#include <grp.h>
#include <pwd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "lib/core/error.hpp"

namespace dspark::host {

PeerCred peer_cred(int socket_fd) {
  ucred c{};
  socklen_t len = sizeof(c);
  if (getsockopt(socket_fd, SOL_SOCKET, SO_PEERCRED, &c, &len) != 0 || len != sizeof(c))
    fail("cannot read the peer's credentials (SO_PEERCRED): {}", std::strerror(errno));
  return PeerCred{static_cast<int32_t>(c.pid), static_cast<uint32_t>(c.uid), static_cast<uint32_t>(c.gid)};
}

std::optional<uint32_t> group_id(const std::string& name) {
  std::vector<char> buf(16384);
  group g{};
  group* found = nullptr;
  for (;;) {
    const int rc = getgrnam_r(name.c_str(), &g, buf.data(), buf.size(), &found);
    if (rc == ERANGE && buf.size() < (1u << 24)) {
      buf.resize(buf.size() * 4);
      continue;
    }
    if (rc != 0 || found == nullptr) return std::nullopt;
    return static_cast<uint32_t>(found->gr_gid);
  }
}

bool uid_in_group(uint32_t uid, uint32_t gid) {
  std::vector<char> buf(16384);
  passwd pw{};
  passwd* found = nullptr;
  for (;;) {
    const int rc = getpwuid_r(static_cast<uid_t>(uid), &pw, buf.data(), buf.size(), &found);
    if (rc == ERANGE && buf.size() < (1u << 24)) {
      buf.resize(buf.size() * 4);
      continue;
    }
    if (rc != 0 || found == nullptr) return false;  // a uid without a user has no groups
    break;
  }
  if (static_cast<uint32_t>(found->pw_gid) == gid) return true;
  std::vector<gid_t> groups(64);
  for (;;) {
    int n = static_cast<int>(groups.size());
    if (getgrouplist(found->pw_name, found->pw_gid, groups.data(), &n) >= 0) {
      groups.resize(static_cast<size_t>(n));
      break;
    }
    if (n <= static_cast<int>(groups.size())) return false;
    groups.resize(static_cast<size_t>(n));
  }
  return std::find(groups.begin(), groups.end(), static_cast<gid_t>(gid)) != groups.end();
}

}  // namespace dspark::host
