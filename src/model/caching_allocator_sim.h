// CachingAllocatorSim: a deterministic re-implementation of the decisions of PyTorch's native
// CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, "DeviceCachingAllocator") for one
// device, over a model of the driver: which cached block serves a request, when a segment is
// cudaMalloc'd or an expandable segment grows, when memory goes back to the driver, every
// memory_stats() counter, and the exact out-of-memory message. Behaviour follows
// shared/spec/pytorch-caching-allocator.md; section numbers below refer to it.
//
// Every decision with a visible effect is also reported as a trace Event (segment_alloc,
// segment_map, alloc, free_requested, free_completed, segment_unmap, segment_free, oom) to the
// event sink, in the order PyTorch's own trace would record them, so DeviceMemory and every
// metric work on a simulation exactly as on a real trace.
//
// Modelling choices (docs/simulator.md has the full list):
//   * Addresses are deterministic. cudaMalloc'd segments are placed in 2 MiB granules upwards
//     from 0x7f0000000000, at the lowest address where the whole segment fits (freed ranges are
//     reused lowest first). Expandable segments reserve ceil((T + T/8) / page) pages of virtual
//     address space (T = capacity) from a separate window starting at 2^48, lowest free range
//     first, with one page of gap after each reservation.
//     A replay of a recorded run may give the driver's own addresses instead
//     (DriverModel::segment_address).
//   * Driver: cudaMalloc(n) and page maps succeed iff n <= capacity - used_by_others - reserved.
//   * Streams and events: free() of a block with record_stream uses records one event per
//     used stream (ascending stream order); an event completes once StreamSync(its stream) or
//     StreamSync(all) is called after it was recorded, and the block is freed by the next Malloc
//     (PyTorch polls events there) or by EmptyCache / the release-and-retry path, which wait for
//     every event.
//   * Events carry device = options.device, the block's stream and time_us = -1; alloc events
//     carry block_size, segment_alloc/segment_map the pool; an oom event carries the rounded size
//     (PyTorch's trace records params.size()) and device_free.
//   * Not modelled: private pools (CUDA graphs, MemPool), the cudaMallocAsync backend,
//     free-memory callbacks, NVML process lists in the OOM text, threads.
//
// Thread safety: none; one thread drives a simulator.
#ifndef FRAGSCOPE_MODEL_CACHING_ALLOCATOR_SIM_H_
#define FRAGSCOPE_MODEL_CACHING_ALLOCATOR_SIM_H_

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/alloc_conf.h"

namespace fragscope::model {

/// What the simulated driver knows about the device.
struct DriverModel {
  std::uint64_t capacity_bytes = 0;        // total device memory (cudaMemGetInfo total)
  std::uint64_t used_by_others_bytes = 0;  // CUDA context, NCCL, other processes
  /// Replaying a recorded run at the addresses its driver gave (`replay snapshot.pickle`):
  /// asked before each cudaMalloc of `bytes`, the address the real driver returned for it, or
  /// 0 to let the simulator place the segment. An answer whose range does not end at or below
  /// the base of the simulator's own placement (address_base), or overlaps a segment placed
  /// this way, is ignored: the simulator places the segment itself and counts it in
  /// unpinned_segments().
  std::function<std::uint64_t(std::uint64_t bytes)> segment_address;
  /// Where the simulator's own cudaMalloc placement starts (a multiple of 2 MiB below 2^47;
  /// 0 = 0x7f0000000000). A replay at recorded addresses puts it above them all.
  std::uint64_t address_base = 0;
};

/// The cudaMalloc address space the simulator models: 32 TiB of segments (2^24 granules of 2 MiB,
/// internal::GranuleSpace). A device said to be larger is replayed as this large (pipeline/replay
/// clamps it with a note).
inline constexpr std::uint64_t kModelledAddressSpaceBytes = std::uint64_t{32} << 40;

struct SimOptions {
  AllocatorConfig config;  // PYTORCH_CUDA_ALLOC_CONF as parsed
  ConfigVersion version = ConfigVersion::kNewest;
  DriverModel driver;
  std::int32_t device = 0;
};

/// One Stat of memory_stats(): current, peak, allocated (sum of increases), freed.
struct Stat {
  std::int64_t current = 0;
  std::int64_t peak = 0;
  std::int64_t allocated = 0;
  std::int64_t freed = 0;
  void Increase(std::int64_t n);
  void Decrease(std::int64_t n);
};
/// A StatArray: index 0 = all, 1 = small_pool, 2 = large_pool.
using StatArray = std::array<Stat, 3>;

/// torch.cuda.memory_stats() for one device, with PyTorch's families (§11).
struct MemoryStats {
  StatArray allocation, segment, active, inactive_split;
  StatArray allocated_bytes, reserved_bytes, active_bytes, inactive_split_bytes, requested_bytes;
  Stat oversize_allocations, oversize_segments;
  std::int64_t num_alloc_retries = 0;
  std::int64_t num_ooms = 0;
  std::int64_t num_sync_all_streams = 0;
  std::int64_t num_device_alloc = 0;
  std::int64_t num_device_free = 0;
  std::int64_t max_split_size = -1;  // fixed at creation (−1 = unlimited), as PyTorch reports

  /// Flattened under PyTorch's key names ("allocated_bytes.all.current", "num_ooms", ...),
  /// sorted by key, as torch.cuda.memory_stats() returns them.
  std::map<std::string, std::int64_t> Flatten() const;
};

/// torch.cuda.memory_snapshot() shapes.
struct SnapshotBlock {
  std::uint64_t address = 0;
  std::uint64_t size = 0;
  std::uint64_t requested_size = 0;
  std::string state;  // "active_allocated", "active_pending_free", "inactive"
};
struct SnapshotSegment {
  std::int32_t device = 0;
  std::uint64_t address = 0;
  std::uint64_t total_size = 0;
  std::uint64_t allocated_size = 0;
  std::uint64_t active_size = 0;
  std::uint64_t requested_size = 0;
  std::uint64_t stream = 0;
  std::string segment_type;  // "small" or "large"
  bool is_expandable = false;
  std::vector<SnapshotBlock> blocks;
};

/// Details of the last OOM, for reports.
struct OomDetails {
  std::uint64_t requested = 0;  // bytes asked
  std::uint64_t rounded = 0;    // after §4.1
  std::uint64_t reported = 0;   // "Tried to allocate" = segment size of §4.3
  std::uint64_t device_total = 0;
  std::uint64_t device_free = 0;  // after the release steps
  std::uint64_t allocated = 0;    // allocated_bytes.all.current
  std::uint64_t reserved = 0;
  std::optional<std::uint64_t> limit;  // fraction limit bytes, if on
  std::string message;                 // PyTorch's exact text (§12)
  /// The malloc found device memory free, but the simulator's modelled address space
  /// (kModelledAddressSpaceBytes) had no room for the segment: a limit of the model, not of
  /// the device (address_space_refusals() counts these refusals).
  bool address_space_full = false;
};

class CachingAllocatorSim {
 public:
  explicit CachingAllocatorSim(const SimOptions& options);
  ~CachingAllocatorSim();
  CachingAllocatorSim(const CachingAllocatorSim&) = delete;
  CachingAllocatorSim& operator=(const CachingAllocatorSim&) = delete;

  /// Receives every allocator event as it happens (may be empty).
  void SetEventSink(std::function<void(const Event&)> sink);

  /// torch's malloc(request, stream). Returns the block address, or kOutOfMemory with
  /// PyTorch's message (after the release-and-retry path; the state keeps what was released),
  /// or, for a request >= 1 EiB, kOutOfMemory with "CUDA out of memory. Tried to allocate more
  /// than 1EB memory." before the allocator runs (no event, no stats; last_oom() has it).
  /// REQUIRES: request > 0.
  Result<std::uint64_t> Malloc(std::uint64_t request, std::uint64_t stream = 0);
  /// torch's free(ptr). kInvalidArgument if `addr` is not an allocated block.
  Status Free(std::uint64_t addr);
  /// tensor.record_stream(stream) for the block at `addr`.
  Status RecordStream(std::uint64_t addr, std::uint64_t stream);

  /// The handle API: the same operations as Malloc/Free/RecordStream, naming an allocated
  /// block by a small handle instead of its address, which spares the address lookup (a
  /// replayer that maps its own ids to handles needs no address table at all). A handle is
  /// valid from the MallocBlock that returned it until the block is freed; handles are reused.
  using BlockHandle = std::uint32_t;
  static constexpr BlockHandle kNoBlock = 0xffffffffu;  // a zero-byte request's null pointer
  struct Allocation {
    std::uint64_t addr = 0;
    BlockHandle handle = kNoBlock;
  };
  /// Malloc, also returning the block's handle.
  Result<Allocation> MallocBlock(std::uint64_t request, std::uint64_t stream = 0);
  /// Free of the block `handle` names; kNoBlock is a no-op. REQUIRES: `handle` is valid.
  void FreeBlock(BlockHandle handle);
  /// Hint: the block `handle` names will be freed soon (a replay reading ahead); loads its
  /// record into the cache, or with `neighbours` (a later call, once the record is cached) the
  /// records of the blocks beside it, which the free's merge reads. Any handle is allowed.
  void PrefetchBlock(BlockHandle handle, bool neighbours) const;
  /// RecordStream of the block `handle` names. REQUIRES: `handle` is valid and not kNoBlock.
  void RecordStreamOnBlock(BlockHandle handle, std::uint64_t stream);
  /// Work queued on `stream` (all streams if nullopt) so far has completed: events recorded
  /// on it complete; blocks whose events all completed are freed at the next Malloc (§5.2).
  void StreamSync(std::optional<std::uint64_t> stream);
  /// torch.cuda.empty_cache() (§9).
  void EmptyCache();
  /// torch.cuda.set_per_process_memory_fraction(fraction) (§7). kInvalidArgument outside [0,1].
  Status SetMemoryFraction(double fraction);
  /// torch.cuda.memory._set_allocator_settings(conf): re-parse with the reset rule (§3.1).
  Status SetAllocatorSettings(std::string_view conf);
  void ResetPeakStats();
  void ResetAccumulatedStats();

  const MemoryStats& stats() const;
  std::vector<SnapshotSegment> MemorySnapshot() const;
  const std::optional<OomDetails>& last_oom() const;
  const AllocatorConfig& config() const;
  /// Driver free bytes: capacity − used_by_others − reserved.
  std::uint64_t device_free_bytes() const;
  /// With driver.segment_address: the cudaMallocs placed where it said, and those it gave an
  /// address (non-zero) that could not be used.
  std::uint64_t pinned_segments() const;
  std::uint64_t unpinned_segments() const;
  /// cudaMalloc calls (or expandable reservations) that had device memory to spare but found
  /// no room in the modelled address space (kModelledAddressSpaceBytes of segments): each ends
  /// in a simulated OOM that is the model's limit, not the device's (issue 30 item 5).
  std::uint64_t address_space_refusals() const;

  /// Whether a simulator created with `other` instead of config() (same driver, version and
  /// device), given the same calls so far, would have made every decision this one made and
  /// emitted the same events. Its memory_stats() would then differ at most in max_split_size.
  /// Conservative: settings that differ in max_split_size_mb, garbage_collection_threshold or
  /// per_process_memory_fraction match when the run never came near the differing thresholds
  /// and never needed a release, retry or OOM path; anything else matches only if equal.
  /// Tune uses it to replay settings that cannot diverge once.
  bool WouldMatch(const AllocatorConfig& other) const;

  /// Verifies the simulator's internal invariants and the §11.4 snapshot/stats identities.
  /// O(n); for tests and debug builds.
  Status CheckInvariants() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_CACHING_ALLOCATOR_SIM_H_
