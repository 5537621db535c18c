#include "lib/host/listener.hpp"

#include <spdlog/spdlog.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "lib/core/error.hpp"
#include "lib/host/peer.hpp"
#include "lib/host/socket_io.hpp"
#include "lib/host/socket_path.hpp"

namespace dspark::host {
namespace {

constexpr int kBacklog = 64;

// Removes what `path` holds when it is this euid's socket with no listener; throws for anything else.
void clear_stale(const std::string& path) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return;
    fail("cannot stat {}: {}", path, std::strerror(errno));
  }
  if (!S_ISSOCK(st.st_mode) || st.st_uid != ::geteuid())
    fail("{} exists and is not a socket of this worker's uid {} (owner uid {}, mode 0{:o}): not removed",
         path, ::geteuid(), st.st_uid, st.st_mode & 07777);
  UniqueFd probe = connect_socket(path);
  if (probe) {
    int32_t pid = 0;
    try {
      pid = peer_cred(probe.get()).pid;
    } catch (const Error&) {
    }
    fail("another worker (pid {}) serves {}", pid, path);
  }
  if (errno != ECONNREFUSED) fail("cannot check the socket {}: {}", path, std::strerror(errno));
  if (unlink(path.c_str()) != 0 && errno != ENOENT)
    fail("cannot remove the stale socket {}: {}", path, std::strerror(errno));
  spdlog::warn("removed the stale socket {} (no worker listens on it)", path);
}

}  // namespace

Listener::Listener(const std::string& path, std::optional<uint32_t> group) : path_(path) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    fail("socket path '{}': must be 1 to {} bytes", path, sizeof(addr.sun_path) - 1);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  prepare_socket_dir(std::filesystem::path(path).parent_path().string(), group);
  clear_stale(path);
  fd_ = UniqueFd(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd_) fail("cannot create a socket for {}: {}", path, std::strerror(errno));
  if (bind(fd_.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EADDRINUSE) fail("another worker started on {} meanwhile", path);
    fail("cannot bind the socket {}: {}", path, std::strerror(errno));
  }
  // Nobody else can reach the path yet (the directory is this euid's and not writable by others), so setting
  // the mode after bind leaves no window.
  const auto undo = [&](const char* what) {
    const int err = errno;
    unlink(path.c_str());
    fail("cannot {} the socket {}: {}", what, path, std::strerror(err));
  };
  if (group && chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(*group)) != 0)
    undo("give its group to");
  if (chmod(path.c_str(), group ? 0660 : 0600) != 0) undo("set the mode of");
  struct stat st {};
  if (stat(path.c_str(), &st) != 0) undo("stat");
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  if (listen(fd_.get(), kBacklog) != 0) undo("listen on");
}

Listener::~Listener() {
  // Only while the path still is this socket: a later worker may have replaced it after finding it stale.
  struct stat st {};
  if (lstat(path_.c_str(), &st) == 0 && static_cast<uint64_t>(st.st_dev) == dev_ &&
      static_cast<uint64_t>(st.st_ino) == ino_)
    unlink(path_.c_str());
}

}  // namespace dspark::host
