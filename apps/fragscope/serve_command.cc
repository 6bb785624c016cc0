#include "serve_command.h"

#include <signal.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <tuple>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <sys/stat.h>

#include "cli_util.h"
#include "common/safe_file.h"
#include "common/units.h"
#include "common/unix_socket.h"
#include "history_command.h"
#include "serve_services.h"
#include "sinks/live/process_api.h"
#include "sinks/prometheus/exposition.h"
#include "sinks/prometheus/http_server.h"
#include "sinks/prometheus/textfile.h"
#include "sources/agent/agent_server.h"

#ifndef FRAGSCOPE_VERSION
#define FRAGSCOPE_VERSION "unknown"
#endif

namespace fragscope::cli {
namespace {

namespace prom = sinks::prometheus;

struct ServeFlags {
  std::string socket = "/run/fragscope/agent.sock";
  std::string socket_mode = "0660";
  std::string api_socket = "auto";  // "auto": next to --socket; "none": no API socket
  std::string api_socket_mode = "0660";
  std::string listen = "127.0.0.1:9464";
  std::string textfile_dir;
  std::string hostname;
  double interval_seconds = 5;
  double expiry_seconds = 60;
  double linger_seconds = 60;
  std::int64_t max_connections = 256;
  std::int64_t max_connections_per_uid = 128;
  std::int64_t max_series = 512;
  std::int64_t max_series_per_connection = 16;
  std::int64_t max_series_per_uid = 128;
  bool allow_uid_sidecars = false;
  double frame_timeout_seconds = 10;
  std::int64_t http_max_connections = 64;
  double http_request_timeout_seconds = 5;
  std::string max_message = "64KiB";
  std::string max_page = "6MiB";
  std::string history_max = "1GiB";
  std::string history_rate_per_uid = "128KiB";
  std::string history_rate = "512KiB";
  double max_rate = 50;
  double burst = 100;
  std::string nvml_lib;   // empty: libnvidia-ml.so.1, then libnvidia-ml.so
  std::string proc_root;  // empty: /proc/driver/nvidia
  std::string history;    // empty: the XDG default; "none": no history
  std::string alerts;     // alert rules (TOML); empty: none
  bool dry_run_hooks = false;
  bool no_forecast = false;
};

constexpr std::string_view kServeDescription =
    "Run the node daemon: agent socket in, Prometheus metrics out";

constexpr std::string_view kServeFooter =
    R"(In-process agents (python/fragscope_agent.py) send allocator samples to the Unix socket
(--socket; wire format in docs/formats.md, "Agent protocol"). The daemon keeps the latest
sample per process and device and serves them, with the node's GPU facts and its own
counters, at http://ADDRESS/metrics in Prometheus text format (docs/exporter.md lists every
metric), /healthz for liveness, and /api/v1/processes as JSON for `fragscope top` (the live
terminal view; docs/json-schema.md). With --textfile-dir it also writes DIR/fragscope.prom for
node_exporter's textfile collector every --interval (atomic replace through a new temporary
file; a symbolic link at DIR/fragscope.prom is refused, never written through).

A malformed, oversized or too-fast message closes that agent's connection and is counted
(fragscope_agent_samples_rejected_total{reason}); other agents are not disturbed. A process
that stays silent longer than --expiry leaves the metrics; one that disconnects (it exited,
perhaps of an OOM) keeps its last sample for --linger seconds, so a scrape sees its final
state, then leaves. No GPU or no
NVML is not an error: fragscope_nvml_available is 0 with the reason.

A sample that carries a step but no forecast level of its own gets the daemon's: the OOM
forecaster (docs/forecast.md, "In the daemon") follows each process and device from its
samples, against the memory the process may use (reserved + the driver's free memory, when the
agent sends device_free_bytes), and fills fragscope_process_forecast_level and
fragscope_process_steps_to_oom; moves into and out of warning are logged. --no-forecast
turns it off.

GPU facts come from NVML (--nvml-lib; kept open, retried once a minute while absent) joined with
/proc/driver/nvidia (--proc-root) by UUID (docs/gpu-sources.md).

Every accepted sample is also written to the history database (--history, default
$XDG_STATE_HOME/fragscope/history.sqlite; `--history none` turns it off), one transaction per
--interval, with bounded retention (docs/history.md). A damaged or foreign database is refused
at start (exit 2), never overwritten. A committed batch survives kill -9 of the daemon.

With --alerts FILE the rules in FILE (TOML, docs/alerts.md; check it first with `fragscope
alerts check FILE`) are evaluated every --interval against the latest samples and GPU facts;
firing and resolved alerts run their hooks (an executable with the alert as JSON on stdin, or
a webhook), rate-limited; --dry-run-hooks only logs what would be delivered.

Identity comes from the kernel: the daemon reads each agent connection's pid and UID with
SO_PEERCRED and records every sample under its sender's pid, whatever pid the sample names
(--allow-uid-sidecars: or under another live process of the sender's UID). So no local user
can make a series, an alert, a hook or a checkpoint request about another user's process.

No local user can starve the daemon: HTTP requests have a deadline (--http-request-timeout)
and connections a cap (--http-max-connections, the slowest make room); an agent frame must be
complete --agent-frame-timeout after its first byte; one UID may hold at most
--max-connections-per-uid connections; series are capped (--max-series,
--max-series-per-connection, --max-series-per-uid, a fair share per UID at the cap; the
excess is counted in fragscope_agent_series_dropped_total).
A read-only or full history is logged and shown on /healthz ("degraded: ..."). Every limit,
its default and its flag: docs/exporter.md, "Limits and safety".

The same HTTP API is also served on a Unix socket, --api-socket (default: next to --socket,
agent.sock -> agent.api.sock; none: no socket), for `fragscope top --socket`: only the users
its file mode admits (--api-socket-mode, default 0660) can connect, whereas any local user can
reach the TCP port. Same limits as the port, with connection slots of its own. So --listen
none is enough with an API socket (Prometheus scrapes it, or a local exporter relays it);
with neither that nor --textfile-dir the metrics would go nowhere, which is refused.

Stop with SIGINT or SIGTERM: the socket files are removed. Logs go to stderr, timestamped.

Examples:
  fragscope serve                                   # /run/fragscope/agent.sock, 127.0.0.1:9464
  fragscope serve --socket /tmp/fs.sock --listen 127.0.0.1:9500
  fragscope serve --listen none --textfile-dir /var/lib/node_exporter/textfile_collector
  fragscope serve --listen none --api-socket /run/fragscope/api.sock   # no TCP port at all
  fragscope serve --listen 0.0.0.0:9464             # all interfaces: only when asked
  curl -s http://127.0.0.1:9464/metrics | grep fragscope_process_largest_free_block_bytes

Exit status: 0 after SIGINT/SIGTERM; 2 bad usage; 1 the socket or the port could not be
opened (in use, no permission).)";

std::string Timestamp() {
  timespec ts{};
  clock_gettime(CLOCK_REALTIME, &ts);
  tm utc{};
  gmtime_r(&ts.tv_sec, &utc);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%S", &utc);
  return fmt::format("{}.{:03d}Z", buf, ts.tv_nsec / 1000000);
}

// One line per message: agents, NVML, the alert rules and paths put their strings in messages,
// so control characters, newlines included, are escaped (common/terminal_text.h).
void Log(std::string_view message) {
  std::string line = fmt::format("{} fragscope serve: ", Timestamp());
  AppendTerminalSafe(message, TerminalEscape::kField, &line);
  line += '\n';
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
}

// Agent rejections are logged at most this many times per interval; the rest are counted and
// summarised (the counters in /metrics are exact either way).
constexpr int kLogBudgetPerInterval = 20;

// "127.0.0.1:9464", "[::1]:9464" -> host, port. "none" -> no HTTP server.
bool ParseListen(const std::string& text, std::string* host, int* port) {
  std::string port_text;
  if (!text.empty() && text[0] == '[') {
    const auto close = text.find(']');
    if (close == std::string::npos || close + 1 >= text.size() || text[close + 1] != ':') {
      return false;
    }
    *host = text.substr(1, close - 1);
    port_text = text.substr(close + 2);
  } else {
    const auto colon = text.rfind(':');
    if (colon == std::string::npos || text.find(':') != colon) return false;
    *host = text.substr(0, colon);
    port_text = text.substr(colon + 1);
  }
  if (host->empty() || port_text.empty() || port_text.size() > 5) return false;
  for (char c : port_text) {
    if (c < '0' || c > '9') return false;
  }
  *port = std::stoi(port_text);
  return *port <= 65535;
}

// The API socket's path: --api-socket, or for "auto" the agent socket's with ".sock" made
// ".api.sock" (".api.sock" added when it has no ".sock"), so each daemon's pair sits together;
// empty for "none", and for "auto" when that path would not fit a socket address.
std::string ApiSocketPath(const ServeFlags& flags) {
  if (flags.api_socket == "none") return "";
  if (flags.api_socket != "auto") return flags.api_socket;
  constexpr std::string_view kSuffix = ".sock";
  std::string_view stem = flags.socket;
  if (stem.size() > kSuffix.size() && stem.ends_with(kSuffix)) stem.remove_suffix(kSuffix.size());
  const std::string path = fmt::format("{}.api.sock", stem);
  return path.size() <= MaxUnixSocketPath() ? path : "";
}

std::string Hostname() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

double UnixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

class Daemon {
 public:
  Daemon(const ServeFlags& flags, ServeHooks hooks)
      : flags_(flags),
        hooks_(std::move(hooks)),
        start_time_(UnixSeconds()),
        registry_(agent::SeriesLimits{
            static_cast<std::size_t>(flags.max_series),
            static_cast<std::size_t>(flags.max_series_per_connection),
            std::chrono::milliseconds(static_cast<std::int64_t>(flags.linger_seconds * 1000)),
            static_cast<std::size_t>(flags.max_series_per_uid)}) {
    hostname_ = flags.hostname.empty() ? Hostname() : flags.hostname;
    if (!hooks_.gpu_provider) {
      hooks_.gpu_provider = [] {
        gpu::NodeGpuInfo info;
        info.nvml_unavailable_reason = "NVML collector not built yet";
        return info;
      };
    }
    gpus_ = std::make_shared<const gpu::NodeGpuInfo>();
  }

  agent::AgentRegistry& registry() { return registry_; }

  void RefreshGpus() {
    auto info = std::make_shared<const gpu::NodeGpuInfo>(hooks_.gpu_provider());
    const std::string& reason = info->nvml_unavailable_reason;
    if (reason != last_nvml_reason_) {
      if (reason.empty()) {
        Log(fmt::format("NVML available: {} GPU(s), driver {}", info->gpus.size(),
                        info->driver_version));
      } else {
        Log(fmt::format("NVML unavailable ({}); serving agent samples without NVML facts", reason));
      }
      last_nvml_reason_ = reason;
    }
    std::lock_guard<std::mutex> lock(gpus_mu_);
    gpus_ = std::move(info);
  }

  std::string Render() {
    const auto begin = std::chrono::steady_clock::now();
    prom::NodeState state;
    state.hostname = hostname_;
    {
      std::lock_guard<std::mutex> lock(gpus_mu_);
      state.gpus = *gpus_;
    }
    state.agents = registry_.Entries();
    state.max_process_bytes = max_page_bytes_;
    state.daemon.agents = registry_.Counters();
    state.daemon.version = FRAGSCOPE_VERSION;
    state.daemon.start_time_seconds = start_time_;
    state.daemon.textfile_writes = textfile_writes_.load();
    state.daemon.textfile_write_errors = textfile_errors_.load();
    state.daemon.history_samples_dropped = history_ ? history_->dropped_total() : 0;
    for (const auto& server : http_) {
      const prom::MetricsHttpServer* http = server.load();
      if (http == nullptr) continue;
      const prom::HttpServerStats h = http->stats();
      state.daemon.http_connections_evicted += h.connections_evicted;
      state.daemon.http_requests_timed_out += h.requests_timed_out;
      state.daemon.http_requests_refused += h.requests_refused;
    }
    state.daemon.collect_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    return prom::RenderExposition(state);
  }

  // The process API (sinks/live/process_api.h) for `fragscope top`; on the HTTP thread.
  prom::ApiAnswer Api(std::string_view target) {
    const auto now_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    return sinks::live::AnswerProcessApi(target, registry_.Views(), hostname_, now_ms);
  }

  void WriteTextfile() {
    if (flags_.textfile_dir.empty()) return;
    Status status = prom::WriteTextfile(flags_.textfile_dir, Render());
    if (status.ok()) {
      ++textfile_writes_;
    } else {
      ++textfile_errors_;
      Log(fmt::format("textfile: {}", status.message()));
    }
  }

  void Tick() {
    RefreshGpus();
    WriteTextfile();
    if (hooks_.on_tick) hooks_.on_tick(registry_);
    // Samples left out at the series limits: one line per interval, however many.
    const std::uint64_t dropped = registry_.Counters().series_dropped;
    if (dropped > series_dropped_logged_) {
      Log(
          fmt::format("{} sample(s) of new series dropped at the series limits (--max-series {}, "
                      "--max-series-per-connection {}, --max-series-per-uid {}; "
                      "fragscope_agent_series_dropped_total)",
                      dropped - series_dropped_logged_, flags_.max_series,
                      flags_.max_series_per_connection, flags_.max_series_per_uid));
      series_dropped_logged_ = dropped;
    }
    const int suppressed = suppressed_logs_.exchange(0);
    log_budget_ = kLogBudgetPerInterval;
    if (suppressed > 0) {
      Log(
          fmt::format("{} more agent connection(s) closed for protocol errors (not logged; see "
                      "fragscope_agent_samples_rejected_total)",
                      suppressed));
    }
  }

  void AgentLog(std::string_view message) {
    if (log_budget_.fetch_sub(1) > 0) {
      Log(message);
    } else {
      ++suppressed_logs_;
    }
  }

  const ServeHooks& hooks() const { return hooks_; }
  // REQUIRES: called before any thread that may call Render() starts.
  void set_max_page_bytes(std::size_t bytes) { max_page_bytes_ = bytes; }
  // REQUIRES: called before any thread that may call Render() starts; `recorder` outlives it.
  void set_history(const SampleRecorder* recorder) { history_ = recorder; }
  // The HTTP servers (--listen, --api-socket) whose counters Render() adds up; null before
  // they exist and after they stop.
  void set_http(const prom::MetricsHttpServer* tcp, const prom::MetricsHttpServer* api) {
    http_[0] = tcp;
    http_[1] = api;
  }

 private:
  const ServeFlags& flags_;
  ServeHooks hooks_;
  double start_time_;
  std::string hostname_;
  agent::AgentRegistry registry_;
  std::mutex gpus_mu_;
  std::shared_ptr<const gpu::NodeGpuInfo> gpus_;
  std::string last_nvml_reason_ = "(not yet asked)";
  std::atomic<std::uint64_t> textfile_writes_{0};
  std::atomic<std::uint64_t> textfile_errors_{0};
  const SampleRecorder* history_ = nullptr;  // null: no --history
  std::size_t max_page_bytes_ = 0;
  std::atomic<const prom::MetricsHttpServer*> http_[2] = {nullptr, nullptr};
  std::atomic<int> log_budget_{kLogBudgetPerInterval};
  std::atomic<int> suppressed_logs_{0};
  std::uint64_t series_dropped_logged_ = 0;  // main thread only
};

int RunServe(const ServeFlags& flags, const ServeHooks& given_hooks) {
  std::string host;
  int port = 0;
  const bool http = flags.listen != "none";
  if (http && !ParseListen(flags.listen, &host, &port)) {
    return BadInput(fmt::format(
        "--listen {}: expected HOST:PORT (127.0.0.1:9464, [::1]:9464) or none", flags.listen));
  }
  if (!flags.textfile_dir.empty()) {
    struct stat st = {};
    if (stat(flags.textfile_dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
      return BadInput(
          fmt::format("--textfile-dir {}: not an existing directory", flags.textfile_dir));
    }
    // The file name inside DIR is the daemon's choice: a link there is never written through
    // (common/safe_file.h); say so now rather than once per interval.
    if (Status s = RefuseLinkOrSpecial(
            fmt::format("{}/{}", flags.textfile_dir, prom::kTextfileName), "--textfile-dir:");
        !s.ok()) {
      return BadInput(s.message() +
                      "; refusing it: the daemon never writes through a link there (remove it)");
    }
  }
  mode_t mode = 0;
  mode_t api_mode = 0;
  for (const auto& [name, text, out] :
       {std::tuple{"--socket-mode", flags.socket_mode, &mode},
        std::tuple{"--api-socket-mode", flags.api_socket_mode, &api_mode}}) {
    char* end = nullptr;
    const unsigned long m = std::strtoul(text.c_str(), &end, 8);
    if (text.empty() || *end != '\0' || m > 0777) {
      return BadInput(fmt::format("{} {}: expected an octal mode like 0660", name, text));
    }
    *out = static_cast<mode_t>(m);
  }
  const std::string api_socket = ApiSocketPath(flags);
  // Three sinks serve the metrics: the port, the API socket (its /metrics too) and the
  // textfile. Any one is enough.
  if (!http && api_socket.empty() && flags.textfile_dir.empty()) {
    return BadInput(fmt::format(
        "--listen none with no API socket ({}) and no --textfile-dir: the metrics would go "
        "nowhere; give --listen HOST:PORT, --api-socket PATH or --textfile-dir DIR",
        flags.api_socket == "none"
            ? "--api-socket none"
            : fmt::format("--api-socket auto: the path next to --socket would be over {} bytes",
                          MaxUnixSocketPath())));
  }
  if (!api_socket.empty() && api_socket == flags.socket) {
    return BadInput(
        fmt::format("--api-socket {}: the agent socket (--socket) is there; give the "
                    "API its own path",
                    api_socket));
  }
  Result<std::uint64_t> max_message = ParseSize(flags.max_message);
  if (!max_message.ok() || *max_message < 64 || *max_message > agent::kMaxFrameBytesCeiling) {
    return BadInput(fmt::format("--max-message-bytes {}: expected a size from 64 B to 16 MiB",
                                flags.max_message));
  }

  auto size_flag = [](const std::string& name, const std::string& text, std::uint64_t least,
                      std::uint64_t* out) {
    Result<std::uint64_t> v = ParseSize(text);
    if (!v.ok() || *v < least) {
      return fmt::format("{} {}: expected a size of at least {} bytes (64KiB, 1GiB, ...)", name,
                         text, least);
    }
    *out = *v;
    return std::string();
  };
  std::uint64_t max_page = 0;
  HistoryLimits history_limits;
  for (const auto& [name, text, least, out] :
       {std::tuple{"--max-page-bytes", flags.max_page, std::uint64_t{64 << 10}, &max_page},
        std::tuple{"--history-max-bytes", flags.history_max, std::uint64_t{1 << 20},
                   &history_limits.max_bytes},
        std::tuple{"--history-rate-per-uid", flags.history_rate_per_uid, std::uint64_t{1 << 10},
                   &history_limits.bytes_per_second_per_uid},
        std::tuple{"--history-rate", flags.history_rate, std::uint64_t{1 << 10},
                   &history_limits.bytes_per_second}}) {
    if (std::string problem = size_flag(name, text, least, out); !problem.empty()) {
      return BadInput(problem);
    }
  }

  // The node services, before any thread starts: a bad --alerts file or a damaged history is
  // a usage error, reported before the socket is taken.
  ServeHooks hooks = given_hooks;
  std::unique_ptr<SampleRecorder> recorder;
  std::string history_unavailable;  // set: the history could not be opened for writing
  if (flags.history != "none") {
    Result<std::string> path = HistoryPath(flags.history);
    if (!path.ok()) return BadInput("--history: " + path.status().message());
    Result<std::unique_ptr<SampleRecorder>> opened =
        SampleRecorder::Open(*path, Log, history_limits);
    if (opened.ok()) {
      recorder = std::move(*opened);
    } else if (std::string problem = HistoryWriteProblem(*path); !problem.empty()) {
      // A history that cannot be opened because its file system will not take writes is not
      // a damaged one: the daemon serves without it, degraded, and says so (log, /healthz).
      history_unavailable = fmt::format("{}: {} ({})", *path, problem, opened.status().message());
    } else {
      return BadInput("--history: " + opened.status().message());
    }
  }
  std::unique_ptr<AlertService> alerts;
  if (!flags.alerts.empty()) {
    Result<std::unique_ptr<AlertService>> opened =
        AlertService::Open(flags.alerts, flags.dry_run_hooks,
                           flags.hostname.empty() ? Hostname() : flags.hostname, Log);
    if (!opened.ok()) return BadInput("--alerts: " + opened.status().message());
    alerts = std::move(*opened);
  } else if (flags.dry_run_hooks) {
    return BadInput("--dry-run-hooks needs --alerts FILE");
  }
  // The GPU facts the last tick saw, for the alert rules (main thread only).
  auto last_gpus = std::make_shared<gpu::NodeGpuInfo>();
  std::unique_ptr<GpuSource> gpu_source;
  if (!hooks.gpu_provider) {
    gpu_source = std::make_unique<GpuSource>(flags.nvml_lib, flags.proc_root);
    hooks.gpu_provider = [source = gpu_source.get()] { return source->Collect(); };
  }
  hooks.gpu_provider = [provider = std::move(hooks.gpu_provider), last_gpus] {
    *last_gpus = provider();
    return *last_gpus;
  };
  if (recorder) {
    hooks.on_sample = [next = std::move(hooks.on_sample),
                       r = recorder.get()](const agent::AgentSample& s) {
      r->Add(s);
      if (next) next(s);
    };
  }
  if (recorder || alerts) {
    hooks.on_tick = [next = std::move(hooks.on_tick), r = recorder.get(), a = alerts.get(),
                     last_gpus](const agent::AgentRegistry& registry) {
      if (r) r->Flush();
      if (a) a->Evaluate(registry, *last_gpus);
      if (next) next(registry);
    };
  }

  // SIGINT/SIGTERM are taken synchronously by the main thread (sigtimedwait below); blocking
  // them before any thread starts makes every thread inherit the mask.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  Daemon daemon(flags, hooks);
  daemon.set_history(recorder.get());
  daemon.set_max_page_bytes(static_cast<std::size_t>(max_page));
  Log(fmt::format("fragscope {} starting on host {}", FRAGSCOPE_VERSION,
                  flags.hostname.empty() ? Hostname() : flags.hostname));
  daemon.RefreshGpus();

  agent::AgentServerOptions agent_options;
  agent_options.socket_path = flags.socket;
  agent_options.socket_mode = mode;
  agent_options.max_frame_bytes = static_cast<std::size_t>(*max_message);
  agent_options.max_connections = static_cast<std::size_t>(flags.max_connections);
  agent_options.max_connections_per_uid = static_cast<std::size_t>(flags.max_connections_per_uid);
  agent_options.frame_timeout =
      std::chrono::milliseconds(static_cast<std::int64_t>(flags.frame_timeout_seconds * 1000));
  agent_options.allow_uid_sidecars = flags.allow_uid_sidecars;
  agent_options.max_samples_per_second = flags.max_rate;
  agent_options.burst = flags.burst;
  agent_options.expiry =
      std::chrono::milliseconds(static_cast<std::int64_t>(flags.expiry_seconds * 1000));
  agent_options.on_sample = daemon.hooks().on_sample;
  std::unique_ptr<ProcessForecasts> forecasts;
  if (!flags.no_forecast) {
    forecasts =
        std::make_unique<ProcessForecasts>([&daemon](std::string_view m) { daemon.AgentLog(m); });
    agent_options.prepare = [f = forecasts.get()](agent::AgentSample& s) { f->Prepare(s); };
  }
  agent_options.log = [&daemon](std::string_view m) { daemon.AgentLog(m); };
  agent::AgentServer agents(agent_options, &daemon.registry());
  if (Status s = agents.Start(); !s.ok()) {
    Log(s.message());
    return s.code() == StatusCode::kInvalidArgument &&
                   s.message().find("in use") == std::string::npos
               ? kExitBadInput
               : kExitFailure;
  }
  Log(fmt::format("agent socket {} (mode {:04o}), max {} connections, {} samples/s each",
                  flags.socket, mode, flags.max_connections, flags.max_rate));

  // The HTTP endpoints: the API socket (--api-socket) first, so it accepts by the time the
  // "metrics on" line says the daemon is up; then --listen. Both under the same limits, each
  // with its own connection slots, so a crowd on the TCP port cannot crowd out the socket.
  prom::HttpServerOptions http_options;
  http_options.host = host;
  http_options.port = port;
  http_options.max_connections = static_cast<std::size_t>(flags.http_max_connections);
  http_options.request_timeout = std::chrono::milliseconds(
      static_cast<std::int64_t>(flags.http_request_timeout_seconds * 1000));
  http_options.write_timeout =
      std::max(http_options.request_timeout, std::chrono::milliseconds(5000));
  const auto health = [r = recorder.get(), &history_unavailable] {
    prom::HealthAnswer answer;
    if (!history_unavailable.empty()) {
      answer.detail = "history " + history_unavailable;
    } else if (r) {
      if (std::string problem = r->problem(); !problem.empty()) {
        answer.detail = fmt::format("history {}: {}", r->path(), problem);
      }
    }
    answer.degraded = !answer.detail.empty();
    return answer;
  };
  const auto make_server = [&daemon, &health](prom::HttpServerOptions options) {
    auto server = std::make_unique<prom::MetricsHttpServer>(
        std::move(options), [&daemon] { return daemon.Render(); }, health);
    server->set_api([&daemon](std::string_view target) { return daemon.Api(target); });
    return server;
  };
  std::unique_ptr<prom::MetricsHttpServer> api_server;
  if (!api_socket.empty()) {
    prom::HttpServerOptions api_options = http_options;
    api_options.unix_socket_path = api_socket;
    api_options.unix_socket_mode = api_mode;
    api_server = make_server(std::move(api_options));
    if (Status s = api_server->Start(); !s.ok()) {
      Log(s.message());
      agents.Stop();
      return s.code() == StatusCode::kInvalidArgument &&
                     s.message().find("in use") == std::string::npos
                 ? kExitBadInput
                 : kExitFailure;
    }
    Log(fmt::format("API socket {} (mode {:04o}): /api/v1/processes for `fragscope top --socket`",
                    api_socket, api_mode));
  } else if (flags.api_socket == "auto") {
    Log(fmt::format("no API socket: the path next to {} would be over {} bytes (--api-socket)",
                    flags.socket, MaxUnixSocketPath()));
  }
  std::unique_ptr<prom::MetricsHttpServer> server;
  if (http) {
    server = make_server(http_options);
    if (Status s = server->Start(); !s.ok()) {
      Log(s.message());
      if (api_server) api_server->Stop();
      agents.Stop();
      return kExitFailure;
    }
    const std::string shown = host.find(':') != std::string::npos
                                  ? fmt::format("[{}]:{}", host, server->port())
                                  : fmt::format("{}:{}", host, server->port());
    Log(fmt::format("metrics on http://{}/metrics", shown));
  }
  daemon.set_http(server.get(), api_server.get());
  if (!flags.textfile_dir.empty()) {
    Log(fmt::format("textfile {}/{} every {} s", flags.textfile_dir, prom::kTextfileName,
                    flags.interval_seconds));
  }
  if (!history_unavailable.empty()) {
    Log(fmt::format("history DEGRADED, samples will not be recorded: {} (/healthz says so)",
                    history_unavailable));
  }
  if (recorder) {
    const std::string problem = recorder->problem();
    Log(problem.empty() ? fmt::format("history {}", recorder->path())
                        : fmt::format("history {}: DEGRADED, samples will not be recorded: {} "
                                      "(/healthz says so until a write succeeds)",
                                      recorder->path(), problem));
  }
  if (alerts) {
    Log(fmt::format("alerts: {} rule(s) from {}{}", alerts->rules(), flags.alerts,
                    flags.dry_run_hooks ? " (dry run: hooks are only logged)" : ""));
  }
  daemon.WriteTextfile();

  const auto interval = std::chrono::duration_cast<std::chrono::nanoseconds>(
      std::chrono::duration<double>(flags.interval_seconds));
  auto next_tick = std::chrono::steady_clock::now() + interval;
  int signal_number = 0;
  for (;;) {
    const auto wait =
        std::max(std::chrono::nanoseconds(0), std::chrono::duration_cast<std::chrono::nanoseconds>(
                                                  next_tick - std::chrono::steady_clock::now()));
    timespec ts{static_cast<time_t>(wait.count() / 1000000000),
                static_cast<long>(wait.count() % 1000000000)};
    siginfo_t info{};
    const int sig = sigtimedwait(&stop_signals, &info, &ts);
    if (sig == SIGINT || sig == SIGTERM) {
      signal_number = sig;
      break;
    }
    if (std::chrono::steady_clock::now() >= next_tick) {
      daemon.Tick();
      next_tick += interval;
      if (next_tick < std::chrono::steady_clock::now()) {
        next_tick = std::chrono::steady_clock::now() + interval;
      }
    }
  }
  Log(fmt::format("{} received, shutting down", signal_number == SIGINT ? "SIGINT" : "SIGTERM"));
  daemon.set_http(nullptr, nullptr);
  if (server) server->Stop();
  if (api_server) api_server->Stop();
  agents.Stop();
  if (recorder) {
    recorder->Flush();  // what arrived since the last tick
    Log(fmt::format("history: {} samples written to {}", recorder->written(), recorder->path()));
  }
  // A textfile left behind would keep telling node_exporter the daemon is up; remove it
  // (node_exporter then stops publishing the series, as Prometheus does for a dead target).
  // Only a file of ours: a link planted there meanwhile is left alone.
  if (!flags.textfile_dir.empty()) {
    const std::string textfile = fmt::format("{}/{}", flags.textfile_dir, prom::kTextfileName);
    struct stat st = {};
    if (lstat(textfile.c_str(), &st) == 0 && S_ISREG(st.st_mode)) std::remove(textfile.c_str());
  }
  const agent::AgentCounters c = daemon.registry().Counters();
  std::uint64_t rejected = 0;
  for (std::uint64_t r : c.rejected) rejected += r;
  Log(fmt::format("stopped: {} samples received, {} rejected, {} connections", c.samples_received,
                  rejected, c.connections_accepted));
  return kExitOk;
}

}  // namespace

Command AddServeCommand(CLI::App& app, ServeHooks hooks) {
  auto flags = std::make_shared<ServeFlags>();
  CLI::App* sub = app.add_subcommand("serve", std::string(kServeDescription));
  sub->footer(std::string(kServeFooter));
  sub->add_option("--socket", flags->socket, "Agent socket path (its folder is created)")
      ->capture_default_str();
  sub->add_option("--socket-mode", flags->socket_mode,
                  "Permissions of the socket file, octal (who may send samples)")
      ->capture_default_str();
  sub->add_option("--api-socket", flags->api_socket,
                  "Unix socket serving the same HTTP API as --listen (/api/v1/processes, "
                  "/metrics, /healthz) for `fragscope top --socket`: a path, auto (next to "
                  "--socket: agent.sock -> agent.api.sock) or none")
      ->type_name("PATH")
      ->capture_default_str();
  sub->add_option("--api-socket-mode", flags->api_socket_mode,
                  "Permissions of the API socket file, octal (who may read the processes)")
      ->capture_default_str();
  sub->add_option("--listen", flags->listen,
                  "HTTP address for /metrics, /healthz and /api/v1/processes: HOST:PORT, "
                  "[V6]:PORT, port 0 for any free port, or none")
      ->capture_default_str();
  sub->add_option("--textfile-dir", flags->textfile_dir,
                  "Also write DIR/fragscope.prom for node_exporter every --interval");
  sub->add_option("--interval", flags->interval_seconds,
                  "Seconds between GPU refreshes and textfile writes")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  sub->add_option("--expiry", flags->expiry_seconds,
                  "Seconds of silence after which a process's series and connection are dropped")
      ->capture_default_str()
      ->check(CLI::Range(0.1, 86400.0));
  sub->add_option("--linger", flags->linger_seconds,
                  "Seconds a disconnected process's last sample stays on /metrics (longer than "
                  "the scrape interval, so its final state is scraped); 0: it leaves at once")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 86400.0));
  sub->add_option("--max-connections", flags->max_connections,
                  "Agent connections at once; more are refused")
      ->capture_default_str()
      ->check(IntegerAtLeast(1));
  sub->add_option("--max-connections-per-uid", flags->max_connections_per_uid,
                  "Agent connections one user (UID, from the socket's peer credentials) may hold "
                  "at once; more are refused")
      ->capture_default_str()
      ->check(IntegerAtLeast(1));
  sub->add_option("--max-series", flags->max_series,
                  "Process x device series kept at once; samples that would add more are "
                  "dropped and counted")
      ->capture_default_str()
      ->check(IntegerAtLeast(1));
  sub->add_option("--max-series-per-connection", flags->max_series_per_connection,
                  "Series one agent connection may add; more are dropped and counted")
      ->capture_default_str()
      ->check(IntegerAtLeast(1));
  sub->add_option("--max-series-per-uid", flags->max_series_per_uid,
                  "Series one user (UID, from the socket's peer credentials) may hold, lingering "
                  "ones included; at --max-series each UID keeps its fair share")
      ->capture_default_str()
      ->check(IntegerAtLeast(1));
  sub->add_flag("--allow-uid-sidecars", flags->allow_uid_sidecars,
                "Let a process report for other live processes of its own UID (a sidecar); "
                "without it every sample is recorded under its sender's pid");
  sub->add_option("--agent-frame-timeout", flags->frame_timeout_seconds,
                  "Seconds within which an agent frame must be complete after its first byte; "
                  "a slower one closes the connection")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  sub->add_option("--http-max-connections", flags->http_max_connections,
                  "HTTP connections open at once; at the cap the oldest one still waiting for "
                  "its request is closed")
      ->capture_default_str()
      ->check(IntegerAtLeast(1));
  sub->add_option("--http-request-timeout", flags->http_request_timeout_seconds,
                  "Seconds within which an HTTP request must arrive whole (trickled bytes do "
                  "not extend it)")
      ->capture_default_str()
      ->check(CLI::Range(0.05, 3600.0));
  sub->add_option("--max-message-bytes", flags->max_message,
                  "Largest agent frame (64 B .. 16 MiB); larger closes the connection")
      ->capture_default_str();
  sub->add_option("--max-rate", flags->max_rate,
                  "Samples per second one connection may send (token bucket refill)")
      ->capture_default_str()
      ->check(CLI::Range(0.01, 1e6));
  sub->add_option("--burst", flags->burst, "Token bucket size: samples sent back to back")
      ->capture_default_str()
      ->check(CLI::Range(1.0, 1e6));
  sub->add_option("--max-page-bytes", flags->max_page,
                  "Bound on the process series of a /metrics page; each UID gets an equal share "
                  "and a series beyond its UID's share is left out (counted)")
      ->capture_default_str();
  sub->add_option("--history-max-bytes", flags->history_max,
                  "Size of the agent samples the history keeps; the oldest go first")
      ->capture_default_str();
  sub->add_option("--history-rate-per-uid", flags->history_rate_per_uid,
                  "Bytes per second one user's samples may add to the history (5 s burst)")
      ->capture_default_str();
  sub->add_option("--history-rate", flags->history_rate,
                  "Bytes per second all samples together may add to the history (5 s burst)")
      ->capture_default_str();
  sub->add_option("--hostname", flags->hostname,
                  "Hostname label value (default: this machine's hostname)");
  sub->add_option("--nvml-lib", flags->nvml_lib,
                  "NVML library to load (default: libnvidia-ml.so.1, then libnvidia-ml.so)")
      ->type_name("PATH");
  sub->add_option("--proc-root", flags->proc_root,
                  "Where the NVIDIA driver's proc files are (default: /proc/driver/nvidia)")
      ->type_name("DIR");
  sub->add_option("--history", flags->history,
                  "History database for agent samples (default: "
                  "$XDG_STATE_HOME/fragscope/history.sqlite), or none")
      ->type_name("PATH");
  sub->add_option("--alerts", flags->alerts, "Alert rules and hooks (TOML, docs/alerts.md)")
      ->type_name("FILE");
  sub->add_flag("--dry-run-hooks", flags->dry_run_hooks,
                "Log the alerts' deliveries instead of running hooks and webhooks");
  sub->add_flag("--no-forecast", flags->no_forecast,
                "Do not forecast OOMs for agents that send no forecast of their own (their "
                "forecast level then stays unknown)");
  return {sub, [flags, hooks = std::move(hooks)] { return RunServe(*flags, hooks); }};
}

}  // namespace fragscope::cli
