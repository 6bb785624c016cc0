// The parts `fragscope serve` plugs into its ServeHooks (serve_command.h): the node's GPU facts
// (NVML kept open, joined with /proc/driver/nvidia), the history of agent samples (SQLite,
// batched per interval), and the alert rules with their hooks. Wiring only: each part is a
// thin owner of a library object from sources/ or sinks/.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_SERVE_SERVICES_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_SERVE_SERVICES_H_

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/live_forecast.h"
#include "fragscope/status.h"
#include "sinks/alerts/alert_config.h"
#include "sinks/alerts/alert_engine.h"
#include "sinks/alerts/hook_runner.h"
#include "sinks/history/history_store.h"
#include "sources/agent/agent_registry.h"
#include "sources/agent/agent_sample.h"
#include "sources/gpu/gpu_info.h"
#include "sources/gpu/nvidia_procfs.h"
#include "sources/gpu/nvml_collector.h"

namespace fragscope::cli {

using LogFn = std::function<void(std::string_view)>;

/// NVML (opened once, reopened at most once a minute while it is unavailable) joined with
/// /proc/driver/nvidia. Main thread only.
class GpuSource {
 public:
  /// Empty `nvml_lib`/`proc_root`: the defaults (libnvidia-ml.so.1, /proc/driver/nvidia).
  GpuSource(const std::string& nvml_lib, const std::string& proc_root);
  ~GpuSource();
  gpu::NodeGpuInfo Collect();

 private:
  gpu::NvmlOptions nvml_options_;
  gpu::ProcfsOptions procfs_options_;
  std::unique_ptr<gpu::NvmlCollector> nvml_;
  std::string nvml_reason_;
  std::chrono::steady_clock::time_point next_open_{};
};

/// Agent samples into the history: Add() from the agent server's thread queues a sample;
/// Flush() (the daemon's tick, and at shutdown) writes the queue in one transaction.
/// Why the history at `path` cannot take writes, judged from the file system alone (read-only
/// mount, less than 4 MiB free, no write permission on the file or its folder); empty if it
/// can.
std::string HistoryWriteProblem(const std::string& path);

/// What the daemon may write to the history (docs/history.md): bytes per second per UID (the
/// sender's, from the kernel) and in total, each a token bucket holding 5 s of its rate, and
/// the size retention keeps (HistoryStore's SampleRetention::max_bytes).
struct HistoryLimits {
  std::uint64_t bytes_per_second_per_uid = 128 << 10;
  std::uint64_t bytes_per_second = 512 << 10;
  std::uint64_t max_bytes = std::uint64_t{1} << 30;
};

class SampleRecorder {
 public:
  static Result<std::unique_ptr<SampleRecorder>> Open(const std::string& path, LogFn log,
                                                      HistoryLimits limits = {});
  void Add(const agent::AgentSample& sample);
  void Flush();
  const std::string& path() const { return store_->path(); }
  std::uint64_t written() const { return written_; }
  /// Samples Add() turned away since Open() because the queue was full (any thread).
  std::uint64_t dropped_total() const { return dropped_total_.load(); }
  /// Why the history cannot take samples now (read-only, disk full, the last write's error),
  /// or empty when it can. Set at Open() from the file system's state and by every Flush()
  /// (a successful write clears it). Any thread.
  std::string problem() const;

 private:
  SampleRecorder(std::unique_ptr<sinks::HistoryStore> store, LogFn log, HistoryLimits limits)
      : store_(std::move(store)), log_(std::move(log)), limits_(limits) {}
  struct Bucket {
    double tokens = 0;
    std::chrono::steady_clock::time_point refilled;
  };
  // Takes `bytes` from the bucket refilled at `rate`/s (holding 5 s of it); false if short.
  static bool Take(Bucket& b, double rate, double bytes, std::chrono::steady_clock::time_point now);
  std::unique_ptr<sinks::HistoryStore> store_;
  LogFn log_;
  HistoryLimits limits_;
  std::mutex mu_;
  Bucket total_;                              // guarded by mu_
  std::map<std::uint32_t, Bucket> per_uid_;   // guarded by mu_
  std::uint64_t rate_dropped_ = 0;            // since the last Flush(); guarded by mu_
  std::vector<sinks::ReceivedSample> queue_;  // guarded by mu_
  std::uint64_t written_ = 0;
  std::uint64_t dropped_ = 0;  // since the last Flush(), for its log line; guarded by mu_
  std::atomic<std::uint64_t> dropped_total_{0};
  mutable std::mutex problem_mu_;
  std::string problem_;  // guarded by problem_mu_
};

/// The daemon's own forecast (docs/forecast.md, "In the daemon"): a sample whose agent sends no
/// forecast level but a step gets the forecaster's verdict for its (process, device) series.
/// The device's capacity for the process is reserved + the driver's free memory when the agent
/// sends `device_free_bytes`. Logs each series' moves into and out of warning or worse.
/// Prepare() runs on the agent server's thread only.
class ProcessForecasts {
 public:
  /// At most this many series are followed; the least recently updated is dropped first.
  static constexpr std::size_t kMaxSeries = 4096;
  explicit ProcessForecasts(LogFn log);
  void Prepare(agent::AgentSample& sample);

 private:
  analysis::LiveForecasts live_;
  LogFn log_;
};

/// The alert rules of a config file, evaluated every tick against the latest samples and GPU
/// facts; firing and resolved alerts go to the hooks (a delivery thread, never blocking).
class AlertService {
 public:
  static Result<std::unique_ptr<AlertService>> Open(const std::string& config_path, bool dry_run,
                                                    std::string hostname, LogFn log);
  void Evaluate(const agent::AgentRegistry& registry, const gpu::NodeGpuInfo& gpus);
  std::size_t rules() const { return rules_; }

 private:
  AlertService(sinks::AlertConfig config, std::string hostname, LogFn log);
  std::size_t rules_;
  LogFn log_;
  sinks::AlertEngine engine_;
  sinks::HookRunner runner_;
};

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_SERVE_SERVICES_H_
