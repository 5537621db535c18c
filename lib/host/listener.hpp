// The worker's listening socket. It never removes what it did not make: an existing path is replaced only
// when it is a socket of this euid that no process listens on any more.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "lib/host/unique_fd.hpp"

namespace dspark::host {

class Listener {
 public:
  // Prepares the directory (prepare_socket_dir), removes a stale socket at `path`, binds and listens (mode
  // 0600; 0660 and group `group` when given). dspark::Error names the path: "another worker (pid N) serves
  // <path>" for a live one, the owner and mode of anything else found there.
  Listener(const std::string& path, std::optional<uint32_t> group);
  ~Listener();  // closes, and removes the path while it still is this socket
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  int fd() const { return fd_.get(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  UniqueFd fd_;
  uint64_t dev_ = 0, ino_ = 0;
};

}  // namespace dspark::host
