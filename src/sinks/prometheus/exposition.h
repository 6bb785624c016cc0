// The node's state in Prometheus text exposition format 0.0.4: GPU facts (NVML, /proc), the
// latest agent sample per process and device, and the daemon's own counters. Every metric,
// its labels and its meaning are listed in docs/exporter.md; GPU and process series carry
// the labels of NVIDIA's DCGM exporter (gpu, UUID, pci_bus_id, device, modelName, Hostname)
// so PromQL can join the two.
//
// Thread safety: pure functions over plain values.
#ifndef FRAGSCOPE_SINKS_PROMETHEUS_EXPOSITION_H_
#define FRAGSCOPE_SINKS_PROMETHEUS_EXPOSITION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sources/agent/agent_registry.h"
#include "sources/gpu/gpu_info.h"

namespace fragscope::sinks::prometheus {

/// The daemon's view of itself.
struct DaemonStats {
  std::string version;
  double start_time_seconds = 0;  // Unix time
  agent::AgentCounters agents;
  double collect_seconds = 0;  // how long this scrape's collection took (GPU facts + registry)
  std::uint64_t textfile_writes = 0;
  std::uint64_t textfile_write_errors = 0;
  // Agent samples the history queue had no room for (never written to the database).
  std::uint64_t history_samples_dropped = 0;
  // The HTTP endpoint's defences (http_server.h): connections closed at the connection cap to
  // make room, requests not whole by their deadline, requests refused (malformed, a body, a
  // head too large, a method other than GET/HEAD).
  std::uint64_t http_connections_evicted = 0;
  std::uint64_t http_requests_timed_out = 0;
  std::uint64_t http_requests_refused = 0;
};

/// Everything one scrape shows.
struct NodeState {
  std::string hostname;
  gpu::NodeGpuInfo gpus;
  std::vector<agent::AgentEntry> agents;
  DaemonStats daemon;
  /// Bound on the bytes of the process series; 0: none. Each UID holding series gets an equal
  /// share; a series that would take its UID past its share is left out whole (and counted in
  /// fragscope_agent_series_omitted), so one user's long labels cannot crowd out the others.
  std::size_t max_process_bytes = 0;
};

/// The text exposition (ends with a newline; Content-Type: kContentType).
std::string RenderExposition(const NodeState& state);

inline constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";

/// A label value with \, " and newline escaped as the format requires.
std::string EscapeLabelValue(std::string_view value);
/// The size_bucket label of free-block histogram bucket `b`: "512B-1KiB", "1MiB-2MiB", ...
std::string SizeBucketLabel(int b);

}  // namespace fragscope::sinks::prometheus

#endif  // FRAGSCOPE_SINKS_PROMETHEUS_EXPOSITION_H_
