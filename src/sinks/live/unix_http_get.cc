// UnixHttpGet (unix_http_get.h): a blocking-free exchange on one non-blocking socket, every
// wait a poll() bounded by the one deadline.
#include "sinks/live/unix_http_get.h"

#include <errno.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string_view>

#include <fmt/format.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "common/unix_socket.h"
#include "sinks/prometheus/http_fields.h"

namespace fragscope::sinks::live {
namespace {

using Clock = std::chrono::steady_clock;

// The most of an answer's head read: the daemon's are a few hundred bytes.
constexpr std::size_t kMaxHeadBytes = 64 << 10;

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

std::string ConnectError(int err) {
  switch (err) {
    case ENOENT:
      return "no such socket";
    case ECONNREFUSED:
      return "nobody accepts on it (a stale socket, or not a socket)";
    case EACCES:
    case EPERM:
      return "permission denied (the socket's file mode lets only its owner and group in)";
    case ENOTDIR:
      return "a part of the path is not a folder";
    default:
      return std::strerror(err);
  }
}

// Waits until `fd` is ready for `events` or the deadline passes; false at the deadline.
bool WaitFor(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return false;
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, static_cast<int>(std::min<std::int64_t>(left + 1, 1 << 30)));
    if (n > 0) return true;
    if (n < 0 && errno != EINTR) return true;  // the next read or write says what is wrong
  }
}

struct AnswerHead {
  int status = 0;
  std::optional<std::uint64_t> content_length;
  bool chunked = false;
};

// The status line and the fields that frame the body; nullopt with `why` when it is not HTTP.
std::optional<AnswerHead> ParseAnswerHead(std::string_view head, std::string* why) {
  const std::size_t line_end = head.find("\r\n");
  const std::string_view line = head.substr(0, line_end);
  AnswerHead h;
  if (line.size() < 12 || line.substr(0, 7) != "HTTP/1." || line[8] != ' ' ||
      std::from_chars(line.data() + 9, line.data() + 12, h.status).ptr != line.data() + 12 ||
      h.status < 100 || (line.size() > 12 && line[12] != ' ')) {
    *why = "not an HTTP answer (its first line is not \"HTTP/1.x NNN ...\")";
    return std::nullopt;
  }
  bool bad_length = false;
  const auto field = [&h, &bad_length](std::string_view name, std::string_view value) {
    if (prometheus::EqualsIgnoreCase(name, "Content-Length")) {
      std::uint64_t n = 0;
      const char* end = value.data() + value.size();
      bad_length = bad_length || value.empty() || std::from_chars(value.data(), end, n).ptr != end;
      h.content_length = n;
    } else if (prometheus::EqualsIgnoreCase(name, "Transfer-Encoding")) {
      h.chunked = true;
    }
  };
  prometheus::ForEachHttpField(head, field);
  if (bad_length) {
    *why = "a bad Content-Length in the answer's head";
    return std::nullopt;
  }
  if (h.chunked) {
    *why = "a chunked answer (the daemon's answers carry a Content-Length)";
    return std::nullopt;
  }
  return h;
}

}  // namespace

HttpGetResult UnixHttpGet(const std::string& socket_path, const std::string& target,
                          double timeout_seconds, std::size_t max_body_bytes) {
  HttpGetResult out;
  const Clock::time_point deadline =
      Clock::now() +
      std::chrono::microseconds(static_cast<std::int64_t>(std::max(0.0, timeout_seconds) * 1e6));
  const auto fail = [&out](std::string why) {
    out.outcome = HttpGetResult::Outcome::kFailed;
    out.error = std::move(why);
    out.body.clear();
    return out;
  };
  const auto timed_out = [&out] {
    out.outcome = HttpGetResult::Outcome::kTimedOut;
    out.body.clear();
    return out;
  };
  sockaddr_un addr{};
  if (socket_path.empty() || socket_path.size() > MaxUnixSocketPath()) {
    return fail(fmt::format("a socket path must be 1..{} bytes", MaxUnixSocketPath()));
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, socket_path.data(), socket_path.size());
  Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (fd.get() < 0) return fail(fmt::format("socket(): {}", std::strerror(errno)));
  // A Unix socket connects at once or not at all; EAGAIN is a full accept queue: try again
  // until the deadline.
  while (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno == EINTR) continue;
    if (errno != EAGAIN) return fail(ConnectError(errno));
    if (Clock::now() >= deadline) return timed_out();
    ::poll(nullptr, 0, 10);
  }

  const std::string request = fmt::format(
      "GET {} HTTP/1.1\r\nHost: localhost\r\nUser-Agent: fragscope\r\nConnection: close\r\n\r\n",
      target);
  for (std::size_t sent = 0; sent < request.size();) {
    const ssize_t n = ::send(fd.get(), request.data() + sent, request.size() - sent, MSG_NOSIGNAL);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd.get(), POLLOUT, deadline)) return timed_out();
      continue;
    }
    return fail(
        fmt::format("the connection failed while sending the request: {}", std::strerror(errno)));
  }

  std::string in;
  std::optional<AnswerHead> head;
  std::size_t body_at = 0;
  char chunk[16384];
  for (;;) {
    if (head && head->content_length && in.size() - body_at >= *head->content_length) break;
    const ssize_t n = ::recv(fd.get(), chunk, sizeof(chunk), 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (!WaitFor(fd.get(), POLLIN, deadline)) return timed_out();
      continue;
    }
    if (n < 0) {
      return fail(
          fmt::format("the connection failed while reading the answer: {}", std::strerror(errno)));
    }
    if (n == 0) break;  // the server closed: the answer is whole, or cut off (below)
    in.append(chunk, static_cast<std::size_t>(n));
    if (!head) {
      const std::size_t end = in.find("\r\n\r\n");
      if (end == std::string::npos) {
        if (in.size() > kMaxHeadBytes) {
          return fail(fmt::format("not an HTTP answer (no end of its head in {} KiB)",
                                  kMaxHeadBytes >> 10));
        }
        continue;
      }
      std::string why;
      head = ParseAnswerHead(std::string_view(in).substr(0, end + 2), &why);
      if (!head) return fail(why);
      body_at = end + 4;
      if (head->content_length && *head->content_length > max_body_bytes) {
        out.outcome = HttpGetResult::Outcome::kTooBig;
        return out;
      }
    }
    if (in.size() - body_at > max_body_bytes) {
      out.outcome = HttpGetResult::Outcome::kTooBig;
      return out;
    }
  }
  if (!head) {
    return fail(in.empty() ? "the connection closed without an answer"
                           : "the connection closed in the middle of the answer's head");
  }
  const std::size_t body_bytes = in.size() - body_at;
  if (head->content_length && body_bytes < *head->content_length) {
    return fail(fmt::format("the connection closed {} bytes into an answer of {}", body_bytes,
                            *head->content_length));
  }
  out.outcome = HttpGetResult::Outcome::kOk;
  out.status = head->status;
  out.body = in.substr(body_at, head->content_length.value_or(body_bytes));
  return out;
}

}  // namespace fragscope::sinks::live
