// Prometheus text exposition (exposition.h; docs/exporter.md lists every metric).
#include "sinks/prometheus/exposition.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include <fmt/format.h>

namespace fragscope::sinks::prometheus {
namespace {

using Labels = std::vector<std::pair<std::string_view, std::string>>;

std::string EscapeHelp(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string FormatDouble(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// name="value" pairs, comma-separated, without braces. An empty value is left out: Prometheus
// treats an empty label as an absent one, and the bytes add up (every series has ~10 labels).
std::string RenderLabels(const Labels& labels) {
  std::string out;
  for (const auto& [key, val] : labels) {
    if (val.empty()) continue;
    if (!out.empty()) out += ',';
    out += key;
    out += "=\"";
    out += EscapeLabelValue(val);
    out += '"';
  }
  return out;
}

// Collects the samples of one metric family; Emit() writes HELP, TYPE and the samples together
// (the format wants a family's lines contiguous).
class Family {
 public:
  Family(std::string_view name, std::string_view type, std::string_view help)
      : name_(name), type_(type), help_(help) {}

  // `labels` as RenderLabels makes them.
  void AddRendered(std::string_view labels, std::string_view value) {
    body_ += name_;
    if (!labels.empty()) {
      body_ += '{';
      body_ += labels;
      body_ += '}';
    }
    body_ += ' ';
    body_ += value;
    body_ += '\n';
  }
  void AddRendered(std::string_view labels, std::uint64_t v) {
    AddRendered(labels, std::string_view(fmt::format_int(v).c_str()));
  }
  void AddRendered(std::string_view labels, std::int64_t v) {
    AddRendered(labels, std::string_view(fmt::format_int(v).c_str()));
  }
  void AddRendered(std::string_view labels, double v) { AddRendered(labels, FormatDouble(v)); }
  template <typename T>
  void Add(const Labels& labels, T v) {
    AddRendered(RenderLabels(labels), v);
  }

  // Bytes of samples so far, and dropping the samples added after a size() (a rollback).
  std::size_t size() const { return body_.size(); }
  void Truncate(std::size_t size) { body_.resize(size); }

  void Emit(std::string* out) const {
    *out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name_, EscapeHelp(help_), name_, type_);
    *out += body_;
  }

 private:
  std::string name_;
  std::string type_;
  std::string help_;
  std::string body_;
};

std::string Optional(const std::optional<std::uint32_t>& v) {
  return v ? fmt::format("{}", *v) : std::string();
}

// DCGM exporter's labels for a GPU (docs/exporter.md, "Joining with DCGM").
Labels GpuLabels(const gpu::GpuInfo& g, const std::string& hostname) {
  return {{"gpu", Optional(g.index)},
          {"UUID", g.uuid},
          {"pci_bus_id", g.pci_bus_id},
          {"device", g.device_minor ? fmt::format("nvidia{}", *g.device_minor) : std::string()},
          {"modelName", g.name.empty() ? g.model : g.name},
          {"Hostname", hostname}};
}

// The process series (the agents' samples, joined with their GPU by UUID) into `out`; returns
// how many series were left out at the page bound.
std::size_t RenderProcesses(const NodeState& state, std::string* out_ptr) {
  std::string& out = *out_ptr;
  const std::string& host = state.hostname;
  std::map<std::string_view, const gpu::GpuInfo*> by_uuid;
  for (const gpu::GpuInfo& g : state.gpus.gpus) by_uuid[g.uuid] = &g;
  using Field = std::uint64_t agent::AgentSample::*;
  using KnownField = std::optional<std::uint64_t> agent::AgentSample::*;
  struct Gauge {
    Family family;
    Field field;
  };
  // The block-level summary: a series only when the figure is known (sent by the agent or
  // derived when the sample was decoded), so no dashboard or rule reads unknown as 0.
  struct KnownGauge {
    Family family;
    KnownField field;
  };
  Gauge gauges[] = {
      {{"fragscope_process_reserved_bytes", "gauge",
        "Bytes the caching allocator holds from the driver (reserved_bytes.all.current)."},
       &agent::AgentSample::reserved_bytes},
      {{"fragscope_process_allocated_bytes", "gauge",
        "Bytes in live tensors, rounded block sizes (allocated_bytes.all.current)."},
       &agent::AgentSample::allocated_bytes},
      {{"fragscope_process_active_bytes", "gauge",
        "Bytes in active blocks (active_bytes.all.current)."},
       &agent::AgentSample::active_bytes},
      {{"fragscope_process_requested_bytes", "gauge",
        "Bytes the program asked for, unrounded (requested_bytes.all.current)."},
       &agent::AgentSample::requested_bytes},
      {{"fragscope_process_peak_reserved_bytes", "gauge",
        "Highest reserved_bytes since the process started or reset its peaks."},
       &agent::AgentSample::peak_reserved_bytes},
      {{"fragscope_process_peak_allocated_bytes", "gauge",
        "Highest allocated_bytes since the process started or reset its peaks."},
       &agent::AgentSample::peak_allocated_bytes},
      {{"fragscope_process_largest_request_bytes", "gauge",
        "Largest allocation request since the agent's previous sample (0: not reported)."},
       &agent::AgentSample::largest_request_bytes},
  };
  KnownGauge known_gauges[] = {
      {{"fragscope_process_cached_free_bytes", "gauge",
        "Reserved but unallocated bytes: free blocks inside the allocator's segments."},
       &agent::AgentSample::cached_free_bytes},
      {{"fragscope_process_largest_free_block_bytes", "gauge",
        "Largest free block inside the allocator's segments."},
       &agent::AgentSample::largest_free_block},
      {{"fragscope_process_max_allocatable_bytes", "gauge",
        "Largest single allocation that would succeed now (docs/metrics.md)."},
       &agent::AgentSample::max_allocatable},
      {{"fragscope_process_stranded_bytes", "gauge",
        "Free bytes in gaps too small to serve any request seen (docs/metrics.md)."},
       &agent::AgentSample::stranded_bytes},
  };
  Family retries("fragscope_process_alloc_retries_total", "counter",
                 "Allocations that failed once and succeeded after freeing cached blocks "
                 "(num_alloc_retries).");
  Family ooms("fragscope_process_ooms_total", "counter",
              "Out-of-memory errors the allocator raised (num_ooms).");
  Family frag("fragscope_process_fragmentation_ratio", "gauge",
              "Fragmentation of the free memory, 0..1 (docs/metrics.md).");
  Family blocks("fragscope_process_free_blocks", "gauge",
                "Free blocks by size bucket (size_bucket: [lower, upper) bytes; size_min_bytes: "
                "lower bound).");
  Family block_bytes("fragscope_process_free_block_bytes", "gauge",
                     "Bytes in free blocks by size bucket.");
  Family level("fragscope_process_forecast_level", "gauge",
               "The agent's OOM forecast: 0 unknown, 1 ok, 2 watch, 3 warning, 4 critical.");
  Family steps("fragscope_process_steps_to_oom", "gauge",
               "Training steps until the forecast expects an out-of-memory error (absent when "
               "none is expected).");
  Family risk("fragscope_process_oom_risk", "gauge",
              "The daemon's calibrated OOM risk: P(an out-of-memory error within the next "
              "horizon_steps steps), 0..1, from how close the job's step demand came to the "
              "limit and the chance of a new largest step (docs/forecast.md, \"OOM risk\"; "
              "absent until known). Where it comes from: fragscope_process_oom_risk_limit_bytes "
              "and fragscope_process_oom_risk_largest_step_bytes, and the daemon's log line and "
              "/api/v1/processes' oom_risk_explanation.");
  Family risk_limit("fragscope_process_oom_risk_limit_bytes", "gauge",
                    "The step demand (peak allocated plus the cache's cost) the device serves, as "
                    "the OOM risk takes it: the capacity less the cache's measured overhead, the "
                    "middle of its range (docs/forecast.md, \"OOM risk\"; absent until known).");
  Family risk_largest("fragscope_process_oom_risk_largest_step_bytes", "gauge",
                      "The largest step demand the OOM risk has seen; set against "
                      "fragscope_process_oom_risk_limit_bytes it says how close the job came.");
  Family samples("fragscope_process_samples_total", "counter",
                 "Samples accepted for this process and device since its series appeared.");
  Family step("fragscope_process_step", "gauge", "The training step of the latest sample.");
  Family last("fragscope_process_last_sample_timestamp_seconds", "gauge",
              "When the daemon received the latest sample, in seconds since the Unix epoch.");
  // Each UID's share of the page (docs/exporter.md, "Limits and safety"): a series that would
  // take its UID past max_process_bytes / (UIDs with series) is left out, whole.
  std::map<std::uint32_t, std::size_t> used_by_uid;
  for (const agent::AgentEntry& e : state.agents) used_by_uid[e.sample.uid.value_or(0)] = 0;
  const std::size_t share =
      state.max_process_bytes == 0
          ? 0
          : state.max_process_bytes / std::max<std::size_t>(1, used_by_uid.size());
  std::vector<Family*> all;
  for (Gauge& gauge : gauges) all.push_back(&gauge.family);
  for (KnownGauge& gauge : known_gauges) all.push_back(&gauge.family);
  // The families after the gauges, in the order of the page.
  const std::array<Family*, 13> rest = {&retries, &ooms,  &frag, &blocks,     &block_bytes,
                                        &level,   &steps, &risk, &risk_limit, &risk_largest,
                                        &samples, &step,  &last};
  all.insert(all.end(), rest.begin(), rest.end());
  std::vector<std::size_t> before(all.size());
  std::size_t omitted = 0;
  for (const agent::AgentEntry& e : state.agents) {
    const agent::AgentSample& s = e.sample;
    std::size_t begin_bytes = 0;
    for (std::size_t k = 0; k < all.size(); ++k) begin_bytes += before[k] = all[k]->size();
    const auto it = by_uuid.find(s.device_uuid);
    const gpu::GpuInfo* g = it == by_uuid.end() ? nullptr : it->second;
    Labels labels = {
        {"gpu", g ? Optional(g->index) : std::string()},
        {"UUID", s.device_uuid},
        {"pci_bus_id", g ? g->pci_bus_id : std::string()},
        {"device",
         g && g->device_minor ? fmt::format("nvidia{}", *g->device_minor) : std::string()},
        {"modelName", g ? (g->name.empty() ? g->model : g->name) : std::string()},
        {"Hostname", host},
        {"pid", fmt::format("{}", s.pid)},
        {"rank", s.rank >= 0 ? fmt::format("{}", s.rank) : std::string()},
        {"job_name", s.job},
    };
    const std::string rendered = RenderLabels(labels);
    for (Gauge& gauge : gauges) gauge.family.AddRendered(rendered, s.*gauge.field);
    for (KnownGauge& gauge : known_gauges) {
      if (const std::optional<std::uint64_t>& v = s.*gauge.field; v) {
        gauge.family.AddRendered(rendered, *v);
      }
    }
    retries.AddRendered(rendered, s.num_alloc_retries);
    ooms.AddRendered(rendered, s.num_ooms);
    if (s.fragmentation_ratio) frag.AddRendered(rendered, *s.fragmentation_ratio);
    std::string bucket_labels;
    for (int b = 0; b < agent::kFreeBlockBuckets; ++b) {
      const auto i = static_cast<std::size_t>(b);
      // Only buckets that hold blocks: the 31 always-present ones were three quarters of a
      // page, the scrape's main cost (docs/exporter.md, "Limits and safety").
      if (s.free_block_count[i] == 0 && s.free_block_bytes[i] == 0) continue;
      bucket_labels = rendered;
      bucket_labels +=
          fmt::format("{}size_bucket=\"{}\",size_min_bytes=\"{}\"", rendered.empty() ? "" : ",",
                      SizeBucketLabel(b), b == 0 ? 0 : std::uint64_t{1} << b);
      blocks.AddRendered(bucket_labels, s.free_block_count[i]);
      block_bytes.AddRendered(bucket_labels, s.free_block_bytes[i]);
    }
    level.AddRendered(rendered, static_cast<std::uint64_t>(s.forecast_level));
    if (s.steps_to_oom) steps.AddRendered(rendered, *s.steps_to_oom);
    for (const auto& [horizon, p] : s.oom_risk) {
      risk.AddRendered(
          fmt::format("{}{}horizon_steps=\"{}\"", rendered, rendered.empty() ? "" : ",", horizon),
          p);
    }
    if (s.oom_risk_limit_bytes) risk_limit.AddRendered(rendered, *s.oom_risk_limit_bytes);
    if (s.oom_risk_largest_step_bytes) {
      risk_largest.AddRendered(rendered, *s.oom_risk_largest_step_bytes);
    }
    samples.AddRendered(rendered, e.samples);
    if (s.step >= 0) step.AddRendered(rendered, s.step);
    last.AddRendered(rendered, static_cast<double>(e.received_unix_ms) / 1000.0);
    if (share > 0) {
      std::size_t end_bytes = 0;
      for (const Family* f : all) end_bytes += f->size();
      std::size_t& used = used_by_uid[s.uid.value_or(0)];
      if (used + (end_bytes - begin_bytes) > share) {
        for (std::size_t k = 0; k < all.size(); ++k) all[k]->Truncate(before[k]);
        ++omitted;
      } else {
        used += end_bytes - begin_bytes;
      }
    }
  }
  for (const Gauge& gauge : gauges) gauge.family.Emit(&out);
  for (const KnownGauge& gauge : known_gauges) gauge.family.Emit(&out);
  for (const Family* f : rest) f->Emit(&out);
  return omitted;
}

}  // namespace

std::string EscapeLabelValue(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string SizeBucketLabel(int b) {
  auto bytes = [](int log2) {
    static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    return fmt::format("{}{}", std::uint64_t{1} << (log2 % 10), kUnits[log2 / 10]);
  };
  if (b <= 0) return "0B-2B";
  return bytes(b) + "-" + bytes(b + 1);
}

std::string RenderExposition(const NodeState& state) {
  const std::string& host = state.hostname;
  std::string out;
  out.reserve(64 * 1024);
  std::string processes;
  const std::size_t omitted = RenderProcesses(state, &processes);

  // Daemon.
  {
    Family up("fragscope_up", "gauge", "1 while the fragscope daemon is serving.");
    up.Add({{"Hostname", host}}, std::uint64_t{1});
    up.Emit(&out);
    Family build("fragscope_build_info", "gauge", "Always 1; the version is a label.");
    build.Add({{"version", state.daemon.version}, {"Hostname", host}}, std::uint64_t{1});
    build.Emit(&out);
    Family start("fragscope_start_time_seconds", "gauge",
                 "When the daemon started, in seconds since the Unix epoch.");
    start.Add({{"Hostname", host}}, state.daemon.start_time_seconds);
    start.Emit(&out);
    Family collect("fragscope_scrape_collect_duration_seconds", "gauge",
                   "How long this scrape took to gather the GPU facts and the agent samples.");
    collect.Add({{"Hostname", host}}, state.daemon.collect_seconds);
    collect.Emit(&out);

    const agent::AgentCounters& c = state.daemon.agents;
    Family received("fragscope_agent_samples_received_total", "counter",
                    "Agent samples accepted on the agent socket.");
    received.Add({{"Hostname", host}}, c.samples_received);
    received.Emit(&out);
    Family rejected("fragscope_agent_samples_rejected_total", "counter",
                    "Frames refused on the agent socket, by reason; each closed its connection.");
    for (int r = 0; r < agent::kRejectReasonCount; ++r) {
      rejected.Add(
          {{"reason", std::string(agent::RejectReasonName(static_cast<agent::RejectReason>(r)))},
           {"Hostname", host}},
          c.rejected[static_cast<std::size_t>(r)]);
    }
    rejected.Emit(&out);
    Family accepted("fragscope_agent_connections_accepted_total", "counter",
                    "Agent connections accepted.");
    accepted.Add({{"Hostname", host}}, c.connections_accepted);
    accepted.Emit(&out);
    Family refused("fragscope_agent_connections_refused_total", "counter",
                   "Agent connections refused because the connection limit was reached.");
    refused.Add({{"Hostname", host}}, c.connections_refused);
    refused.Emit(&out);
    Family idle("fragscope_agent_connections_idle_closed_total", "counter",
                "Agent connections closed after staying silent longer than the expiry.");
    idle.Add({{"Hostname", host}}, c.connections_idle_closed);
    idle.Emit(&out);
    Family open("fragscope_agent_connections", "gauge", "Agent connections open now.");
    open.Add({{"Hostname", host}}, c.connections_open);
    open.Emit(&out);
    Family series("fragscope_agent_series", "gauge",
                  "Processes x devices with a current sample (the process series below).");
    series.Add({{"Hostname", host}}, static_cast<std::uint64_t>(state.agents.size()));
    series.Emit(&out);
    Family expired("fragscope_agent_series_expired_total", "counter",
                   "Process series dropped because their agent disconnected or went silent.");
    expired.Add({{"Hostname", host}}, c.series_expired);
    expired.Emit(&out);
    Family dropped(
        "fragscope_agent_series_dropped_total", "counter",
        "Agent samples not stored because they would have made a new series beyond "
        "the series limits (--max-series, --max-series-per-connection, --max-series-per-uid).");
    dropped.Add({{"Hostname", host}}, c.series_dropped);
    dropped.Emit(&out);
    Family relabeled("fragscope_agent_samples_relabeled_total", "counter",
                     "Agent samples that named a pid other than their sender's (SO_PEERCRED) "
                     "and were recorded under the sender's pid.");
    relabeled.Add({{"Hostname", host}}, c.samples_relabeled);
    relabeled.Emit(&out);
    Family left_out("fragscope_agent_series_omitted", "gauge",
                    "Process series not on this page because their UID's share of the page "
                    "bound was used (--max-page-bytes).");
    left_out.Add({{"Hostname", host}}, static_cast<std::uint64_t>(omitted));
    left_out.Emit(&out);
    Family writes("fragscope_textfile_writes_total", "counter",
                  "Textfile-collector files written (--textfile-dir).");
    writes.Add({{"Hostname", host}}, state.daemon.textfile_writes);
    writes.Emit(&out);
    Family write_errors("fragscope_textfile_write_errors_total", "counter",
                        "Textfile-collector writes that failed.");
    write_errors.Add({{"Hostname", host}}, state.daemon.textfile_write_errors);
    write_errors.Emit(&out);
    Family history_dropped("fragscope_history_samples_dropped_total", "counter",
                           "Agent samples not written to the history: its queue was full.");
    history_dropped.Add({{"Hostname", host}}, state.daemon.history_samples_dropped);
    history_dropped.Emit(&out);
    Family http_evicted("fragscope_http_connections_evicted_total", "counter",
                        "HTTP connections closed at --http-max-connections to make room: the "
                        "oldest still waiting for a request.");
    http_evicted.Add({{"Hostname", host}}, state.daemon.http_connections_evicted);
    http_evicted.Emit(&out);
    Family http_timed_out("fragscope_http_requests_timed_out_total", "counter",
                          "HTTP requests not whole within --http-request-timeout.");
    http_timed_out.Add({{"Hostname", host}}, state.daemon.http_requests_timed_out);
    http_timed_out.Emit(&out);
    Family http_refused("fragscope_http_requests_refused_total", "counter",
                        "HTTP requests refused: malformed, with a body, a head over 8 KiB, or a "
                        "method other than GET and HEAD.");
    http_refused.Add({{"Hostname", host}}, state.daemon.http_requests_refused);
    http_refused.Emit(&out);
  }

  // Node and GPUs.
  const gpu::NodeGpuInfo& node = state.gpus;
  {
    Family nvml("fragscope_nvml_available", "gauge",
                "1 when NVML answered; 0 with the reason as a label when it did not.");
    nvml.Add({{"reason", node.nvml_unavailable_reason}, {"Hostname", host}},
             std::uint64_t{node.nvml_unavailable_reason.empty() ? 1u : 0u});
    nvml.Emit(&out);
    Family info("fragscope_node_info", "gauge", "Always 1; driver and NVML versions as labels.");
    info.Add({{"driver_version", node.driver_version},
              {"nvml_version", node.nvml_version},
              {"cuda_driver_version",
               node.cuda_driver_version ? fmt::format("{}", *node.cuda_driver_version) : ""},
              {"Hostname", host}},
             std::uint64_t{1});
    info.Emit(&out);
    Family count("fragscope_gpus", "gauge", "GPUs the node reports.");
    count.Add({{"Hostname", host}}, static_cast<std::uint64_t>(node.gpus.size()));
    count.Emit(&out);

    Family gpu_info("fragscope_gpu_info", "gauge",
                    "Always 1 per GPU; firmware and MIG mode as labels.");
    Family total("fragscope_gpu_memory_total_bytes", "gauge", "Device memory (NVML).");
    Family used("fragscope_gpu_memory_used_bytes", "gauge", "Device memory in use (NVML).");
    Family free("fragscope_gpu_memory_free_bytes", "gauge", "Device memory free (NVML).");
    Family reserved("fragscope_gpu_memory_reserved_bytes", "gauge",
                    "Device memory reserved by the driver (NVML v2 memory info).");
    Family bar1_total("fragscope_gpu_bar1_total_bytes", "gauge", "BAR1 aperture size (NVML).");
    Family bar1_used("fragscope_gpu_bar1_used_bytes", "gauge", "BAR1 in use (NVML).");
    Family proc_used("fragscope_gpu_process_memory_used_bytes", "gauge",
                     "Device memory NVML attributes to a compute process (whole process, not the "
                     "allocator's view).");
    Family mig("fragscope_gpu_mig_instances", "gauge", "MIG instances on the GPU.");
    auto add_opt = [](Family& f, const Labels& l, const std::optional<std::uint64_t>& v) {
      if (v) f.Add(l, *v);
    };
    for (const gpu::GpuInfo& g : node.gpus) {
      const Labels labels = GpuLabels(g, host);
      Labels info_labels = labels;
      info_labels.emplace_back("firmware", g.firmware);
      info_labels.emplace_back("mig_enabled", g.mig_enabled ? "true" : "false");
      gpu_info.Add(info_labels, std::uint64_t{1});
      add_opt(total, labels, g.memory_total_bytes);
      add_opt(used, labels, g.memory_used_bytes);
      add_opt(free, labels, g.memory_free_bytes);
      add_opt(reserved, labels, g.memory_reserved_bytes);
      add_opt(bar1_total, labels, g.bar1_total_bytes);
      add_opt(bar1_used, labels, g.bar1_used_bytes);
      for (const gpu::GpuProcess& p : g.processes) {
        Labels l = labels;
        l.emplace_back("pid", fmt::format("{}", p.pid));
        add_opt(proc_used, l, p.used_memory_bytes);
      }
      mig.Add(labels, static_cast<std::uint64_t>(g.mig_instances.size()));
    }
    for (const Family* f :
         {&gpu_info, &total, &used, &free, &reserved, &bar1_total, &bar1_used, &proc_used, &mig}) {
      f->Emit(&out);
    }
  }

  out += processes;
  return out;
}

}  // namespace fragscope::sinks::prometheus
