// AllocatorConfig: the settings of PyTorch's CUDA caching allocator as PYTORCH_CUDA_ALLOC_CONF /
// PYTORCH_ALLOC_CONF (and torch.cuda.memory._set_allocator_settings) set them, and the parser
// that applies such a string with PyTorch's validation and re-parse rules
// (shared/spec/pytorch-caching-allocator.md §3, §4.1, §13; user docs: docs/allocator-config.md).
//
// ParseAllocatorConfig(conf) reads a string as PyTorch does at process start (from defaults);
// ParseAllocatorConfig(conf, previous) applies it at run time, where every parse resets
// max_split_size_mb, roundup_power2_divisions and garbage_collection_threshold to their defaults
// unless the string sets them, and every other option keeps its previous value.
// ToConfString(config) is the inverse: the shortest canonical string that parses back to config.
//
// Thread safety: value types and pure functions.
#ifndef FRAGSCOPE_MODEL_ALLOC_CONF_H_
#define FRAGSCOPE_MODEL_ALLOC_CONF_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fragscope/status.h"
#include "model/allocator_rules.h"

namespace fragscope::model {

/// Which PyTorch's parser to follow. The differences (docs/allocator-config.md, "Versions"):
///   kV1_13  PyTorch 1.13: options separated by commas *or whitespace*; words without ':' are
///           ignored; roundup_power2_divisions is a single value; roundup_bypass_threshold_mb
///           exists; max_split_size_mb must be > 20.
///   kV2     PyTorch 2.0-2.5: the tokenizer of 2.x (whitespace is dropped, ',' ':' '[' ']'
///           separate); list syntax for roundup_power2_divisions where ">:D" overwrites the last
///           explicit entry too; max_split_size_mb must be > 20; no max_non_split_rounding_mb.
///   kNewest PyTorch 2.9 and later (c10/core/AllocatorConfig + c10/cuda/CUDAAllocatorConfig):
///           max_split_size_mb and max_non_split_rounding_mb >= 20; ">:D" starts after the last
///           explicit entry; per_process_memory_fraction, graph_capture_record_stream_reuse,
///           the pinned_* and expandable_segments_reserve* options.
enum class ConfigVersion { kV1_13, kV2, kNewest };

/// Human-readable name of a version ("PyTorch 2.0-2.5").
std::string_view ConfigVersionName(ConfigVersion version);

/// `backend`: read once at process start; cudaMallocAsync replaces the caching allocator.
enum class AllocatorBackend { kNative, kCudaMallocAsync };

/// One value of expandable_segments_reserve(_by_class): a fraction of device memory ("0.5") or
/// an absolute size in GiB ("40G"). Affects virtual address space only.
struct ExpandableSegmentsReserve {
  bool is_fraction = true;
  double value = 0.0;  // > 0 and finite
  bool operator==(const ExpandableSegmentsReserve&) const = default;
};

/// Every option of PYTORCH_CUDA_ALLOC_CONF that PyTorch's native allocator reads. Sizes are in
/// bytes (the conf string says MiB). Defaults are PyTorch's. Options marked "kept" are parsed and
/// validated but do not change what a simulator does (host allocator, threading, VA reserve).
struct AllocatorConfig {
  /// max_split_size_mb × MiB; kUnlimited = never limited. Reset by every parse.
  std::uint64_t max_split_size = kUnlimited;
  /// max_non_split_rounding_mb × MiB (PyTorch 2.6+; before, fixed at 20 MiB).
  std::uint64_t max_non_split_rounding = kLargeBuffer;
  /// roundup_power2_divisions per interval: index 0 = requests < 2 MiB, index i = [2^i MiB,
  /// 2^(i+1) MiB), index 15 = >= 32 GiB. Each is 0 or a power of 2. Reset by every parse.
  std::array<std::uint64_t, kRoundupIntervals> roundup_power2_divisions{};
  /// roundup_bypass_threshold_mb × MiB (PyTorch 1.13 only): requests above it are not
  /// power-2 rounded. kUnlimited = not set. Reset by every parse.
  std::uint64_t roundup_bypass_threshold = kUnlimited;
  /// In (0, 1); 0 = off. Reset by every parse.
  double garbage_collection_threshold = 0.0;
  bool expandable_segments = false;
  /// Initial fraction limit (§7), in [0, 1] (PyTorch 2.9+).
  double per_process_memory_fraction = 1.0;
  bool graph_capture_record_stream_reuse = false;
  bool throw_on_cudamalloc_oom = false;  // kept; newest only
  AllocatorBackend backend = AllocatorBackend::kNative;
  bool release_lock_on_cudamalloc = false;  // kept: threading only
  // Host (pinned) allocator: kept.
  bool pinned_use_cuda_host_register = false;
  std::uint32_t pinned_num_register_threads = 1;  // power of 2, <= 128
  bool pinned_use_background_threads = false;
  std::uint64_t pinned_reserve_segment_size_mb = 0;  // 0 = not set; when set, > 0
  bool pinned_free_catch_all = false;
  // Expandable-segment virtual address reserve: kept.
  std::optional<ExpandableSegmentsReserve> expandable_segments_reserve;
  /// Per stream class; each parse that names the option replaces the whole map.
  std::map<std::string, ExpandableSegmentsReserve> expandable_segments_reserve_by_class;

  /// The subset a replay needs (AllocatorRules). Divisions above 2^31 saturate to 2^31 (they
  /// differ only for requests >= 2 TiB). A 1.13 roundup_bypass_threshold is approximated: the
  /// intervals wholly above it get 0; the interval that contains it keeps its divisions.
  AllocatorRules Rules() const;

  bool operator==(const AllocatorConfig&) const = default;
};

/// Longest conf string accepted (kLimitExceeded beyond). PyTorch has no limit; real strings are
/// under 300 bytes, and the cap keeps error messages and fuzzing inputs small.
inline constexpr std::size_t kMaxAllocatorConfBytes = 64 * 1024;

/// Parses `conf` as PyTorch does when it reads PYTORCH_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF at
/// process start: on top of the defaults, any backend allowed. An empty string gives defaults.
/// Errors are kInvalidArgument (kLimitExceeded for an over-long string) with a message
/// "PYTORCH_CUDA_ALLOC_CONF: <what> (at offset <byte>; PyTorch: <its wording>)" naming the
/// token; nothing is partially applied.
Result<AllocatorConfig> ParseAllocatorConfig(std::string_view conf,
                                             ConfigVersion version = ConfigVersion::kNewest);

/// Applies `conf` on top of `previous` as torch.cuda.memory._set_allocator_settings(conf) does:
/// max_split_size, roundup_power2_divisions, roundup_bypass_threshold and
/// garbage_collection_threshold go back to their defaults unless `conf` sets them (so "" resets
/// exactly those), every other option keeps its value from `previous`. `backend` may only
/// repeat previous.backend (PyTorch chooses it once, at load time). Same errors as above; on
/// error `previous` stays valid and unchanged (PyTorch itself may have applied a prefix).
Result<AllocatorConfig> ParseAllocatorConfig(std::string_view conf, const AllocatorConfig& previous,
                                             ConfigVersion version = ConfigVersion::kNewest);

/// The options that differ from the defaults as (key, value) pairs in a fixed order, values
/// spelled as in a conf string ("True", "128", "[256:1,512:2]"): the printer of every
/// configuration fragscope writes (trace headers' allocator_settings, ToConfString). Sizes are
/// written in whole MiB, rounded down.
std::vector<std::pair<std::string, std::string>> ToSettingPairs(const AllocatorConfig& config);

/// Canonical "key:value,..." of the options that differ from the defaults, in a fixed order
/// ("" for defaults): ToSettingPairs joined. ParseAllocatorConfig(ToConfString(c), v) == c for
/// every c that ParseAllocatorConfig(..., v) produced.
std::string ToConfString(const AllocatorConfig& config);

/// A conf string as a user may paste it: the value of PYTORCH_CUDA_ALLOC_CONF, or the whole
/// assignment as a shell or `fragscope tune` prints it ("PYTORCH_CUDA_ALLOC_CONF=...",
/// "PYTORCH_ALLOC_CONF=...", "PYTORCH_HIP_ALLOC_CONF=...", optionally after "export " and with the
/// value in single or double quotes). Returns the value and sets `*offset` (optional) to its
/// byte offset in `text`; text without an assignment comes back unchanged.
std::string_view StripConfAssignment(std::string_view text, std::size_t* offset = nullptr);

/// ParseAllocatorConfig for a string a user gave (--alloc-conf, tune --setting): a pasted
/// assignment is accepted (StripConfAssignment); error offsets count from the start of `text`.
Result<AllocatorConfig> ParseUserAllocatorConf(std::string_view text,
                                               ConfigVersion version = ConfigVersion::kNewest);

/// The allocator settings of a trace header (TraceHeader::allocator_settings: pairs in file
/// order, docs/formats.md) as a configuration: the conf keys (ParseAllocatorConfig's grammar,
/// lists included), and the keys PyTorch's snapshots record in their allocator_settings dict
/// ("max_split_size" in bytes with -1 = unlimited, "max_non_split_rounding" in bytes, a
/// "garbage_collection_threshold" of 0 = off, lists as "[1:0,2:4]" or JSON's {"1":0,"2":4}).
/// Pairs that say nothing are skipped: a "None"/"null" value, a key whose value is its default
/// (so a newer PyTorch's "graph_capture_record_stream_reuse:False" does not fail an older
/// `version`), and the snapshot's informational keys (PYTORCH_CUDA_ALLOC_CONF,
/// trace_alloc_*). Errors are ParseAllocatorConfig's, for the joined conf string.
Result<AllocatorConfig> ParseAllocatorSettings(
    const std::vector<std::pair<std::string, std::string>>& settings,
    ConfigVersion version = ConfigVersion::kNewest);

/// The --torch-version choices with the releases each stands for, from ConfigVersionName (so
/// help and messages name the same ranges): "1.13 (PyTorch 1.13), 2 (PyTorch 2.0-2.5), newest
/// (PyTorch 2.9+); 2.6-2.8 lie between 2 and newest (docs/allocator-config.md, Versions)".
std::string ConfigVersionChoices();

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_ALLOC_CONF_H_
