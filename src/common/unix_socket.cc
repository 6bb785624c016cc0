// UnixListener (unix_socket.h).
#include "common/unix_socket.h"

#include <errno.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

namespace fragscope {

std::size_t MaxUnixSocketPath() { return sizeof(sockaddr_un{}.sun_path) - 1; }

Status UnixListener::Open(const std::string& path, mode_t mode, std::string_view what) {
  if (fd_ >= 0) return Status::Internal(fmt::format("the {} is already open", what));
  sockaddr_un addr{};
  if (path.empty() || path.size() > MaxUnixSocketPath()) {
    return Status::InvalidArgument(
        fmt::format("{} path \"{}\": must be 1..{} bytes", what, path, MaxUnixSocketPath()));
  }
  const std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    if (!std::filesystem::exists(parent, ec)) {
      std::filesystem::create_directories(parent, ec);
      if (ec) {
        return Status::IoError(
            fmt::format("cannot create the directory {}: {}", parent.string(), ec.message()));
      }
      ::chmod(parent.c_str(), 0755);
    }
  }
  std::memcpy(addr.sun_path, path.data(), path.size());
  addr.sun_family = AF_UNIX;

  struct stat st = {};
  if (::lstat(path.c_str(), &st) == 0) {
    if (!S_ISSOCK(st.st_mode)) {
      return Status::InvalidArgument(
          fmt::format("{} path {} exists and is not a socket; not replacing it", what, path));
    }
    // A socket: in use if something accepts on it, stale otherwise.
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (probe < 0) return Status::IoError(fmt::format("socket(): {}", std::strerror(errno)));
    const bool live =
        ::connect(probe, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0 ||
        errno == EAGAIN;
    ::close(probe);
    if (live) {
      return Status::InvalidArgument(fmt::format(
          "{} {} is in use by another process (is a daemon already running?)", what, path));
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT) {
      return Status::IoError(
          fmt::format("cannot remove the stale socket {}: {}", path, std::strerror(errno)));
    }
  } else if (errno != ENOENT) {
    return Status::IoError(fmt::format("cannot stat {}: {}", path, std::strerror(errno)));
  }

  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) return Status::IoError(fmt::format("socket(): {}", std::strerror(errno)));
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    const int err = errno;
    ::close(fd);
    return Status::IoError(
        fmt::format("cannot bind the {} {}: {}", what, path, std::strerror(err)));
  }
  // Permissions before listen(): nobody can connect until then.
  if (::chmod(path.c_str(), mode) != 0 || ::lstat(path.c_str(), &st) != 0) {
    const int err = errno;
    ::close(fd);
    ::unlink(path.c_str());
    return Status::IoError(fmt::format("cannot set the mode of {}: {}", path, std::strerror(err)));
  }
  fd_ = fd;
  path_ = path;
  dev_ = st.st_dev;
  ino_ = st.st_ino;
  if (::listen(fd_, 128) != 0) {
    const int err = errno;
    Close();
    return Status::IoError(fmt::format("listen() on {}: {}", path, std::strerror(err)));
  }
  return Status::Ok();
}

void UnixListener::Close() {
  if (fd_ < 0) return;
  ::close(fd_);
  fd_ = -1;
  struct stat st = {};
  if (::lstat(path_.c_str(), &st) == 0 && S_ISSOCK(st.st_mode) && st.st_dev == dev_ &&
      st.st_ino == ino_) {
    ::unlink(path_.c_str());
  }
}

}  // namespace fragscope
