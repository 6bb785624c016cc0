// MetricsHttpServer (http_server.h) over cpp-httplib.
#include "sinks/prometheus/http_server.h"

#include <httplib.h>

#include <chrono>

#include <fmt/format.h>
#include <sys/socket.h>

#include "sinks/prometheus/exposition.h"

namespace fragscope::sinks::prometheus {

struct MetricsHttpServer::Impl {
  httplib::Server server;
};

MetricsHttpServer::MetricsHttpServer(HttpServerOptions options, std::function<std::string()> render)
    : options_(std::move(options)), render_(std::move(render)) {}

MetricsHttpServer::~MetricsHttpServer() { Stop(); }

Status MetricsHttpServer::Start() {
  if (impl_) return Status::Internal("MetricsHttpServer::Start called twice");
  impl_ = std::make_unique<Impl>();
  httplib::Server& server = impl_->server;
  const int threads = options_.threads < 1 ? 1 : options_.threads;
  server.new_task_queue = [threads] {
    return new httplib::ThreadPool(static_cast<std::size_t>(threads));
  };
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, which would let a second
  // daemon bind the same port and silently take half the scrapes.
  server.set_socket_options([](int sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server.set_keep_alive_max_count(100);
  server.set_read_timeout(5, 0);
  server.set_write_timeout(5, 0);
  server.set_payload_max_length(64 * 1024);
  // Served uncompressed: gzip of a 1 MB exposition (64 processes) costs ~25 ms of CPU per
  // scrape, more than the transfer it saves on loopback or a LAN, and it would make the scrape
  // latency target unreachable. cpp-httplib compresses whenever the client offers gzip (as
  // Prometheus does) and has no switch, so the offer is dropped before routing; the Request
  // it passes is its own non-const object.
  server.set_pre_routing_handler([](const httplib::Request& req, httplib::Response&) {
    const_cast<httplib::Request&>(req).headers.erase("Accept-Encoding");
    return httplib::Server::HandlerResponse::Unhandled;
  });
  server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(render_(), kContentType);
  });
  server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("ok\n", "text/plain; charset=utf-8");
  });
  server.set_error_handler([](const httplib::Request&, httplib::Response& res) {
    if (res.status == 404) {
      res.set_content("not found: fragscope serves /metrics and /healthz\n",
                      "text/plain; charset=utf-8");
    }
  });
  const std::string where = options_.host.find(':') != std::string::npos
                                ? fmt::format("[{}]:{}", options_.host, options_.port)
                                : fmt::format("{}:{}", options_.host, options_.port);
  if (options_.port == 0) {
    port_ = server.bind_to_any_port(options_.host);
    if (port_ <= 0) {
      impl_.reset();
      return Status::IoError(fmt::format("cannot listen on {} (any port)", options_.host));
    }
  } else {
    if (!server.bind_to_port(options_.host, options_.port)) {
      impl_.reset();
      return Status::IoError(
          fmt::format("cannot listen on {}: the address is in use or not local", where));
    }
    port_ = options_.port;
  }
  thread_ = std::thread([this] { impl_->server.listen_after_bind(); });
  // Wait until the accept loop runs: httplib's stop() does nothing before that, so a Stop()
  // right after Start() would otherwise leave the thread serving and join() waiting forever.
  for (int i = 0; i < 5000 && !impl_->server.is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!impl_->server.is_running()) {
    Stop();
    return Status::Internal(fmt::format("the HTTP server on {} did not start", where));
  }
  return Status::Ok();
}

void MetricsHttpServer::Stop() {
  if (!impl_) return;
  impl_->server.stop();
  if (thread_.joinable()) thread_.join();
  impl_.reset();
}

}  // namespace fragscope::sinks::prometheus
