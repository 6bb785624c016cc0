// MetricsHttpServer (http_server.h): a single-threaded poll() loop over non-blocking sockets.
//
// Why not cpp-httplib's server (used before): its version in Debian (0.11) gives each
// connection a pool thread for as long as the client keeps sending, and its read timeout
// restarts with every byte, so as many trickling clients as threads blinded the exporter.
#include "sinks/prometheus/http_server.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <netinet/in.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include "sinks/prometheus/exposition.h"
#include "sinks/prometheus/http_fields.h"

namespace fragscope::sinks::prometheus {
namespace {

using Clock = std::chrono::steady_clock;

struct Connection {
  int fd = -1;
  std::string in;   // bytes of the request being read (and any pipelined after it)
  std::string out;  // the answer being sent: its head (or all of it) ...
  std::shared_ptr<const std::string> page;  // ... then a shared /metrics page, if any
  std::size_t sent = 0;                     // bytes of out + *page sent
  bool writing = false;
  bool close_after = false;
  bool draining = false;  // answer sent, our side shut: discarding input until EOF or deadline
  Clock::time_point ready_since;  // when it became ready for the current request
  Clock::time_point deadline;     // of the request (reading) or of the answer (writing)
  Clock::time_point progress;     // when the client last took a byte of its answer
};

std::string Answer(int status, std::string_view reason, std::string_view content_type,
                   const std::string& body, bool head, bool close, std::string_view extra = {}) {
  std::string out =
      fmt::format("HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\n{}{}\r\n", status,
                  reason, content_type, body.size(), extra, close ? "Connection: close\r\n" : "");
  if (!head) out += body;
  return out;
}

constexpr std::string_view kTextPlain = "text/plain; charset=utf-8";
constexpr std::string_view kJson = "application/json; charset=utf-8";
// Distinct API targets whose pages are kept for sharing (each process's map is one); past it
// the cache starts afresh, so a client walking random paths cannot grow it.
constexpr std::size_t kMaxApiPages = 64;

}  // namespace

MetricsHttpServer::MetricsHttpServer(HttpServerOptions options, std::function<std::string()> render,
                                     std::function<HealthAnswer()> health)
    : options_(std::move(options)), render_(std::move(render)), health_(std::move(health)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

HttpServerStats MetricsHttpServer::stats() const {
  HttpServerStats s;
  s.connections_accepted = accepted_.load();
  s.connections_evicted = evicted_.load();
  s.requests_timed_out = timed_out_.load();
  s.requests_refused = refused_.load();
  return s;
}

Status MetricsHttpServer::Start() {
  if (thread_.joinable()) return Status::Internal("MetricsHttpServer::Start called twice");
  if (options_.max_connections < 1) {
    return Status::InvalidArgument("the HTTP server needs room for at least 1 connection");
  }
  if (!options_.unix_socket_path.empty()) {
    if (Status s =
            unix_listener_.Open(options_.unix_socket_path, options_.unix_socket_mode, "API socket");
        !s.ok()) {
      return s;
    }
    listen_fd_ = unix_listener_.fd();
    port_ = 0;
  } else if (Status s = ListenTcp(); !s.ok()) {
    return s;
  }
  wake_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) {
    const int err = errno;
    CloseListener();
    return Status::IoError(fmt::format("eventfd(): {}", std::strerror(err)));
  }
  stop_ = false;
  thread_ = std::thread([this] { Run(); });
  return Status::Ok();
}

void MetricsHttpServer::CloseListener() {
  if (unix_listener_.fd() >= 0) {
    unix_listener_.Close();
  } else if (listen_fd_ >= 0) {
    ::close(listen_fd_);
  }
  listen_fd_ = -1;
}

Status MetricsHttpServer::ListenTcp() {
  const std::string where = options_.host.find(':') != std::string::npos
                                ? fmt::format("[{}]:{}", options_.host, options_.port)
                                : fmt::format("{}:{}", options_.host, options_.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(options_.port);
  if (const int rc = ::getaddrinfo(options_.host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    return Status::IoError(fmt::format("cannot listen on {}: {}", where, ::gai_strerror(rc)));
  }
  int err = 0;
  for (addrinfo* a = found; a != nullptr && listen_fd_ < 0; a = a->ai_next) {
    const int fd =
        ::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      err = errno;
      continue;
    }
    // SO_REUSEADDR only, never SO_REUSEPORT: that would let a second daemon bind the same
    // port and silently take half the scrapes.
    int yes = 1;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    if (::bind(fd, a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd, 128) != 0) {
      err = errno;
      ::close(fd);
      continue;
    }
    listen_fd_ = fd;
  }
  ::freeaddrinfo(found);
  if (listen_fd_ < 0) {
    return Status::IoError(
        fmt::format("cannot listen on {}: {}", where,
                    err == EADDRINUSE ? "the address is in use" : std::strerror(err)));
  }
  sockaddr_storage bound{};
  socklen_t len = sizeof(bound);
  if (::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&bound), &len) == 0) {
    port_ = bound.ss_family == AF_INET6
                ? ntohs(reinterpret_cast<const sockaddr_in6*>(&bound)->sin6_port)
                : ntohs(reinterpret_cast<const sockaddr_in*>(&bound)->sin_port);
  }
  return Status::Ok();
}

void MetricsHttpServer::Stop() {
  if (thread_.joinable()) {
    stop_ = true;
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof(one));
    thread_.join();
  }
  CloseListener();
  if (wake_fd_ >= 0) {
    ::close(wake_fd_);
    wake_fd_ = -1;
  }
}

void MetricsHttpServer::Run() {
  std::map<int, Connection> conns;  // by fd
  std::vector<pollfd> fds;
  std::shared_ptr<const std::string> page;  // the latest /metrics page
  Clock::time_point page_rendered;
  char chunk[4096];

  auto close_conn = [&](std::map<int, Connection>::iterator it) {
    ::close(it->first);
    return conns.erase(it);
  };
  auto ready_for_request = [&](Connection& c, Clock::time_point now) {
    c.writing = false;
    c.out.clear();
    c.page.reset();
    c.sent = 0;
    c.ready_since = now;
    c.deadline = now + options_.request_timeout;
  };
  auto start_answer = [&](Connection& c, std::string out, bool close, Clock::time_point now) {
    c.out = std::move(out);
    c.sent = 0;
    c.writing = true;
    c.close_after = close;
    c.deadline = now + options_.write_timeout;
    c.progress = now;
  };
  // The writer that has gone longest without taking a byte (conns.end() if none): the one a
  // slow reader's slot or buffer is taken from.
  auto most_stalled_writer = [&](const Connection* spare) {
    auto stalled = conns.end();
    for (auto it = conns.begin(); it != conns.end(); ++it) {
      if (!it->second.writing || &it->second == spare) continue;
      if (stalled == conns.end() || it->second.progress < stalled->second.progress) stalled = it;
    }
    return stalled;
  };
  // Bytes held for the answers being written, each shared page once.
  auto buffered_bytes = [&] {
    std::size_t total = 0;
    std::vector<const std::string*> pages;
    for (const auto& [fd, c] : conns) {
      if (!c.writing) continue;
      total += c.out.size();
      if (c.page && std::find(pages.begin(), pages.end(), c.page.get()) == pages.end()) {
        pages.push_back(c.page.get());
        total += c.page->size();
      }
    }
    return total;
  };

  // A new page of `bytes` beside the old ones slow readers still hold: past the bound, the
  // most stalled of them go (their pages with them), never `c`, the one asking now.
  auto make_room = [&](std::size_t bytes, const Connection* c) {
    while (buffered_bytes() + bytes > options_.max_buffered_bytes) {
      auto stalled = most_stalled_writer(c);
      if (stalled == conns.end()) break;
      ++evicted_;
      close_conn(stalled);
    }
  };
  struct ApiPage {
    int status = 200;
    std::shared_ptr<const std::string> page;
    Clock::time_point rendered;
  };
  std::map<std::string, ApiPage> api_pages;  // by target; at most kMaxApiPages

  // If `c.in` holds a whole request head, consumes it and starts the answer; returns whether
  // it did. Refusals close the connection after their answer.
  auto handle_request = [&](Connection& c, Clock::time_point now) {
    const std::size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos || end + 4 > options_.max_request_bytes) {
      if (c.in.size() > options_.max_request_bytes ||
          (end != std::string::npos && end + 4 > options_.max_request_bytes)) {
        ++refused_;
        start_answer(c,
                     Answer(431, "Request Header Fields Too Large", kTextPlain,
                            fmt::format("request head over {} bytes\n", options_.max_request_bytes),
                            false, true),
                     true, now);
        return true;
      }
      return false;
    }
    const std::string head = c.in.substr(0, end + 2);
    c.in.erase(0, end + 4);
    // Request line: METHOD SP TARGET SP HTTP/1.x
    const std::size_t line_end = head.find("\r\n");
    const std::string_view line(head.data(), line_end);
    const std::size_t sp1 = line.find(' ');
    const std::size_t sp2 = sp1 == std::string_view::npos ? sp1 : line.find(' ', sp1 + 1);
    if (sp2 == std::string_view::npos || line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0) {
      ++refused_;
      start_answer(c,
                   Answer(400, "Bad Request", kTextPlain, "malformed request line\n", false, true),
                   true, now);
      return true;
    }
    const std::string_view method = line.substr(0, sp1);
    std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
    const bool http10 = line.substr(sp2 + 1) == "HTTP/1.0";
    bool close = http10;
    bool has_body = false;
    const auto field = [&](std::string_view name, std::string_view val) {
      if (EqualsIgnoreCase(name, "Content-Length")) {
        has_body = has_body || (val != "0");
      } else if (EqualsIgnoreCase(name, "Transfer-Encoding")) {
        has_body = true;
      } else if (EqualsIgnoreCase(name, "Connection")) {
        if (EqualsIgnoreCase(val, "close")) close = true;
        if (EqualsIgnoreCase(val, "keep-alive")) close = false;
      }
    };
    ForEachHttpField(head, field);
    const bool head_only = method == "HEAD";
    if (has_body) {
      ++refused_;
      start_answer(c,
                   Answer(413, "Payload Too Large", kTextPlain,
                          "fragscope's endpoints take no request body\n", head_only, true),
                   true, now);
      return true;
    }
    if (method != "GET" && !head_only) {
      ++refused_;
      start_answer(c,
                   Answer(405, "Method Not Allowed", kTextPlain, "only GET and HEAD\n", false,
                          close, "Allow: GET, HEAD\r\n"),
                   close, now);
      return true;
    }
    if (const std::size_t q = target.find('?'); q != std::string_view::npos) {
      target = target.substr(0, q);
    }
    if (target == "/metrics") {
      // Connections asking within page_max_age share one rendered page: a crowd of scrapes
      // (or of clients that never read their answer) costs one render and one copy.
      if (!page || now - page_rendered >= options_.page_max_age) {
        page = std::make_shared<const std::string>(render_());
        page_rendered = now;
        make_room(page->size(), &c);
      }
      std::string answer_head = Answer(200, "OK", kContentType, std::string(), true, close);
      const std::string_view zero = "Content-Length: 0\r\n";
      answer_head.replace(answer_head.find(zero), zero.size(),
                          fmt::format("Content-Length: {}\r\n", page->size()));
      start_answer(c, std::move(answer_head), close, now);
      if (!head_only) c.page = page;
    } else if (target == "/healthz") {
      std::string body = "ok\n";
      if (health_) {
        const HealthAnswer h = health_();
        if (h.degraded) body = fmt::format("degraded: {}\n", h.detail);
      }
      start_answer(c, Answer(200, "OK", kTextPlain, body, head_only, close), close, now);
    } else if (api_ && target.substr(0, 5) == "/api/") {
      // As /metrics: answers to one target within page_max_age share one render, and the
      // buffer bound holds (a crowd of API clients that do not read costs one page).
      std::string key(target);
      if (api_pages.size() >= kMaxApiPages && api_pages.count(key) == 0) api_pages.clear();
      ApiPage& cached = api_pages[std::move(key)];
      if (!cached.page || now - cached.rendered >= options_.page_max_age) {
        ApiAnswer a = api_(target);
        cached.status = a.status;
        cached.page = std::make_shared<const std::string>(std::move(a.body));
        cached.rendered = now;
        make_room(cached.page->size(), &c);
      }
      std::string answer_head = Answer(cached.status, cached.status == 200 ? "OK" : "Not Found",
                                       kJson, std::string(), true, close);
      const std::string_view zero = "Content-Length: 0\r\n";
      answer_head.replace(answer_head.find(zero), zero.size(),
                          fmt::format("Content-Length: {}\r\n", cached.page->size()));
      start_answer(c, std::move(answer_head), close, now);
      if (!head_only) c.page = cached.page;
    } else {
      start_answer(c,
                   Answer(404, "Not Found", kTextPlain,
                          api_ ? "not found: fragscope serves /metrics, /api/v1/processes "
                                 "and /healthz\n"
                               : "not found: fragscope serves /metrics and /healthz\n",
                          head_only, close),
                   close, now);
    }
    return true;
  };

  // Sends what the socket takes now; returns false when the connection must close.
  auto write_some = [&](Connection& c, Clock::time_point now) {
    const std::size_t total = c.out.size() + (c.page ? c.page->size() : 0);
    while (c.sent < total) {
      const bool in_head = c.sent < c.out.size();
      const char* data = in_head ? c.out.data() + c.sent : c.page->data() + (c.sent - c.out.size());
      const std::size_t size = in_head ? c.out.size() - c.sent : total - c.sent;
      const ssize_t n = ::send(c.fd, data, size,
                               MSG_NOSIGNAL | MSG_DONTWAIT | (in_head && c.page ? MSG_MORE : 0));
      if (n > 0) {
        c.sent += static_cast<std::size_t>(n);
        c.progress = now;
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
      return false;
    }
    if (c.close_after) {
      // A lingering close: shutting our side first and discarding what the client still
      // sends lets it read the whole answer (a close() with unread input would reset the
      // connection and could destroy the answer in flight).
      ::shutdown(c.fd, SHUT_WR);
      c.writing = false;
      c.draining = true;
      c.in.clear();
      c.deadline = now + std::chrono::seconds(1);
      return true;
    }
    ready_for_request(c, now);
    // A pipelined request already here is answered at once.
    if (handle_request(c, now)) return true;
    return true;
  };

  while (!stop_) {
    fds.clear();
    fds.push_back({wake_fd_, POLLIN, 0});
    fds.push_back({listen_fd_, POLLIN, 0});
    Clock::time_point next_deadline = Clock::now() + std::chrono::seconds(1);
    for (const auto& [fd, c] : conns) {
      fds.push_back({fd, static_cast<short>(c.writing ? POLLOUT : POLLIN), 0});
      next_deadline = std::min(next_deadline, c.deadline);
    }
    const auto wait =
        std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now());
    const int ready = ::poll(fds.data(), fds.size(),
                             static_cast<int>(std::max<std::int64_t>(1, wait.count() + 1)));
    if (ready < 0 && errno != EINTR) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    Clock::time_point now = Clock::now();
    if (ready > 0) {
      // Existing connections first, so a request that has arrived is never the one evicted
      // to make room for a new connection.
      for (std::size_t i = 2; i < fds.size(); ++i) {
        if (fds[i].revents == 0) continue;
        auto it = conns.find(fds[i].fd);
        if (it == conns.end()) continue;
        Connection& c = it->second;
        bool keep = true;
        if (c.writing) {
          keep = write_some(c, now);
        } else if (c.draining) {
          const ssize_t n = ::recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
          keep = n > 0 || (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR));
        } else {
          const ssize_t n = ::recv(c.fd, chunk, sizeof(chunk), MSG_DONTWAIT);
          if (n > 0) {
            c.in.append(chunk, static_cast<std::size_t>(n));
            if (handle_request(c, now)) keep = write_some(c, now);
          } else if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            keep = false;
          }
        }
        if (!keep) close_conn(it);
      }
      if (fds[1].revents & POLLIN) {
        // A bounded batch per round, so the connections accepted in one round are never the
        // oldest waiting ones: a scraper's request is read before it could be evicted.
        const std::size_t batch = std::max<std::size_t>(1, options_.max_connections / 4);
        for (std::size_t accepted = 0; accepted < batch; ++accepted) {
          const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (fd < 0) break;
          ++accepted_;
          if (conns.size() >= options_.max_connections) {
            // Make room: the connection that has waited longest for a request that never came.
            auto oldest = conns.end();
            for (auto it = conns.begin(); it != conns.end(); ++it) {
              if (!it->second.writing &&
                  (oldest == conns.end() || it->second.ready_since < oldest->second.ready_since)) {
                oldest = it;
              }
            }
            // Every connection is being answered: the one that has gone longest without
            // taking a byte makes room (a scraper reads at once; a slow reader does not).
            if (oldest == conns.end()) oldest = most_stalled_writer(nullptr);
            if (oldest == conns.end()) {
              ::close(fd);
              continue;
            }
            ++evicted_;
            close_conn(oldest);
          }
          // What the kernel may hold for a client that does not read (no autotuning past it).
          ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &options_.send_buffer_bytes,
                       sizeof(options_.send_buffer_bytes));
          Connection c;
          c.fd = fd;
          ready_for_request(c, now);
          conns.emplace(fd, std::move(c));
        }
      }
    }
    now = Clock::now();
    for (auto it = conns.begin(); it != conns.end();) {
      Connection& c = it->second;
      if (now < c.deadline) {
        ++it;
        continue;
      }
      if (!c.writing && !c.in.empty()) {
        ++timed_out_;
        const std::string out =
            Answer(408, "Request Timeout", kTextPlain,
                   fmt::format("request not complete {} ms after the connection was ready for it\n",
                               options_.request_timeout.count()),
                   false, true);
        [[maybe_unused]] const ssize_t n =
            ::send(c.fd, out.data(), out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      }
      it = close_conn(it);
    }
  }
  for (auto it = conns.begin(); it != conns.end();) it = close_conn(it);
}

}  // namespace fragscope::sinks::prometheus
