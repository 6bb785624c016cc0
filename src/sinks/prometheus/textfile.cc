// WriteTextfile (textfile.h).
#include "sinks/prometheus/textfile.h"

#include <errno.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstring>

#include <fmt/format.h>

namespace fragscope::sinks::prometheus {

Status WriteTextfile(const std::string& dir, std::string_view content) {
  const std::string final_path = fmt::format("{}/{}", dir, kTextfileName);
  // node_exporter reads only *.prom, so the temporary name is never picked up half-written.
  const std::string tmp_path = fmt::format("{}/.{}.{}.tmp", dir, kTextfileName, ::getpid());
  auto fail = [&](std::string_view what, int err) {
    ::unlink(tmp_path.c_str());
    return Status::IoError(fmt::format("{} {}: {}", what, tmp_path, std::strerror(err)));
  };
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Status::IoError(fmt::format("cannot create {}: {}", tmp_path, std::strerror(errno)));
  }
  std::size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::write(fd, content.data() + done, content.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      return fail("cannot write", err);
    }
    done += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    const int err = errno;
    ::close(fd);
    return fail("cannot fsync", err);
  }
  if (::close(fd) != 0) return fail("cannot close", errno);
  if (::rename(tmp_path.c_str(), final_path.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_path.c_str());
    return Status::IoError(
        fmt::format("cannot rename {} to {}: {}", tmp_path, final_path, std::strerror(err)));
  }
  // The rename itself is durable only once the directory is synced.
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return Status::Ok();
}

}  // namespace fragscope::sinks::prometheus
