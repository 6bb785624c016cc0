// The daemon's process API (docs/live-monitoring.md, "The process API"): what `fragscope serve`
// answers at GET /api/v1/processes and /api/v1/processes/<id>/map, and what `fragscope top`
// reads back. ProcessRow is one process and device as the daemon knows it; the JSON writer and
// the parser sit side by side so the two ends share one schema.
//
// The parser reads answers from the network: every field is checked for its type and range,
// sizes are bounded (kMaxProcesses, kRecentPoints per row), and an error names the field
// ("processes[3].reserved_bytes: expected an unsigned integer").
//
// Thread safety: plain values and pure functions.
#ifndef FRAGSCOPE_SINKS_LIVE_PROCESS_API_H_
#define FRAGSCOPE_SINKS_LIVE_PROCESS_API_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fragscope/risk.h"
#include "fragscope/status.h"
#include "sinks/prometheus/http_server.h"
#include "sources/agent/agent_registry.h"

namespace fragscope::sinks::live {

inline constexpr std::string_view kProcessesSchema = "fragscope.processes";
inline constexpr int kProcessesSchemaVersion = 1;
/// The horizon of the OOM probability a row carries (P(OOM within this many steps)).
inline constexpr std::uint64_t kRiskHorizonSteps = kHeadlineRiskHorizonSteps;
/// The most rows a parsed answer may hold: twice the daemon's largest --max-series default
/// would be 1024; a list beyond this is not a daemon's.
inline constexpr std::size_t kMaxProcesses = 65536;

/// One bucket of the free-block histogram: blocks with min_bytes <= size < 2 * min_bytes.
struct FreeBucket {
  std::uint64_t min_bytes = 0;
  std::uint64_t count = 0;
  std::uint64_t bytes = 0;
};

struct HistoryPoint {
  std::int64_t step = -1;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
};

/// One process (pid) on one device, as its latest sample and the daemon's forecast say.
/// Optional fields are unknown (the agent did not send them), never zero.
struct ProcessRow {
  std::string id;  // "<pid>-<8 hex digits of the device UUID's hash>": the map's path
  std::string job;
  std::int32_t rank = -1;
  std::uint32_t pid = 0;
  std::string host;
  std::string device_uuid;
  std::int32_t device_index = -1;
  std::int64_t step = -1;
  std::uint64_t reserved_bytes = 0;
  std::uint64_t allocated_bytes = 0;
  std::optional<double> fragmentation_ratio;
  std::optional<std::uint64_t> cached_free_bytes;
  std::optional<std::uint64_t> largest_free_block_bytes;
  std::optional<std::uint64_t> largest_request_bytes;  // since the previous sample
  std::optional<std::uint64_t> max_allocatable_bytes;
  std::optional<std::uint64_t> stranded_bytes;
  std::optional<double> oom_risk;    // P(OOM within kRiskHorizonSteps steps)
  std::string oom_risk_explanation;  // where oom_risk comes from, one line ("" without a risk)
  RiskLevel level = RiskLevel::kUnknown;
  std::optional<std::int64_t> steps_to_oom;
  std::int64_t last_sample_unix_ms = 0;
  bool connected = true;                // false: the process disconnected; its last sample lingers
  std::vector<HistoryPoint> history;    // oldest first, at most kRecentPoints
  std::vector<FreeBucket> free_blocks;  // the map only: non-empty buckets, smallest first
};

struct ProcessList {
  std::string host;
  std::int64_t time_unix_ms = 0;
  std::vector<ProcessRow> processes;
};

/// The row of one registry view (host: the daemon's hostname label).
ProcessRow MakeProcessRow(const agent::AgentView& view, const std::string& host);
/// The id of a process and device (ProcessRow::id).
std::string ProcessId(std::uint32_t pid, std::string_view device_uuid);

/// GET /api/v1/processes: every row, without free_blocks.
std::string RenderProcessesJson(const ProcessList& list);
/// GET /api/v1/processes/<id>/map: {"schema", "schema_version", "host", "time_unix_ms",
/// "process"}
/// with the row's free_blocks.
std::string RenderProcessMapJson(const ProcessList& list, const ProcessRow& row);

/// Parses a /api/v1/processes answer; errors name the field and say what was expected.
Result<ProcessList> ParseProcessesJson(std::string_view text);
/// Parses a map answer: the one process, with its free_blocks.
Result<ProcessRow> ParseProcessMapJson(std::string_view text);

/// Answers an /api/v1/... target from the registry's views: 200 with the list or a map, or
/// 404 with {"error": ...} when the target names nothing.
prometheus::ApiAnswer AnswerProcessApi(std::string_view target,
                                       const std::vector<agent::AgentView>& views,
                                       const std::string& host, std::int64_t now_unix_ms);

}  // namespace fragscope::sinks::live

#endif  // FRAGSCOPE_SINKS_LIVE_PROCESS_API_H_
