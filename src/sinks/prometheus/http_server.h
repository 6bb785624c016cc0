// MetricsHttpServer: the exporter's HTTP endpoint. GET (or HEAD) /metrics answers with the
// exposition a callback renders, /healthz with the health callback's answer ("ok" without
// one), anything else 404. It binds the address it is given (127.0.0.1 by default in
// `fragscope serve`; never all interfaces unless the caller asks with the address).
//
// Built to stay answerable while any local user misbehaves against it: one thread polls every
// connection (non-blocking), so a slow client holds no thread. Each request must arrive whole
// within `request_timeout` of the moment its connection became ready for it (accepted, or the
// previous answer sent): bytes trickled in do not extend that deadline. Requests carry no body
// (one announced is refused with 413, never read) and their head is at most
// `max_request_bytes` (431). At most `max_connections` are open at once; when a new one
// arrives at the cap, the oldest connection still waiting for its request is closed to make
// room (a scraper's request arrives at once, so it is the slow clients that go). An answer
// must be taken by the client within `write_timeout`. Slow readers cannot lock scrapers out: the
// kernel buffers at most `send_buffer_bytes` per connection, the answers held for connections
// still being written pin at most `max_buffered_bytes` (pages are shared; beyond it, or when
// every slot is taken by a connection being answered, the writer that has gone longest
// without taking a byte is closed to make room). /metrics requests that arrive within
// `page_max_age` of a render share its page: a crowd of scrapes costs one render.
//
// Thread safety: Start/Stop from one thread; the callbacks run on the server thread, one at a
// time, and must be thread-safe with respect to the caller's other threads.
#ifndef FRAGSCOPE_SINKS_PROMETHEUS_HTTP_SERVER_H_
#define FRAGSCOPE_SINKS_PROMETHEUS_HTTP_SERVER_H_

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>

#include <sys/types.h>

#include "common/unix_socket.h"
#include "fragscope/status.h"

namespace fragscope::sinks::prometheus {

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // an IP address (IPv4 or IPv6), or a name that resolves
  int port = 9464;                 // 0: any free port (port() says which)
  /// Set: serve on this Unix domain socket instead of host:port (the daemon's API socket).
  /// Who may connect is the file's `unix_socket_mode`; the file is made and removed as
  /// common/unix_socket.h says (a stale socket replaced, a live one or another file refused).
  std::string unix_socket_path;
  mode_t unix_socket_mode = 0660;
  std::size_t max_connections = 64;
  std::chrono::milliseconds request_timeout{5000};
  std::chrono::milliseconds write_timeout{5000};
  std::size_t max_request_bytes = 8192;
  /// SO_SNDBUF of each connection: what the kernel holds for a client that does not read.
  int send_buffer_bytes = 256 * 1024;
  /// Bytes of answers held for connections being written (distinct pages counted once).
  std::size_t max_buffered_bytes = 64 << 20;
  /// /metrics requests within this long of a render share its page (one render, one copy);
  /// so a page is at most this old when it is sent.
  std::chrono::milliseconds page_max_age{250};
};

/// What /healthz says: "ok" (200), or "degraded: <detail>" (200: the daemon still serves; a
/// liveness probe must not restart it for a full disk).
struct HealthAnswer {
  bool degraded = false;
  std::string detail;
};

/// Cumulative counters of the server (read from any thread).
struct HttpServerStats {
  std::uint64_t connections_accepted = 0;
  std::uint64_t connections_evicted = 0;  // closed at the cap, or over the buffer bound
  std::uint64_t requests_timed_out = 0;   // request not whole by its deadline
  std::uint64_t requests_refused = 0;     // bad request, body, head too large
};

/// An answer of the API handler (MetricsHttpServer::set_api): a JSON body and its status.
struct ApiAnswer {
  int status = 200;
  std::string body;
};

class MetricsHttpServer {
 public:
  /// `render` returns the body of /metrics; `health` (optional) the state /healthz reports.
  MetricsHttpServer(HttpServerOptions options, std::function<std::string()> render,
                    std::function<HealthAnswer()> health = nullptr);
  ~MetricsHttpServer();  // Stop()s
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  /// Answers GET /api/... (the daemon's process API, docs/live-monitoring.md) with what
  /// `api` returns for the target (query string removed), as application/json. Under the same
  /// limits as /metrics. REQUIRES: called before Start().
  void set_api(std::function<ApiAnswer(std::string_view target)> api) { api_ = std::move(api); }
  /// Binds and starts serving; errors name the address (or the socket path).
  Status Start();
  void Stop();
  /// The bound port (after Start; 0 on a Unix socket).
  int port() const { return port_; }
  HttpServerStats stats() const;

 private:
  void Run();
  Status ListenTcp();    // binds options_.host:port into listen_fd_
  void CloseListener();  // closes listen_fd_ (a Unix socket's file removed)

  HttpServerOptions options_;
  std::function<std::string()> render_;
  std::function<HealthAnswer()> health_;
  std::function<ApiAnswer(std::string_view)> api_;
  int listen_fd_ = -1;          // the TCP socket, or unix_listener_'s
  UnixListener unix_listener_;  // open when serving on options_.unix_socket_path
  int wake_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::thread thread_;
  int port_ = 0;
  std::atomic<std::uint64_t> accepted_{0};
  std::atomic<std::uint64_t> evicted_{0};
  std::atomic<std::uint64_t> timed_out_{0};
  std::atomic<std::uint64_t> refused_{0};
};

}  // namespace fragscope::sinks::prometheus

#endif  // FRAGSCOPE_SINKS_PROMETHEUS_HTTP_SERVER_H_
