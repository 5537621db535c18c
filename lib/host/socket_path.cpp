#include "lib/host/socket_path.hpp"

#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "lib/core/error.hpp"

namespace dspark::host {
namespace {

constexpr size_t kMaxPathBytes = sizeof(sockaddr_un::sun_path) - 1;

std::string describe(const std::string& dir, const struct stat& st) {
  return fmt::format("{} (owner uid {}, mode 0{:o})", dir, st.st_uid, st.st_mode & 07777);
}

}  // namespace

std::string default_socket_dir() {
  const char* xdg = std::getenv("XDG_RUNTIME_DIR");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/dspark";
  return fmt::format("/tmp/dspark-{}", ::geteuid());
}

std::string socket_path(const std::string& name, const std::string& socket_dir) {
  std::string path;
  if (name.find('/', 1) != std::string::npos) {
    if (name[0] != '/') fail("ring name '{}': a name holding '/' must be an absolute socket path", name);
    path = name;
  } else {
    const std::string bare = !name.empty() && name[0] == '/' ? name.substr(1) : name;
    if (bare.empty()) fail("ring name '{}': empty", name);
    path = (socket_dir.empty() ? default_socket_dir() : socket_dir) + "/" + bare + ".sock";
  }
  if (path.size() > kMaxPathBytes)
    fail("socket path {} of ring name '{}' is {} bytes, over the {} a Unix socket takes", path, name,
         path.size(), kMaxPathBytes);
  return path;
}

void prepare_socket_dir(const std::string& dir, std::optional<uint32_t> group) {
  const mode_t mode = group ? 0750 : 0700;
  if (mkdir(dir.c_str(), mode) == 0) {
    // mkdir applied the umask; the group needs its search bit.
    if (group && chown(dir.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(*group)) != 0)
      fail("cannot give the socket directory {} to group {}: {}", dir, *group, std::strerror(errno));
    if (chmod(dir.c_str(), mode) != 0)
      fail("cannot set the mode of the socket directory {}: {}", dir, std::strerror(errno));
  } else if (errno != EEXIST) {
    fail("cannot create the socket directory {}: {}", dir, std::strerror(errno));
  }
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0)
    fail("cannot stat the socket directory {}: {}", dir, std::strerror(errno));
  if (S_ISLNK(st.st_mode)) fail("the socket directory {} is a symlink: refused", describe(dir, st));
  if (!S_ISDIR(st.st_mode)) fail("the socket directory {} is not a directory: refused", describe(dir, st));
  if (st.st_uid != ::geteuid())
    fail("the socket directory {} is not owned by this worker's uid {}: refused", describe(dir, st),
         ::geteuid());
  if ((st.st_mode & 022) != 0)
    fail("the socket directory {} is writable by its group or others: refused", describe(dir, st));
}

}  // namespace dspark::host
