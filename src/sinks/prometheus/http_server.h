// MetricsHttpServer: the exporter's HTTP endpoint (cpp-httplib). GET /metrics answers with
// the exposition a callback renders, GET /healthz with "ok", anything else 404. It binds the
// address it is given (127.0.0.1 by default in `fragscope serve`; never all interfaces
// unless the caller asks with the address) and serves from a small thread pool.
//
// Thread safety: Start/Stop from one thread; the callbacks run on the pool's threads and
// must be thread-safe.
#ifndef FRAGSCOPE_SINKS_PROMETHEUS_HTTP_SERVER_H_
#define FRAGSCOPE_SINKS_PROMETHEUS_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "fragscope/status.h"

namespace fragscope::sinks::prometheus {

struct HttpServerOptions {
  std::string host = "127.0.0.1";  // an IP address (IPv4 or IPv6), or a name that resolves
  int port = 9464;                 // 0: any free port (port() says which)
  int threads = 4;
};

class MetricsHttpServer {
 public:
  /// `render` returns the body of /metrics.
  MetricsHttpServer(HttpServerOptions options, std::function<std::string()> render);
  ~MetricsHttpServer();  // Stop()s
  MetricsHttpServer(const MetricsHttpServer&) = delete;
  MetricsHttpServer& operator=(const MetricsHttpServer&) = delete;

  /// Binds and starts serving; errors name the address.
  Status Start();
  void Stop();
  /// The bound port (after Start).
  int port() const { return port_; }

 private:
  struct Impl;
  HttpServerOptions options_;
  std::function<std::string()> render_;
  std::unique_ptr<Impl> impl_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace fragscope::sinks::prometheus

#endif  // FRAGSCOPE_SINKS_PROMETHEUS_HTTP_SERVER_H_
