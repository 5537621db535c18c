// Where a worker's socket lives, and the checks of the directory that holds it.
//
// ring.name is a bare name (a leading '/' is allowed and stripped): the socket is <dir>/<name>.sock, dir
// being ring.socket_dir when configured, else $XDG_RUNTIME_DIR/dspark when XDG_RUNTIME_DIR is set, else
// /tmp/dspark-<euid>. A name holding a '/' after its first character is the socket's full path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace dspark::host {

// The directory of bare names when no socket_dir is configured.
std::string default_socket_dir();

// The socket path of `name` (socket_dir "" = the default directory). Throws dspark::Error naming the name or
// path when it is empty or too long for a Unix socket.
std::string socket_path(const std::string& name, const std::string& socket_dir = "");

// Worker side: creates `dir` when missing (mode 0700; 0750 and group `group` when given), then refuses it
// (dspark::Error naming the path, its owner and mode) when it is a symlink or not a directory, is not owned
// by this process's euid, or is writable by its group or others: whoever can write the directory could
// replace the socket.
void prepare_socket_dir(const std::string& dir, std::optional<uint32_t> group);

}  // namespace dspark::host
