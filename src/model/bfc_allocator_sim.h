// BfcAllocatorSim: a deterministic model of the decisions of the BFC ("best-fit with
// coalescing") allocator that TensorFlow and JAX/XLA put in front of device memory
// (tensorflow/core/common_runtime, later tsl and xla/tsl `framework/bfc_allocator.cc`): which
// free chunk serves a request, when a chunk is split, when a new region is taken from the
// device, when free regions go back (garbage collection), and when a request fails. The rules,
// and the versions they hold for, are in docs/simulator.md ("The BFC allocator model").
// BfcSettings holds the knobs TensorFlow and JAX expose; ParseBfcSettings reads them as
// `fragscope replay --allocator bfc --bfc-conf ...` takes them.
//
// Every decision with a visible effect is reported as a trace Event, in PyTorch's vocabulary so
// DeviceMemory and the analysis read a BFC replay as any other: a region is a segment
// (segment_alloc, segment_free when garbage collection returns it), a chunk handed out is an
// `alloc` whose block_size is the chunk's size, a free is free_requested + free_completed, a
// failed request is an `oom`.
//
// Not modelled: the timestamped ("freed_at_count") chunks of stream-ordered XLA allocations,
// regions that coalesce with their neighbours (sub-allocators that support it: TF's GPU
// virtual-memory allocator), the retry-on-failure wait (it only waits for other threads'
// frees), threads.
//
// Thread safety: none; one thread drives a simulator.
#ifndef FRAGSCOPE_MODEL_BFC_ALLOCATOR_SIM_H_
#define FRAGSCOPE_MODEL_BFC_ALLOCATOR_SIM_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"

namespace fragscope::model {

inline constexpr std::uint64_t kBfcMinAllocation = 256;  // every chunk is a multiple of this
inline constexpr int kBfcNumBins = 21;  // bin i: chunks of [256·2^i, 256·2^(i+1))

/// Which allocator source to follow. The differences (docs/simulator.md, "Versions"):
///   kTf0    TensorFlow 0.x (common_runtime): a chunk is split only when it is at least twice
///           the request; allow_growth starts at 1 MiB; no garbage collection.
///   kTf2    TensorFlow 1.x and 2.x up to the move to tsl (checked on 2.1): a chunk is also
///           split when the remainder is at least 128 MiB; allow_growth starts at 1 MiB;
///           optional garbage collection of free regions.
///   kNewest tsl / xla/tsl (TensorFlow 2.21, checked against the real allocator; JAX's XLA):
///           as kTf2, allow_growth starts at 2 MiB, and the remainder threshold may be a
///           fraction of the limit (fragmentation_fraction).
enum class BfcVersion { kTf0, kTf2, kNewest };

std::string_view BfcVersionName(BfcVersion version);

/// The settings of one BFC allocator.
struct BfcSettings {
  /// memory_limit_: the bytes the allocator may take in regions. Unset: memory_fraction of the
  /// device's free memory (capacity − used by others), as TensorFlow's GPU device sizes it with
  /// per_process_gpu_memory_fraction and JAX with XLA_PYTHON_CLIENT_MEM_FRACTION.
  std::optional<std::uint64_t> memory_limit;
  double memory_fraction = 1.0;  // (0, 1]
  /// true: regions grow by doubling from the first size (TF_FORCE_GPU_ALLOW_GROWTH,
  /// XLA_PYTHON_CLIENT_PREALLOCATE=false); false: one region of the whole limit at the first
  /// request (TensorFlow's and JAX's default on a GPU).
  bool allow_growth = true;
  /// Before failing, return regions with no chunk in use to the device and retry
  /// (TF_ENABLE_GPU_GARBAGE_COLLECTION, on by default for TensorFlow's GPU allocator).
  bool garbage_collection = false;
  /// > 0: split also when the remainder is at least this fraction of the limit; 0: 128 MiB.
  double fragmentation_fraction = 0.0;
  BfcVersion version = BfcVersion::kNewest;
  /// Where the device puts new regions (BfcDevice::descending): "regions:descending" for
  /// TensorFlow's CPU BFC allocator over malloc.
  bool descending_regions = false;

  bool operator==(const BfcSettings&) const = default;
};

/// Parses "key:value,key:value" (whitespace ignored). Keys: allow_growth, preallocate (the
/// inverse of allow_growth), memory_limit (a size: "12GiB", bytes), memory_fraction,
/// garbage_collection, fragmentation_fraction, regions (ascending, descending), version
/// (newest, 2.x, 0.x). Booleans are
/// true/false/1/0. Unknown keys and bad values are kInvalidArgument naming the key.
Result<BfcSettings> ParseBfcSettings(std::string_view conf);
/// The canonical text of `settings` (keys that differ from the defaults, in the order above).
std::string ToBfcConfString(const BfcSettings& settings);

/// The device under the allocator.
struct BfcDevice {
  std::uint64_t capacity_bytes = 0;  // 0: unlimited (a region fails only at the limit)
  std::uint64_t used_by_others_bytes = 0;
  /// Where regions go (a multiple of 2 MiB; 0 = 0x7f0000000000). Ascending: upwards from the
  /// base, at the lowest 2 MiB-aligned gap where a region fits (cudaMalloc / cuMemAlloc hand out
  /// addresses upwards). Descending: downwards from the base, at the highest such gap (host
  /// memory: glibc maps large mallocs below the previous ones, so TensorFlow's CPU BFC regions
  /// go down). Where regions lie decides which of two equal free chunks in different regions
  /// best fit takes (the lower address).
  std::uint64_t address_base = 0;
  bool descending = false;
};

/// TensorFlow's AllocatorStats, under the names JAX's Device.memory_stats() uses.
struct BfcStats {
  std::int64_t num_allocs = 0;
  std::int64_t bytes_in_use = 0;
  std::int64_t peak_bytes_in_use = 0;
  std::int64_t largest_alloc_size = 0;
  std::int64_t bytes_limit = 0;
  std::int64_t pool_bytes = 0;  // total_region_allocated_bytes_
  std::int64_t peak_pool_bytes = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_regions_freed = 0;  // by garbage collection

  /// Sorted by key, with largest_free_block_bytes added by the caller's state.
  std::map<std::string, std::int64_t> Flatten(std::uint64_t largest_free_block) const;
};

/// One chunk of the chunk map, as TensorFlow's dump lists it ("InUse at ... of size ...").
struct BfcChunk {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;  // 0 when free
  bool in_use = false;
  bool operator==(const BfcChunk&) const = default;
};
struct BfcRegion {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::vector<BfcChunk> chunks;  // in address order, tiling the region
  bool operator==(const BfcRegion&) const = default;
};

struct BfcOom {
  std::uint64_t requested = 0;
  std::uint64_t rounded = 0;
  std::uint64_t in_use = 0;
  std::uint64_t pool_bytes = 0;
  std::uint64_t limit = 0;
  std::uint64_t largest_free_chunk = 0;
  std::string message;  // TensorFlow's first line of the failure
};

class BfcAllocatorSim {
 public:
  /// The limit is settings.memory_limit, else memory_fraction × (capacity − used_by_others)
  /// rounded down to 256 bytes; with neither a limit nor a capacity, 1 PiB.
  BfcAllocatorSim(const BfcSettings& settings, const BfcDevice& device, std::int32_t device_index);

  /// Receives every allocator event as it happens (may be empty).
  void SetEventSink(std::function<void(const Event&)> sink) { sink_ = std::move(sink); }

  /// AllocateRaw(num_bytes): the chunk's address, or kOutOfMemory with TensorFlow's message
  /// (last_oom() has the figures). REQUIRES: request > 0.
  Result<std::uint64_t> Malloc(std::uint64_t request);
  /// DeallocateRaw(ptr). kInvalidArgument if `addr` is not a chunk in use.
  Status Free(std::uint64_t addr);

  const BfcStats& stats() const { return stats_; }
  std::uint64_t memory_limit() const { return limit_; }
  /// The size the next region would have (curr_region_allocation_bytes_).
  std::uint64_t next_region_bytes() const { return curr_region_bytes_; }
  std::uint64_t largest_free_chunk() const;
  const std::optional<BfcOom>& last_oom() const { return last_oom_; }
  /// Every region in address order with its chunks (TensorFlow's dump).
  std::vector<BfcRegion> Regions() const;

  /// Verifies: chunks tile each region, no two free neighbours, the free set holds exactly the
  /// free chunks, bytes_in_use == Σ in-use chunk sizes, pool_bytes == Σ region sizes <= limit.
  Status CheckInvariants() const;

 private:
  struct Chunk {
    std::uint64_t size = 0;
    std::uint64_t requested = 0;
    std::uint64_t region = 0;  // the region's address
    bool in_use = false;
  };
  bool Extend(std::uint64_t rounded);
  bool DeallocateFreeRegions(std::uint64_t rounded);
  std::optional<std::uint64_t> FindChunk(std::uint64_t rounded, std::uint64_t request);
  std::uint64_t PlaceRegion(std::uint64_t bytes) const;
  void InsertFree(std::uint64_t addr, std::uint64_t size) { free_.emplace(size, addr); }
  void EraseFree(std::uint64_t addr, std::uint64_t size) { free_.erase({size, addr}); }
  void Emit(const Event& e) const {
    if (sink_) sink_(e);
  }

  BfcSettings settings_;
  BfcDevice device_;
  std::int32_t device_index_ = 0;
  std::uint64_t limit_ = 0;
  std::uint64_t curr_region_bytes_ = 0;
  bool started_backpedal_ = false;
  std::map<std::uint64_t, std::uint64_t> regions_;          // address -> size
  std::map<std::uint64_t, Chunk> chunks_;                   // address -> chunk, all regions
  std::set<std::pair<std::uint64_t, std::uint64_t>> free_;  // (size, address): best fit
  BfcStats stats_;
  std::optional<BfcOom> last_oom_;
  std::function<void(const Event&)> sink_;
};

/// TensorFlow's strings::HumanReadableNumBytes as its logs show it: "256B", "13.2KiB",
/// "80.00MiB" (KiB with one decimal, larger units with two).
std::string TfHumanBytes(std::uint64_t bytes);

/// The BFC bin of a chunk size: min(floor(log2(size / 256)), 20).
int BfcBinForSize(std::uint64_t size);

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_BFC_ALLOCATOR_SIM_H_
