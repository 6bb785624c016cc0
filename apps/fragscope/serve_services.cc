#include "serve_services.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include <fmt/format.h>
#include <sys/statvfs.h>

#include "analysis/alerts/alert_evaluator.h"

namespace fragscope::cli {
namespace {

// Samples waiting for the next flush beyond this are dropped (and counted): a history that
// cannot keep up must not grow the daemon without bound.
constexpr std::size_t kMaxQueuedSamples = 100'000;
constexpr auto kNvmlRetry = std::chrono::minutes(1);

std::int64_t NowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

analysis::LiveForecasts DefaultLiveForecasts(std::size_t max_series) {
  // The defaults are valid, so Create cannot fail here.
  return std::move(analysis::LiveForecasts::Create(analysis::ForecastOptions{}, max_series))
      .value();
}

// Below this much free space the history counts as full: SQLite needs room for its journal
// and a batch before it can commit one.
constexpr std::uint64_t kMinFreeBytes = 4 << 20;

}  // namespace

std::string HistoryWriteProblem(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  struct statvfs fs = {};
  if (::statvfs(dir.c_str(), &fs) == 0) {
    if ((fs.f_flag & ST_RDONLY) != 0) return "read-only file system";
    const std::uint64_t free = static_cast<std::uint64_t>(fs.f_bavail) * fs.f_frsize;
    if (free < kMinFreeBytes) {
      return fmt::format("disk full ({} KiB free, at least {} KiB needed)", free / 1024,
                         kMinFreeBytes / 1024);
    }
  }
  if ((::access(path.c_str(), F_OK) == 0 && ::access(path.c_str(), W_OK) != 0) ||
      ::access(dir.c_str(), W_OK) != 0) {
    return "not writable (file or folder permissions)";
  }
  return {};
}

ProcessForecasts::ProcessForecasts(LogFn log)
    : live_(DefaultLiveForecasts(kMaxSeries)), log_(std::move(log)) {}

void ProcessForecasts::Prepare(agent::AgentSample& sample) {
  if (sample.forecast_level != RiskLevel::kUnknown || sample.step < 0) return;  // the agent's own
  analysis::LiveSample live;
  live.step = sample.step;
  analysis::TimelineSample& w = live.window;
  w.reserved_bytes = sample.reserved_bytes;
  w.allocated_bytes = sample.allocated_bytes;
  w.live_requested_bytes = sample.requested_bytes;
  // Unknown summary figures (agent_sample.h) count as 0 here, as before they were optional.
  w.cached_free_bytes = sample.cached_free_bytes.value_or(0);
  w.fragmentation_ratio = sample.fragmentation_ratio.value_or(0.0);
  w.largest_free_block = sample.largest_free_block.value_or(0);
  w.max_allocatable = sample.max_allocatable.value_or(0);
  w.stranded_bytes = sample.stranded_bytes.value_or(0);
  w.peak_reserved_bytes = sample.peak_reserved_bytes;
  w.peak_allocated_bytes = sample.peak_allocated_bytes;
  // Set against what can be obtained now only when the agent reports that (block level).
  bool block_level =
      sample.max_allocatable.value_or(0) > 0 || sample.largest_free_block.value_or(0) > 0;
  for (std::uint64_t n : sample.free_block_count) block_level |= n > 0;
  w.largest_request = block_level ? sample.largest_request_bytes : 0;
  live.retries_total = sample.num_alloc_retries;
  if (sample.device_free_bytes) {  // saturating: the values come from outside
    const std::uint64_t free = *sample.device_free_bytes;
    live.capacity_bytes =
        sample.reserved_bytes > UINT64_MAX - free ? UINT64_MAX : sample.reserved_bytes + free;
  }
  const analysis::LiveVerdict v =
      live_.Observe(fmt::format("{} {}", sample.pid, sample.device_uuid), live);
  sample.forecast_level = v.point.level;
  if (v.point.steps_to_oom) sample.steps_to_oom = static_cast<std::int64_t>(*v.point.steps_to_oom);
  if (v.point.risk) {
    const analysis::OomRisk& r = *v.point.risk;
    for (const auto& h : r.horizons) sample.oom_risk.emplace_back(h.steps, h.probability);
    sample.oom_risk_explanation = r.explanation;
    sample.oom_risk_limit_bytes = (r.limit_low_bytes + r.limit_high_bytes) / 2;
    sample.oom_risk_largest_step_bytes = r.largest_demand_bytes;
  }
  const bool alarm = v.point.level >= RiskLevel::kWarning;
  if (log_ && alarm != (v.previous >= RiskLevel::kWarning)) {
    // Where the risk comes from (issue 31 item 5), unless the reason already says it.
    std::string why;
    if (v.point.risk && !v.point.risk->explanation.empty() &&
        v.point.reason.find(v.point.risk->explanation) == std::string::npos) {
      why = "; OOM risk from: " + v.point.risk->explanation;
    }
    log_(fmt::format("forecast: pid {} on {}, step {}: {}: {}{}", sample.pid, sample.device_uuid,
                     sample.step, RiskLevelName(v.point.level), v.point.reason, why));
  }
}

GpuSource::GpuSource(const std::string& nvml_lib, const std::string& proc_root) {
  if (!nvml_lib.empty()) nvml_options_.library_paths = {nvml_lib};
  if (!proc_root.empty()) procfs_options_.root = proc_root;
}

GpuSource::~GpuSource() = default;

gpu::NodeGpuInfo GpuSource::Collect() {
  gpu::NodeGpuInfo nvml;
  const auto now = std::chrono::steady_clock::now();
  if (!nvml_ && now >= next_open_) {
    Result<std::unique_ptr<gpu::NvmlCollector>> opened = gpu::NvmlCollector::Open(nvml_options_);
    if (opened.ok()) {
      nvml_ = std::move(*opened);
    } else {
      nvml_reason_ = opened.status().message();
      next_open_ = now + kNvmlRetry;
    }
  }
  if (nvml_) {
    Result<gpu::NodeGpuInfo> collected = nvml_->Collect();
    if (collected.ok()) {
      nvml = std::move(collected).value();
    } else {
      nvml.nvml_library = nvml_->library();
      nvml.nvml_unavailable_reason = collected.status().message();
    }
  } else {
    nvml.nvml_unavailable_reason = nvml_reason_;
  }
  gpu::NodeGpuInfo procfs;
  Result<gpu::NodeGpuInfo> read = gpu::ReadNvidiaProcfs(procfs_options_);
  if (read.ok()) {
    procfs = std::move(read).value();
  } else {
    procfs.procfs_unavailable_reason = read.status().message();
  }
  return gpu::JoinGpuInfo(std::move(nvml), std::move(procfs));
}

Result<std::unique_ptr<SampleRecorder>> SampleRecorder::Open(const std::string& path, LogFn log,
                                                             HistoryLimits limits) {
  sinks::HistoryOptions options;
  // NORMAL: a committed batch survives kill -9 of the daemon (the WAL is in the OS's hands);
  // only a power loss may take the last batches. One fsync per batch would cost more than a
  // tick on slow disks.
  options.sync_full = false;
  options.retention.max_bytes = limits.max_bytes;
  Result<std::unique_ptr<sinks::HistoryStore>> store = sinks::HistoryStore::Open(path, options);
  if (!store.ok()) return store.status();
  std::unique_ptr<SampleRecorder> recorder(
      new SampleRecorder(std::move(*store), std::move(log), limits));
  recorder->problem_ = HistoryWriteProblem(path);
  return recorder;
}

std::string SampleRecorder::problem() const {
  std::lock_guard<std::mutex> lock(problem_mu_);
  return problem_;
}

bool SampleRecorder::Take(Bucket& b, double rate, double bytes,
                          std::chrono::steady_clock::time_point now) {
  const double capacity = 5 * rate;
  if (b.refilled == std::chrono::steady_clock::time_point{}) {
    b.tokens = capacity;
  } else {
    b.tokens = std::min(capacity,
                        b.tokens + std::chrono::duration<double>(now - b.refilled).count() * rate);
  }
  b.refilled = now;
  if (b.tokens < bytes) return false;
  b.tokens -= bytes;
  return true;
}

void SampleRecorder::Add(const agent::AgentSample& sample) {
  // What the row will take (HistoryStore counts the same for retention): its strings, about
  // 21 bytes per non-empty histogram bucket, 200 for the rest.
  double bytes =
      200.0 + static_cast<double>(sample.run.size() + sample.job.size() +
                                  sample.architecture.size() + sample.device_uuid.size());
  for (std::size_t b = 0; b < agent::kFreeBlockBuckets; ++b) {
    if (sample.free_block_count[b] != 0 || sample.free_block_bytes[b] != 0) bytes += 21;
  }
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(mu_);
  // Per UID first, so a UID over its rate never takes the shared budget of the others.
  if (queue_.size() >= kMaxQueuedSamples ||
      !Take(per_uid_[sample.uid.value_or(0)], static_cast<double>(limits_.bytes_per_second_per_uid),
            bytes, now) ||
      !Take(total_, static_cast<double>(limits_.bytes_per_second), bytes, now)) {
    if (queue_.size() < kMaxQueuedSamples) ++rate_dropped_;
    ++dropped_;
    ++dropped_total_;
    return;
  }
  queue_.push_back(sinks::ReceivedSample{sample, NowUs()});
}

void SampleRecorder::Flush() {
  std::vector<sinks::ReceivedSample> batch;
  std::uint64_t dropped = 0;
  std::uint64_t rate_dropped = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    batch.swap(queue_);
    std::swap(dropped, dropped_);
    std::swap(rate_dropped, rate_dropped_);
    // Buckets of UIDs that have refilled completely carry no state worth keeping.
    const auto now = std::chrono::steady_clock::now();
    std::erase_if(per_uid_, [&](const auto& kv) {
      return now - kv.second.refilled > std::chrono::seconds(10);
    });
  }
  if (dropped > rate_dropped) {
    log_(fmt::format("history: {} samples dropped (the queue of {} was full)",
                     dropped - rate_dropped, kMaxQueuedSamples));
  }
  if (rate_dropped > 0) {
    log_(fmt::format(
        "history: {} samples not written: over the history's write rate ({} KiB/s "
        "per UID, {} KiB/s in all)",
        rate_dropped, limits_.bytes_per_second_per_uid >> 10, limits_.bytes_per_second >> 10));
  }
  if (batch.empty()) return;
  const Status s = store_->AppendSamples(batch);
  std::string problem;
  if (!s.ok()) {
    problem = HistoryWriteProblem(store_->path());
    if (problem.empty()) problem = s.message();
  }
  std::string before;
  {
    std::lock_guard<std::mutex> lock(problem_mu_);
    before = std::exchange(problem_, problem);
  }
  // The state is logged when it changes (and /healthz says it while it lasts); each batch
  // lost is logged too, as before.
  if (!s.ok()) {
    if (before != problem) log_(fmt::format("history degraded: {}", problem));
    log_(fmt::format("history: {} samples not written: {}", batch.size(), s.message()));
    return;
  }
  if (!before.empty()) log_(fmt::format("history writable again (was: {})", before));
  written_ += batch.size();
}

Result<std::unique_ptr<AlertService>> AlertService::Open(const std::string& config_path,
                                                         bool dry_run, std::string hostname,
                                                         LogFn log) {
  Result<sinks::AlertConfig> config = sinks::LoadAlertConfig(config_path);
  if (!config.ok()) return config.status();
  config->delivery.dry_run = config->delivery.dry_run || dry_run;
  return std::unique_ptr<AlertService>(
      new AlertService(std::move(*config), std::move(hostname), std::move(log)));
}

AlertService::AlertService(sinks::AlertConfig config, std::string hostname, LogFn log)
    : rules_(config.rules.size()),
      log_(log),
      engine_(std::move(config.rules), std::move(hostname)),
      runner_(std::move(config.hooks), config.delivery, std::move(log)) {}

void AlertService::Evaluate(const agent::AgentRegistry& registry, const gpu::NodeGpuInfo& gpus) {
  std::vector<agent::AgentSample> latest;
  for (agent::AgentEntry& e : registry.Entries()) latest.push_back(std::move(e.sample));
  for (const sinks::AlertNotification& n :
       engine_.Evaluate(analysis::AlertClock::now(), latest, gpus)) {
    if (n.state != analysis::AlertState::kPending) {
      log_(fmt::format("alert {} {}: {}", n.rule, analysis::AlertStateName(n.state), n.summary));
    }
    runner_.Submit(n);
  }
}

}  // namespace fragscope::cli
