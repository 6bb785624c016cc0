// Tune: replays one request trace under many allocator settings in parallel and ranks them:
// runs without an OOM first, then the lowest peak reserved, then the fewest bytes no request
// asked for (rounding), then the smallest change. Optionally finds, by bisection, the smallest
// device each setting fits on.
//
// Thread safety: Tune() runs its own worker threads over a read-only copy of the events.
#ifndef FRAGSCOPE_ANALYSIS_TUNE_H_
#define FRAGSCOPE_ANALYSIS_TUNE_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/alloc_conf.h"
#include "model/recorded_addresses.h"

namespace fragscope::analysis {

struct TuneOptions {
  std::uint64_t capacity_bytes = 0;
  /// Devices of another size than capacity_bytes (a snapshot's devices whose recorded OOM
  /// tells theirs). The bisection of find_min_capacity gives every device the same size.
  std::map<std::int32_t, std::uint64_t> device_capacity_bytes;
  /// Where each device's segments go: the addresses the real driver gave them (a snapshot's,
  /// model/recorded_addresses.h); devices without an entry use the simulator's own placement.
  std::map<std::int32_t, model::RecordedAddresses> addresses;
  /// A snapshot's requests: per device, the index of its first request after those that
  /// rebuild its start state (pipeline::RequestEvents::recorded_from). The device's peaks count
  /// from there, as the recorded run's do; devices without an entry count from their start.
  std::map<std::int32_t, std::size_t> recorded_from;
  /// A snapshot's: the device allocations (segment_alloc, segment_map) its recorded history
  /// holds, all devices (pipeline::RequestEvents::recorded_device_allocs). Unset for a request
  /// trace. None: TuneCannotRank says the history cannot tell the settings apart.
  std::optional<std::uint64_t> recorded_device_allocs;
  std::uint64_t used_by_others_bytes = 0;
  model::ConfigVersion version = model::ConfigVersion::kNewest;
  /// PYTORCH_CUDA_ALLOC_CONF strings to try (a pasted "PYTORCH_CUDA_ALLOC_CONF=" prefix is
  /// accepted: model::ParseUserAllocatorConf); empty: DefaultTuneGrid(version). "" is the
  /// default.
  std::vector<std::string> settings;
  unsigned threads = 0;  // 0: one per hardware thread
  bool find_min_capacity = false;
  std::uint64_t min_capacity_granularity = std::uint64_t{2} << 20;  // 2 MiB: segment rounding
};

struct TuneOutcome {
  std::string conf;  // as given, without a pasted "NAME=" prefix ("" = PyTorch's defaults)
  bool oom = false;
  std::uint64_t oom_event = 0;  // request event index of the first OOM
  std::int64_t oom_step = -1;
  std::uint64_t peak_reserved = 0;   // reserved_bytes.all.peak (up to the OOM, if any)
  std::uint64_t peak_allocated = 0;  // block sizes: requests after the setting's rounding
  std::uint64_t peak_requested = 0;  // the sizes the program asked for
  // (peak reserved − peak requested) / peak reserved: rounding counts as waste, as it is
  double waste_at_peak = 0;
  std::uint64_t num_alloc_retries = 0;
  std::uint64_t num_device_alloc = 0;
  std::optional<std::uint64_t> min_capacity;  // smallest device without OOM; unset: none to 1 PiB
  std::uint64_t oom_reserved = 0;   // reserved bytes of the failing device at the first OOM
  std::uint64_t oom_allocated = 0;  // allocated bytes there (fragmentation at the OOM point)
  /// Device allocations (cudaMalloc of a segment, or pages mapped into an expandable one) the
  /// replay made after recording began: after a snapshot's rebuilt start state
  /// (TuneOptions::recorded_from), over the whole run for a request trace. All devices.
  std::uint64_t device_allocs_recorded = 0;
};

/// The default grid (72 settings): expandable_segments False/True × max_split_size_mb
/// unset/32/64/128/256/512 × roundup_power2_divisions 0/4/8 × garbage_collection_threshold
/// off / 0.8 with per_process_memory_fraction 0.95, as canonical strings (model::ToConfString).
/// Every entry parses for `version`: for 1.13 without expandable_segments (36 settings), before
/// 2.9 without per_process_memory_fraction. The first entry is "" (the defaults).
std::vector<std::string> DefaultTuneGrid(
    model::ConfigVersion version = model::ConfigVersion::kNewest);

/// Replays `events` (a request trace) under each setting. Outcomes come back ranked: no OOM
/// first, then (with find_min_capacity) the smallest device a setting fits on, then peak
/// reserved, then peak allocated (the requests are the same in every run, so
/// a higher figure is bytes a setting's rounding adds: they buy nothing here and bring an OOM
/// closer when requests grow), then the fewest keys set (the smallest change that does as
/// well), then the order given; settings that run out of memory rank by how far they got (a
/// later OOM first). Errors: a setting
/// that does not parse (kInvalidArgument naming it), or a trace the replayer rejects.
Result<std::vector<TuneOutcome>> Tune(const std::vector<Event>& events, const TuneOptions& options);

/// Why the recorded history cannot tell the settings of `ranked` apart, or "" when it can. It
/// cannot when a snapshot's recorded history holds no device allocation
/// (options.recorded_device_allocs is 0): every byte its requests used was reserved before
/// recording began, and that start state is rebuilt under each setting (docs/snapshots.md), so
/// the peaks, waste, OOMs and minimum capacities compare rebuilds, not how the settings would
/// have run the job. `tune` then recommends nothing instead of "the defaults are best".
std::string TuneCannotRank(const std::vector<TuneOutcome>& ranked, const TuneOptions& options);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_TUNE_H_
