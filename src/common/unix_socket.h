// A listening Unix domain socket the daemon owns: the agent socket (sources/agent) and the
// API socket (sinks/prometheus/http_server.h) are set up and taken down the same way.
//
// Set-up: the parent directory is created (0755) when missing; an existing socket that nobody
// accepts on (a daemon that died) is replaced; a live socket, or any other kind of file at the
// path, is an error and is never clobbered. The file gets its mode before listen(), so nobody
// can connect while it is wider. Take-down removes the file only if it is still the one made
// here (same device and inode), not one a successor daemon made meanwhile.
#ifndef FRAGSCOPE_COMMON_UNIX_SOCKET_H_
#define FRAGSCOPE_COMMON_UNIX_SOCKET_H_

#include <cstddef>
#include <string>
#include <string_view>

#include <sys/types.h>

#include "fragscope/status.h"

namespace fragscope {

/// The longest path a Unix socket address holds (sun_path without its terminating NUL).
std::size_t MaxUnixSocketPath();

class UnixListener {
 public:
  UnixListener() = default;
  ~UnixListener() { Close(); }
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  /// Binds `path` with `mode`, non-blocking and close-on-exec, and listens. `what` names the
  /// socket in errors ("agent socket"). A live socket at the path is InvalidArgument with
  /// "in use" in its message; a path that is not a socket, or too long, is InvalidArgument;
  /// system failures are IoError. REQUIRES: not open.
  Status Open(const std::string& path, mode_t mode, std::string_view what);
  /// Closes the socket and removes its file if it is still ours. Idempotent.
  void Close();
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
  dev_t dev_ = 0;
  ino_t ino_ = 0;
};

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_UNIX_SOCKET_H_
