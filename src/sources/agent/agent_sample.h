// AgentSample: what an in-process agent reports about one device of one training process,
// as received on the daemon's agent socket (the wire format is in docs/formats.md, "Agent
// protocol"). Plain data: the socket decodes into it; the exporter, the history and the
// alert rules read it.
//
// Thread safety: plain values.
#ifndef FRAGSCOPE_SOURCES_AGENT_AGENT_SAMPLE_H_
#define FRAGSCOPE_SOURCES_AGENT_AGENT_SAMPLE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fragscope/risk.h"

namespace fragscope::agent {

/// Free-block histogram buckets: bucket b counts free blocks with 2^b <= size < 2^(b+1)
/// (bucket 0 also holds size 0..1), the same power-of-two buckets as model::SizeHistogram.
inline constexpr int kFreeBlockBuckets = 64;

struct AgentSample {
  // Who. In the daemon `pid` is the sender's own process id as the kernel gives it
  // (SO_PEERCRED), or, with --allow-uid-sidecars, another live process of the sender's UID:
  // never a number the sample alone claims (docs/live-monitoring.md, "Trust on a node").
  std::uint32_t pid = 0;
  /// The sender's UID from the kernel (SO_PEERCRED); set by the daemon, never sent on the wire.
  std::optional<std::uint32_t> uid;
  std::int32_t rank = -1;          // -1: not a distributed job / unknown
  std::string job;                 // job name (e.g. the scheduler's job id); may be empty
  std::string run;                 // run name (history key); may be empty
  std::string architecture;        // model architecture label for baselines; may be empty
  std::string device_uuid;         // "GPU-…" as NVML reports it; joins with the GPU's series
  std::int32_t device_index = -1;  // CUDA device ordinal inside the process; -1 unknown
  // When.
  std::int64_t step = -1;    // training step; -1 unknown
  std::int64_t time_us = 0;  // sender's wall clock, µs since the Unix epoch
  // Allocator statistics (torch.cuda.memory_stats(): "…all.current" unless noted).
  std::uint64_t reserved_bytes = 0;        // reserved_bytes.all.current
  std::uint64_t allocated_bytes = 0;       // allocated_bytes.all.current
  std::uint64_t active_bytes = 0;          // active_bytes.all.current
  std::uint64_t requested_bytes = 0;       // requested_bytes.all.current
  std::uint64_t peak_reserved_bytes = 0;   // reserved_bytes.all.peak
  std::uint64_t peak_allocated_bytes = 0;  // allocated_bytes.all.peak
  std::uint64_t num_alloc_retries = 0;     // num_alloc_retries (cumulative)
  std::uint64_t num_ooms = 0;              // num_ooms (cumulative)
  // Block-level summary (docs/metrics.md). nullopt = unknown: the agent did not send it and
  // it cannot be derived (DecodeAgentSample derives cached_free_bytes, fragmentation_ratio and
  // max_allocatable where the sample allows; docs/exporter.md). Never read unknown as 0.
  std::optional<std::uint64_t> cached_free_bytes;
  std::optional<std::uint64_t> largest_free_block;
  std::optional<std::uint64_t> max_allocatable;
  std::optional<std::uint64_t> stranded_bytes;
  /// The largest allocation request the process made since its previous sample (0: unknown).
  /// Against largest_free_block and max_allocatable it tells whether the next such request
  /// would still fit: the signal of a fragmentation OOM.
  std::uint64_t largest_request_bytes = 0;
  std::optional<double> fragmentation_ratio;
  /// The driver's free memory on the device (torch.cuda.mem_get_info()[0]); with
  /// reserved_bytes it gives what the process may use, for the daemon's forecast.
  std::optional<std::uint64_t> device_free_bytes;
  std::array<std::uint64_t, kFreeBlockBuckets> free_block_count{};  // per bucket
  std::array<std::uint64_t, kFreeBlockBuckets> free_block_bytes{};  // per bucket
  // The agent's forecast (docs/forecast.md).
  RiskLevel forecast_level = RiskLevel::kUnknown;
  std::optional<std::int64_t> steps_to_oom;
  /// The daemon's OOM risk (not sent by agents): P(an OOM within `first` steps) per horizon.
  std::vector<std::pair<std::uint64_t, double>> oom_risk;
  /// Where that risk comes from (issue 31 item 5; set with oom_risk): the daemon's one line
  /// (how often step demand came near the limit, the chance of a new largest step, how the
  /// limit was measured), the step demand the device serves (the middle of the risk's limit)
  /// and the largest step demand seen.
  std::string oom_risk_explanation;
  std::optional<double> oom_risk_limit_bytes;
  std::optional<double> oom_risk_largest_step_bytes;
};

}  // namespace fragscope::agent

#endif  // FRAGSCOPE_SOURCES_AGENT_AGENT_SAMPLE_H_
