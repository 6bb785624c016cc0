// CachingAllocatorSim: PyTorch's native CUDA caching allocator for one device, decision by
// decision (shared/spec/pytorch-caching-allocator.md; section numbers below refer to it).
//
//   BlockRec    one block: a piece of a cudaMalloc segment, or a mapped or unmapped range of an
//               expandable segment; prev/next link the pieces of one segment in address order.
//   PoolState   one default pool (small or large): free set ordered by (stream, size, address),
//               unmapped set ordered by (stream, address), GC search counter.
//   ExpSegment  one expandable segment: a virtual address reservation with 2 or 20 MiB pages.
//
// Invariants (CheckInvariants() verifies them, with the §11.4 identities):
//   * the blocks of a segment tile it: b.next.addr == b.addr + b.size, links are symmetric;
//   * a block is in its pool's free set iff it is mapped, not allocated, has no pending event
//     and no recorded stream use ("cached"); two cached blocks are never neighbours;
//   * a block is in its pool's unmapped set iff it is not mapped (expandable segments only);
//   * total_reserved == Σ cudaMalloc'd segment sizes + Σ mapped expandable bytes
//                    == reserved_bytes.all.current.
// Thread safety: none (see the header).
#include "model/caching_allocator_sim.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <iterator>
#include <limits>
#include <map>
#include <memory_resource>
#include <set>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "common/big_array.h"
#include "common/units.h"
#include "model/address_index.h"
#include "model/allocator_rules.h"
#include "model/btree_map.h"
#include "model/segregated_free_set.h"
#include "model/sim_internal.h"

namespace fragscope::model {

// ---------------------------------------------------------------------------------------------
// Stat and MemoryStats

void Stat::Increase(std::int64_t n) {
  current += n;
  peak = std::max(peak, current);
  allocated += n;
}

void Stat::Decrease(std::int64_t n) {
  current -= n;
  freed += n;
}

std::map<std::string, std::int64_t> MemoryStats::Flatten() const {
  std::map<std::string, std::int64_t> out;
  auto add_stat = [&out](const std::string& prefix, const Stat& s) {
    out[prefix + ".current"] = s.current;
    out[prefix + ".peak"] = s.peak;
    out[prefix + ".allocated"] = s.allocated;
    out[prefix + ".freed"] = s.freed;
  };
  auto add_array = [&add_stat](const char* family, const StatArray& a) {
    static constexpr const char* kPools[3] = {"all", "small_pool", "large_pool"};
    for (std::size_t i = 0; i < 3; ++i) add_stat(fmt::format("{}.{}", family, kPools[i]), a[i]);
  };
  add_array("allocation", allocation);
  add_array("segment", segment);
  add_array("active", active);
  add_array("inactive_split", inactive_split);
  add_array("allocated_bytes", allocated_bytes);
  add_array("reserved_bytes", reserved_bytes);
  add_array("active_bytes", active_bytes);
  add_array("inactive_split_bytes", inactive_split_bytes);
  add_array("requested_bytes", requested_bytes);
  add_stat("oversize_allocations", oversize_allocations);
  add_stat("oversize_segments", oversize_segments);
  out["num_alloc_retries"] = num_alloc_retries;
  out["num_ooms"] = num_ooms;
  out["num_sync_all_streams"] = num_sync_all_streams;
  out["num_device_alloc"] = num_device_alloc;
  out["num_device_free"] = num_device_free;
  out["max_split_size"] = max_split_size;
  return out;
}

namespace {

using BlockId = std::uint32_t;
constexpr BlockId kNil = 0xffffffffu;
constexpr std::uint8_t kSmallPool = 0;
constexpr std::uint8_t kLargePool = 1;

// §2: a single request of 1 EiB or more fails before the allocator sees it.
constexpr std::uint64_t kOneExbibyte = std::uint64_t{1} << 60;
// §15 address policy (docs/simulator.md): cudaMalloc'd segments are 2 MiB granules from this
// base, lowest free address first; expandable reservations come from a separate window above.
constexpr std::uint64_t kCudaMallocBase = 0x7f0000000000ull;
constexpr std::uint64_t kReservationBase = 0x1000000000000ull;   // 2^48
constexpr std::uint64_t kReservationSpan = 0x10000000000000ull;  // 2^52: tops out below 2^53

static_assert(kModelledAddressSpaceBytes ==
              std::uint64_t{internal::GranuleSpace::kMaxGranules} * kRoundLarge);

// The base of the cudaMalloc address space: the driver model's, when it is a usable one.
std::uint64_t CudaMallocBase(const DriverModel& driver) {
  const std::uint64_t base = driver.address_base;
  return base != 0 && base % kRoundLarge == 0 && base < (std::uint64_t{1} << 47) ? base
                                                                                 : kCudaMallocBase;
}

Pool PoolEnum(std::uint8_t pool) { return pool == kSmallPool ? Pool::kSmall : Pool::kLarge; }

std::uint64_t SaturatingAdd(std::uint64_t a, std::uint64_t b) {
  return a > std::numeric_limits<std::uint64_t>::max() - b
             ? std::numeric_limits<std::uint64_t>::max()
             : a + b;
}

struct BlockRec {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  // The unrounded request of the block's last allocation. Like PyTorch's requested_size it is
  // left stale when the block becomes free, and a merge keeps the surviving block's value.
  std::uint64_t requested = 0;
  std::uint64_t stream = 0;
  std::int64_t gc_base = 0;  // pool search counter when last inserted into the free set (§8)
  BlockId prev = kNil;
  BlockId next = kNil;
  std::uint32_t exp = kNil;  // expandable segment, kNil for a cudaMalloc'd segment
  std::int32_t event_count = 0;
  std::uint8_t pool = kSmallPool;
  bool allocated = false;
  bool mapped = true;
  bool in_free = false;   // in its pool's free set
  bool has_uses = false;  // record_stream recorded another stream (Impl::uses_)
  bool live = false;      // slot in use
};

// Free blocks of one (pool, stream), ordered by (size, address); the streams in ascending
// order around them make PyTorch's (stream, size, address) order. Exact size classes up to
// 2 MiB in the small pool (every cudaMalloc'd small block) and 32 MiB in the large pool, a tree
// above (expandable segments, big segments).
using FreeTree = internal::SegregatedFreeSet<BlockId>;
using FreeKey = FreeTree::Key;
constexpr std::uint32_t kSmallPoolClasses = kSmallBuffer / FreeTree::kGranule;  // 2 MiB
constexpr std::uint32_t kLargePoolClasses = 32 * kMiB / FreeTree::kGranule;     // 32 MiB

struct UnmappedKey {
  std::uint64_t stream;
  std::uint64_t addr;
  BlockId id;  // payload, not compared
};
struct UnmappedKeyLess {
  bool operator()(const UnmappedKey& a, const UnmappedKey& b) const {
    if (a.stream != b.stream) return a.stream < b.stream;
    return a.addr < b.addr;
  }
};
using UnmappedSet = std::pmr::set<UnmappedKey, UnmappedKeyLess>;

struct PoolState {
  PoolState(std::pmr::memory_resource* mr, std::uint32_t size_classes)
      : unmapped(mr), classes(size_classes) {}

  // The free tree of `stream`, or nullptr.
  FreeTree* Find(std::uint64_t stream) const {
    if (stream == last_stream && last_tree != nullptr) return last_tree;
    auto it = std::lower_bound(free.begin(), free.end(), stream,
                               [](const auto& e, std::uint64_t s) { return e.first < s; });
    if (it == free.end() || it->first != stream) return nullptr;
    last_stream = stream;
    last_tree = it->second.get();
    return last_tree;
  }
  FreeTree& Get(std::uint64_t stream) {
    if (FreeTree* t = Find(stream)) return *t;
    auto it = std::lower_bound(free.begin(), free.end(), stream,
                               [](const auto& e, std::uint64_t s) { return e.first < s; });
    it = free.emplace(it, stream, std::make_unique<FreeTree>(classes));
    return *it->second;
  }
  // fn(stream, key, id) over every free block in PyTorch's (stream, size, address) order.
  template <typename Fn>
  void ForEachFree(Fn&& fn) const {
    for (const auto& [stream, tree] : free) {
      for (auto it = tree->begin(); it != tree->end(); ++it) fn(stream, it.key(), it.value());
    }
  }

  std::vector<std::pair<std::uint64_t, std::unique_ptr<FreeTree>>> free;  // by stream
  std::size_t free_count = 0;
  UnmappedSet unmapped;
  std::uint32_t classes;          // exact size classes of the free sets
  std::int64_t search_count = 0;  // §8 get_free_blocks_call_count
  mutable std::uint64_t last_stream = 0;
  mutable FreeTree* last_tree = nullptr;
};

struct ExpSegment {
  std::uint64_t base = 0;
  std::uint64_t va_size = 0;
  std::uint64_t page = 0;
  std::uint64_t stream = 0;
  std::uint64_t mapped = 0;  // bytes currently mapped
  std::uint8_t pool = kSmallPool;
  bool live = false;
};

struct PendingEvent {
  std::uint64_t seq;
  BlockId block;
};
struct StreamEvents {
  std::deque<PendingEvent> queue;  // recording order
  std::uint64_t synced_seq = 0;    // events with seq <= this have completed
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// Impl

struct CachingAllocatorSim::Impl {
  explicit Impl(const SimOptions& options);

  // Blocks.
  BlockId NewBlock();
  void DeleteBlock(BlockId id);
  bool IsSplit(const BlockRec& b) const { return b.prev != kNil || b.next != kNil; }
  bool Allocatable(BlockId id) const;
  void InsertFree(BlockId id);
  void EraseFree(BlockId id);
  void InsertUnmapped(BlockId id);
  void EraseUnmapped(BlockId id);
  std::uint64_t TryMerge(BlockId dst, BlockId src);

  // Settings and the driver.
  bool LimitEnabled() const;
  std::uint64_t LimitBytes() const;
  bool GcEnabled() const;
  std::uint64_t DeviceFree() const;
  // Whether a segment of `bytes` may go at the recorded address `addr`: below the base of the
  // simulator's own placement and clear of the other pinned segments.
  bool PinFits(std::uint64_t addr, std::uint64_t bytes) const;
  std::uint64_t RoundSize(std::uint64_t request) const;
  std::uint64_t MaxSplit() const { return config.max_split_size; }
  // `bytes` >= max_split_size, remembering the largest size ever compared (WouldMatch).
  bool AtLeastMaxSplit(std::uint64_t bytes) {
    probes.split = std::max(probes.split, bytes);
    return bytes >= MaxSplit();
  }
  bool WouldMatch(const AllocatorConfig& other) const;

  // Stats.
  // Inlined: called four to six times per malloc and free, each a few adds.
  [[gnu::always_inline]] void Inc(StatArray& a, std::uint8_t pool, std::uint64_t n) {
    a[0].Increase(static_cast<std::int64_t>(n));
    a[1 + pool].Increase(static_cast<std::int64_t>(n));
  }
  [[gnu::always_inline]] void Dec(StatArray& a, std::uint8_t pool, std::uint64_t n) {
    a[0].Decrease(static_cast<std::int64_t>(n));
    a[1 + pool].Decrease(static_cast<std::int64_t>(n));
  }

  // Events.
  void Emit(Action action, std::uint64_t addr, std::uint64_t size, std::uint64_t stream,
            std::uint64_t block_size = 0, Pool pool = Pool::kUnknown);

  // Allocation (§4).
  Status Malloc(std::uint64_t request, std::uint64_t stream, Allocation* out);
  BlockId GetFreeBlock(std::uint8_t pool, std::uint64_t stream, std::uint64_t size);
  std::uint64_t Potential(BlockId id) const;
  BlockId AllocBlock(std::uint8_t pool, std::uint64_t stream, std::uint64_t size,
                     std::uint64_t alloc_size, bool is_retry);
  BlockId TryAllocateExpandable(std::uint8_t pool, std::uint64_t stream, std::uint64_t size);
  BlockId FindExpandableBlock(std::uint8_t pool, std::uint64_t stream, std::uint64_t size);
  bool HasAddressSpace(BlockId id, std::uint64_t size) const;
  bool MapBlock(BlockId id, std::uint64_t size);
  bool ReleaseAvailableCachedBlocks(std::uint8_t pool, std::uint64_t stream, std::uint64_t size);
  void ReleaseCachedBlocks();
  void ReleaseBlocks(std::uint8_t pool);
  void ReleaseBlock(BlockId id);
  void UnmapBlock(BlockId id);
  void ReleaseExpandableSegment(BlockId id);
  void GarbageCollect();
  BlockId AllocFoundBlock(BlockId id, std::uint64_t request, std::uint64_t size, bool split);
  Status OutOfMemory(std::uint64_t request, std::uint64_t size, std::uint64_t alloc_size,
                     std::uint64_t stream);

  // Free path and events (§5).
  Status Free(std::uint64_t addr);
  void FreeAllocated(BlockId id);
  void FreeBlock(BlockId id);
  void RecordStream(BlockId id, std::uint64_t stream);
  // The address index is built on the first address-based call (Free, RecordStream) and kept
  // from then on; a caller that uses handles only never pays for it.
  void EnsureAddressIndex();
  // A handle-API precondition; checked in builds with FRAGSCOPE_DEBUG_CHECKS.
  void CheckHandle([[maybe_unused]] BlockId id) const {
#if defined(FRAGSCOPE_DEBUG_CHECKS)
    if (id >= blocks.size() || !blocks[id].live || !blocks[id].allocated) {
      std::fprintf(stderr, "CachingAllocatorSim: invalid block handle %u\n", id);
      std::abort();
    }
#endif
  }
  void InsertEvents(BlockId id);
  void ProcessEvents();
  void SynchronizeAndFreeEvents();

  // Queries.
  std::vector<SnapshotSegment> Snapshot() const;
  Status CheckInvariants() const;

  SimOptions options;
  AllocatorConfig config;
  AllocatorRules rules;
  MemoryStats stats;
  std::function<void(const Event&)> sink;
  Event scratch_event;
  std::optional<OomDetails> last_oom;
  std::uint64_t refusals_before_malloc = 0;  // address_space_refusals when Malloc began

  double fraction = 1.0;
  bool fraction_set = false;        // ever set by SetMemoryFraction (PyTorch <= 2.8 gating)
  std::uint64_t initial_max_split;  // for the oversize invariants (§11.2: asymmetric if changed)

  internal::NodeRecycler node_memory;
  std::vector<PoolState> pools;  // [kSmallPool], [kLargePool]
  BigVector<BlockRec> blocks;    // huge pages once large: lookups are random
  std::vector<BlockId> free_ids;
  AddressIndex allocated;          // address -> block id of allocated blocks, if indexed
  bool addresses_indexed = false;  // `allocated` is built and maintained
  std::uint64_t num_allocated = 0;
  std::uint64_t total_reserved = 0;

  std::unordered_map<BlockId, std::vector<std::uint64_t>> uses;  // record_stream streams
  std::map<std::uint64_t, StreamEvents> events;                  // by stream, ascending
  std::uint64_t event_seq = 0;
  bool events_ready = false;  // a sync may have completed events since the last poll

  internal::GranuleSpace cuda_space;
  // Segments placed where driver.segment_address said (address -> bytes), all below
  // cuda_space's base; and how many times it named an address that could not be used.
  std::map<std::uint64_t, std::uint64_t> pinned;
  std::uint64_t pinned_segments = 0;
  std::uint64_t unpinned_segments = 0;
  std::uint64_t address_space_refusals = 0;
  internal::RangeSpace va_space{kReservationBase, kReservationSpan};
  std::vector<ExpSegment> exp_segments;
  std::vector<std::uint32_t> free_exp_ids;

  // What the run so far has compared with the settings that WouldMatch lets differ.
  struct Probes {
    std::uint64_t split = 0;    // largest size compared with max_split_size
    std::uint64_t limit = 0;    // largest reserved + segment size checked against the limit
    std::uint64_t gc = 0;       // largest reserved bytes when garbage collection could start
    bool fallback = false;      // a new segment was refused: release, retry or OOM paths ran
    bool gc_ran = false;        // garbage collection got past its threshold
    bool reconfigured = false;  // SetMemoryFraction or SetAllocatorSettings was called
  } probes;

  std::vector<BlockId> scratch_blocks;  // blocks to release, reused
  std::vector<BlockId> scratch_unmap;   // ReleaseBlocks' unmap list, reused
};

CachingAllocatorSim::Impl::Impl(const SimOptions& opts)
    : options(opts),
      config(opts.config),
      rules(opts.config.Rules()),
      cuda_space(CudaMallocBase(opts.driver), kRoundLarge) {
  pools.reserve(2);
  pools.emplace_back(&node_memory, kSmallPoolClasses);
  pools.emplace_back(&node_memory, kLargePoolClasses);
  // The newest allocator starts from per_process_memory_fraction (§3.2, §7); older ones have
  // no such option and start unlimited.
  if (options.version == ConfigVersion::kNewest) fraction = config.per_process_memory_fraction;
  initial_max_split = config.max_split_size;
  // §11.2: fixed at creation; SIZE_MAX reads as -1.
  stats.max_split_size = static_cast<std::int64_t>(config.max_split_size);
  scratch_event.device = options.device;
  scratch_event.time_us = -1;
}

// ---------------------------------------------------------------------------------------------
// Blocks

BlockId CachingAllocatorSim::Impl::NewBlock() {
  BlockId id;
  if (!free_ids.empty()) {
    id = free_ids.back();
    free_ids.pop_back();
    blocks[id] = BlockRec{};
  } else {
    id = static_cast<BlockId>(blocks.size());
    blocks.emplace_back();
  }
  blocks[id].live = true;
  return id;
}

void CachingAllocatorSim::Impl::DeleteBlock(BlockId id) {
  blocks[id].live = false;
  free_ids.push_back(id);
}

bool CachingAllocatorSim::Impl::Allocatable(BlockId id) const {
  if (id == kNil) return false;
  const BlockRec& b = blocks[id];
  return !b.allocated && b.event_count == 0 && !b.has_uses;
}

void CachingAllocatorSim::Impl::InsertFree(BlockId id) {
  BlockRec& b = blocks[id];
  PoolState& p = pools[b.pool];
  b.gc_base = p.search_count;  // §8: age restarts at insertion
  b.in_free = true;
  p.Get(b.stream).insert(FreeKey{b.size, b.addr}, id);
  ++p.free_count;
}

void CachingAllocatorSim::Impl::EraseFree(BlockId id) {
  BlockRec& b = blocks[id];
  if (!b.in_free) return;
  PoolState& p = pools[b.pool];
  p.Find(b.stream)->erase(FreeKey{b.size, b.addr});
  --p.free_count;
  b.in_free = false;
}

void CachingAllocatorSim::Impl::InsertUnmapped(BlockId id) {
  const BlockRec& b = blocks[id];
  pools[b.pool].unmapped.insert(UnmappedKey{b.stream, b.addr, id});
}

void CachingAllocatorSim::Impl::EraseUnmapped(BlockId id) {
  const BlockRec& b = blocks[id];
  pools[b.pool].unmapped.erase(UnmappedKey{b.stream, b.addr, id});
}

// PyTorch's try_merge_blocks: `dst` absorbs its neighbour `src` if that is free, has no pending
// event or stream use, and has the same mapped state. Returns the bytes absorbed (0 = none).
// REQUIRES: dst is in neither set (its key changes).
std::uint64_t CachingAllocatorSim::Impl::TryMerge(BlockId dst, BlockId src) {
  if (src == kNil) return 0;
  if (!Allocatable(src) || blocks[dst].mapped != blocks[src].mapped) return 0;
  if (blocks[src].mapped)
    EraseFree(src);
  else
    EraseUnmapped(src);
  BlockRec& d = blocks[dst];
  const BlockRec& s = blocks[src];
  if (d.prev == src) {
    d.addr = s.addr;
    d.prev = s.prev;
    if (d.prev != kNil) blocks[d.prev].next = dst;
  } else {
    d.next = s.next;
    if (d.next != kNil) blocks[d.next].prev = dst;
  }
  const std::uint64_t subsumed = s.size;
  d.size += subsumed;
  DeleteBlock(src);
  return subsumed;
}

// ---------------------------------------------------------------------------------------------
// Settings and the driver model

bool CachingAllocatorSim::Impl::LimitEnabled() const {
  // §7: the newest allocator limits iff fraction < 1.0; up to 2.8 any set_per_process_memory_
  // fraction call (even 1.0) turned the limit on.
  if (options.version == ConfigVersion::kNewest) return fraction < 1.0;
  return fraction_set;
}

std::uint64_t CachingAllocatorSim::Impl::LimitBytes() const {
  return static_cast<std::uint64_t>(fraction * static_cast<double>(options.driver.capacity_bytes));
}

bool CachingAllocatorSim::Impl::GcEnabled() const {
  return LimitEnabled() && config.garbage_collection_threshold > 0.0;
}

// Three settings act only through comparisons, which the probes bound:
//   max_split_size:  every size compared with it was below it (probes.split < M) for both;
//   the fraction limit: every new segment stayed within it (probes.limit <= limit bytes);
//   garbage collection: reserved never exceeded its threshold when it could start (probes.gc).
// Once a fallback path ran (release, retry, OOM) or the settings changed at run time, only
// the same settings are known to match.
bool CachingAllocatorSim::Impl::WouldMatch(const AllocatorConfig& other) const {
  if (other == config) return true;
  if (probes.fallback || probes.gc_ran || probes.reconfigured) return false;
  AllocatorConfig a = config;
  AllocatorConfig b = other;
  for (AllocatorConfig* c : {&a, &b}) {
    c->max_split_size = 0;
    c->garbage_collection_threshold = 0.0;
    c->per_process_memory_fraction = 1.0;
  }
  if (!(a == b)) return false;
  if (other.max_split_size != config.max_split_size &&
      probes.split >= std::min(other.max_split_size, config.max_split_size)) {
    return false;
  }
  // The other run's limit, as the constructor and LimitEnabled/LimitBytes would set it (no
  // SetMemoryFraction call was made, so before 2.9 the limit is off).
  if (options.version != ConfigVersion::kNewest || !(other.per_process_memory_fraction < 1.0)) {
    return true;
  }
  const auto limit = static_cast<std::uint64_t>(other.per_process_memory_fraction *
                                                static_cast<double>(options.driver.capacity_bytes));
  if (probes.limit > limit) return false;
  if (other.garbage_collection_threshold > 0.0) {
    const auto gc_threshold =
        static_cast<std::uint64_t>(other.garbage_collection_threshold * static_cast<double>(limit));
    if (probes.gc > gc_threshold) return false;
  }
  return true;
}

std::uint64_t CachingAllocatorSim::Impl::DeviceFree() const {
  const std::uint64_t used = SaturatingAdd(options.driver.used_by_others_bytes, total_reserved);
  return options.driver.capacity_bytes > used ? options.driver.capacity_bytes - used : 0;
}

std::uint64_t CachingAllocatorSim::Impl::RoundSize(std::uint64_t request) const {
  if (options.version == ConfigVersion::kNewest) return rules.RoundSize(request);
  // §4.1 as PyTorch 1.13-2.5 wrote it: 1.13 skipped power-2 rounding above
  // roundup_bypass_threshold_mb, and divisions were tested with "> 0", where a division count
  // of 1 returned the request unrounded (roundup_power2_next_division: divisions <= 1 -> size).
  if (request < kMinBlockSize) return kMinBlockSize;
  const std::uint64_t plain = kMinBlockSize * ((request + kMinBlockSize - 1) / kMinBlockSize);
  if (options.version == ConfigVersion::kV1_13 && request > config.roundup_bypass_threshold) {
    return plain;
  }
  const int k = 63 - std::countl_zero(request);
  const int index = std::clamp(k - 20, 0, kRoundupIntervals - 1);
  const std::uint64_t divisions = config.roundup_power2_divisions[static_cast<std::size_t>(index)];
  // request <= 512 * divisions, without overflowing for huge division counts.
  if (divisions == 0 || plain / kMinBlockSize <= divisions) return plain;
  if (divisions <= 1 || std::has_single_bit(request)) return request;
  const std::uint64_t floor = std::bit_floor(request);
  const std::uint64_t step = floor >> (63 - std::countl_zero(divisions));
  if (step == 0) return floor << 1;
  const std::uint64_t down = request & ~(step - 1);
  return down == request ? request : down + step;
}

// ---------------------------------------------------------------------------------------------
// Events out

void CachingAllocatorSim::Impl::Emit(Action action, std::uint64_t addr, std::uint64_t size,
                                     std::uint64_t stream, std::uint64_t block_size, Pool pool) {
  if (!sink) return;
  Event& e = scratch_event;
  e.action = action;
  e.stream = stream;
  e.addr = addr;
  e.size = size;
  e.block_size = block_size;
  e.pool = pool;
  e.device_free.reset();
  sink(e);
}

// ---------------------------------------------------------------------------------------------
// Allocation (§4)

Status CachingAllocatorSim::Impl::Malloc(std::uint64_t request, std::uint64_t stream,
                                         Allocation* out) {
  if (request >= kOneExbibyte) {
    // PyTorch's allocate() refuses before the allocator runs: no trace entry, no stats.
    OomDetails details;
    details.requested = request;
    details.device_total = options.driver.capacity_bytes;
    details.device_free = DeviceFree();
    details.allocated = static_cast<std::uint64_t>(stats.allocated_bytes[0].current);
    details.reserved = static_cast<std::uint64_t>(stats.reserved_bytes[0].current);
    details.message = "CUDA out of memory. Tried to allocate more than 1EB memory.";
    last_oom = details;
    return Status::OutOfMemory(details.message);
  }
  if (request == 0) {  // §2: a null pointer, the allocator is not called
    *out = Allocation{};
    return Status::Ok();
  }
  ProcessEvents();  // §4.0 step 1
  refusals_before_malloc = address_space_refusals;
  const std::uint64_t size = RoundSize(request);
  const std::uint8_t pool = size <= kSmallSize ? kSmallPool : kLargePool;
  const std::uint64_t alloc_size = AllocatorRules::SegmentSize(size);
  probes.split = std::max(probes.split, size);  // ShouldSplit compares it

  BlockId block = GetFreeBlock(pool, stream, size);
  if (block == kNil) {
    probes.gc = std::max(probes.gc, total_reserved);
    if (GcEnabled()) GarbageCollect();                          // 4a
    block = AllocBlock(pool, stream, size, alloc_size, false);  // 4b
    if (block == kNil) probes.fallback = true;
    if (block == kNil && ReleaseAvailableCachedBlocks(pool, stream, size)) {
      block = AllocBlock(pool, stream, size, alloc_size, false);  // 4c
    }
    if (block == kNil) {
      ReleaseCachedBlocks();  // 4d
      block = AllocBlock(pool, stream, size, alloc_size, true);
    }
  }
  if (block == kNil) return OutOfMemory(request, size, alloc_size, stream);
  const bool split = rules.ShouldSplit(PoolEnum(pool), blocks[block].size, size);
  block = AllocFoundBlock(block, request, size, split);
  *out = Allocation{blocks[block].addr, block};
  return Status::Ok();
}

std::uint64_t CachingAllocatorSim::Impl::Potential(BlockId id) const {
  const BlockRec& b = blocks[id];
  return b.size + (b.next != kNil && !blocks[b.next].mapped ? blocks[b.next].size : 0);
}

// §4.4 best fit, with the expandable-segment rules and the oversize rules.
BlockId CachingAllocatorSim::Impl::GetFreeBlock(std::uint8_t pool, std::uint64_t stream,
                                                std::uint64_t size) {
  PoolState& p = pools[pool];
  if (GcEnabled()) ++p.search_count;
  FreeTree* tree = p.Find(stream);
  if (tree == nullptr) return kNil;
  auto it = tree->lower_bound(FreeKey{size, 0});
  if (it == tree->end()) return kNil;  // nothing of this stream is large enough
  if (blocks[it.value()].exp != kNil) {
    if (config.expandable_segments) {
      // Rank by the size the block could grow to: the free tail of a growing segment is last.
      auto next = it;
      ++next;
      while (blocks[it.value()].exp != kNil && next != tree->end() &&
             Potential(next.value()) < Potential(it.value())) {
        it = next;
        ++next;
      }
    } else {
      // Expandable segments were turned off: only non-expandable blocks may serve (§6.3).
      do {
        ++it;
      } while (it != tree->end() && blocks[it.value()].exp != kNil);
      if (it == tree->end()) return kNil;
    }
  }
  const BlockId id = it.value();
  const std::uint64_t found = blocks[id].size;
  const bool oversize_request = AtLeastMaxSplit(size);
  const bool oversize_block = AtLeastMaxSplit(found);
  if (!oversize_request && oversize_block) return kNil;
  if (oversize_request && found >= SaturatingAdd(size, config.max_non_split_rounding)) {
    return kNil;
  }
  tree->erase(it);
  --p.free_count;
  blocks[id].in_free = false;
  return id;
}

// §4.5 alloc_block: the fraction limit, then an expandable mapping or a cudaMalloc.
BlockId CachingAllocatorSim::Impl::AllocBlock(std::uint8_t pool, std::uint64_t stream,
                                              std::uint64_t size, std::uint64_t alloc_size,
                                              bool is_retry) {
  if (is_retry) ++stats.num_alloc_retries;
  const std::uint64_t reserved_after = SaturatingAdd(total_reserved, alloc_size);
  probes.limit = std::max(probes.limit, reserved_after);
  if (LimitEnabled() && reserved_after > LimitBytes()) return kNil;
  if (config.expandable_segments) return TryAllocateExpandable(pool, stream, size);
  if (alloc_size > DeviceFree()) return kNil;  // cudaMalloc: out of memory
  std::uint64_t addr = 0;
  if (options.driver.segment_address) {
    const std::uint64_t wanted = options.driver.segment_address(alloc_size);
    if (wanted != 0 && PinFits(wanted, alloc_size)) {
      pinned.emplace(wanted, alloc_size);
      addr = wanted;
      ++pinned_segments;
    } else if (wanted != 0) {
      ++unpinned_segments;
    }
  }
  if (addr == 0) addr = cuda_space.Allocate(alloc_size);
  if (addr == 0) {  // beyond the modelled address space (> 32 TiB of segments)
    ++address_space_refusals;
    return kNil;
  }
  const BlockId id = NewBlock();
  BlockRec& b = blocks[id];
  b.addr = addr;
  b.size = alloc_size;
  b.stream = stream;
  b.pool = pool;
  total_reserved += alloc_size;
  Inc(stats.segment, pool, 1);
  Inc(stats.reserved_bytes, pool, alloc_size);
  if (AtLeastMaxSplit(alloc_size)) stats.oversize_segments.Increase(1);
  ++stats.num_device_alloc;
  Emit(Action::kSegmentAlloc, addr, alloc_size, stream, 0, PoolEnum(pool));
  return id;
}

bool CachingAllocatorSim::Impl::PinFits(std::uint64_t addr, std::uint64_t bytes) const {
  if (bytes > cuda_space.base() || addr > cuda_space.base() - bytes) return false;
  const auto next = pinned.lower_bound(addr);
  if (next != pinned.end() && next->first < addr + bytes) return false;
  return next == pinned.begin() || std::prev(next)->first + std::prev(next)->second <= addr;
}

// §6.2: map pages at the lowest address where free and unmapped space of this stream's
// expandable segments holds `size` bytes.
BlockId CachingAllocatorSim::Impl::TryAllocateExpandable(std::uint8_t pool, std::uint64_t stream,
                                                         std::uint64_t size) {
  BlockId candidate = FindExpandableBlock(pool, stream, size);
  if (candidate == kNil) return kNil;
  if (!blocks[candidate].mapped && !MapBlock(candidate, std::min(blocks[candidate].size, size))) {
    return kNil;
  }
  while (blocks[candidate].size < size) {
    // The candidate is free and followed by unmapped space; map some of it, which merges.
    const BlockId next = blocks[candidate].next;
    if (next == kNil || blocks[next].mapped) return kNil;  // cannot happen: space was checked
    const std::uint64_t remaining = size - blocks[candidate].size;
    if (!MapBlock(next, std::min(remaining, blocks[next].size))) return kNil;
    candidate = next;
  }
  EraseFree(candidate);
  return candidate;
}

bool CachingAllocatorSim::Impl::HasAddressSpace(BlockId id, std::uint64_t size) const {
  std::uint64_t bytes = 0;
  while (bytes < size && Allocatable(id)) {
    bytes += blocks[id].size;
    id = blocks[id].next;
  }
  return bytes >= size;
}

BlockId CachingAllocatorSim::Impl::FindExpandableBlock(std::uint8_t pool, std::uint64_t stream,
                                                       std::uint64_t size) {
  UnmappedSet& unmapped = pools[pool].unmapped;
  for (auto it = unmapped.lower_bound(UnmappedKey{stream, 0, kNil});
       it != unmapped.end() && it->stream == stream; ++it) {
    BlockId c = it->id;
    // A free block just before the unmapped range extends the run downwards.
    if (Allocatable(blocks[c].prev)) c = blocks[c].prev;
    if (HasAddressSpace(c, size)) return c;
  }
  // A new segment: a reservation of ceil((T + T/8) / page) pages (§6.1).
  const std::uint64_t page = pool == kSmallPool ? kSmallBuffer : kLargeBuffer;
  const std::uint64_t total = options.driver.capacity_bytes;
  const std::uint64_t pages = (total + total / 8 + page - 1) / page;
  const std::uint64_t va_size = pages * page;
  if (va_size == 0) return kNil;  // a device without memory
  // One page of gap keeps two reservations from ever touching (DeviceMemory would join them).
  const std::uint64_t base = va_space.Allocate(va_size + page);
  if (base == 0) {
    ++address_space_refusals;
    return kNil;
  }
  std::uint32_t seg_id;
  if (!free_exp_ids.empty()) {
    seg_id = free_exp_ids.back();
    free_exp_ids.pop_back();
  } else {
    seg_id = static_cast<std::uint32_t>(exp_segments.size());
    exp_segments.emplace_back();
  }
  exp_segments[seg_id] = ExpSegment{base, va_size, page, stream, 0, pool, true};
  const BlockId id = NewBlock();
  BlockRec& b = blocks[id];
  b.addr = base;
  b.size = va_size;
  b.stream = stream;
  b.pool = pool;
  b.exp = seg_id;
  b.mapped = false;
  InsertUnmapped(id);
  return id;
}

// PyTorch's map_block: map the whole pages covering the first `size` bytes of the unmapped
// block `id`; the rest stays unmapped. Fails, changing nothing, if the driver lacks the pages.
bool CachingAllocatorSim::Impl::MapBlock(BlockId id, std::uint64_t size) {
  const ExpSegment& seg = exp_segments[blocks[id].exp];
  const std::uint64_t page = seg.page;
  const std::uint64_t begin = (blocks[id].addr - seg.base) / page;
  const std::uint64_t end = (blocks[id].addr - seg.base + size + page - 1) / page;
  const std::uint64_t bytes = (end - begin) * page;
  if (bytes == 0 || bytes > DeviceFree()) return false;
  EraseUnmapped(id);
  blocks[id].mapped = true;
  const std::uint64_t map_addr = blocks[id].addr;
  if (bytes < blocks[id].size) {
    const BlockId rest = NewBlock();
    BlockRec& r = blocks[rest];
    BlockRec& b = blocks[id];
    r.addr = b.addr + bytes;
    r.size = b.size - bytes;
    r.stream = b.stream;
    r.pool = b.pool;
    r.exp = b.exp;
    r.mapped = false;
    r.prev = id;
    r.next = b.next;
    if (b.next != kNil) blocks[b.next].prev = rest;
    b.next = rest;
    b.size = bytes;
    InsertUnmapped(rest);
  }
  TryMerge(id, blocks[id].prev);
  TryMerge(id, blocks[id].next);
  InsertFree(id);
  const std::uint8_t pool = blocks[id].pool;
  total_reserved += bytes;
  exp_segments[blocks[id].exp].mapped += bytes;
  Inc(stats.reserved_bytes, pool, bytes);  // §6.2: `segment` does not move
  ++stats.num_device_alloc;
  Emit(Action::kSegmentMap, map_addr, bytes, blocks[id].stream, 0, PoolEnum(pool));
  return true;
}

// §4.6 release_available_cached_blocks.
bool CachingAllocatorSim::Impl::ReleaseAvailableCachedBlocks(std::uint8_t pool,
                                                             std::uint64_t stream,
                                                             std::uint64_t size) {
  if (MaxSplit() == kUnlimited) return false;
  // Per-stream trees: "the block before" can only be of this stream when it exists at all in
  // this tree, so reaching the tree's front ends the walk as PyTorch's stream check does.
  FreeTree* tree = pools[pool].Find(stream);
  if (tree == nullptr) return false;
  const std::uint64_t target = size < MaxSplit() ? MaxSplit() : size;
  auto it = tree->lower_bound(FreeKey{target, 0});
  if (it == tree->end() || blocks[it.value()].exp != kNil) {
    // No single block is large enough: free oversize blocks from the largest down. The walk
    // is decided first and the blocks released afterwards; releasing only removes blocks the
    // walk has passed, so this is PyTorch's interleaved loop.
    if (it == tree->begin()) return false;
    std::uint64_t released = 0;
    --it;
    scratch_blocks.clear();
    while (released < target && blocks[it.value()].size >= MaxSplit()) {
      const auto cur = it;
      const bool is_first = cur == tree->begin();
      if (!is_first) --it;
      const BlockId id = cur.value();
      if (blocks[id].exp == kNil) {
        released += blocks[id].size;
        scratch_blocks.push_back(id);
      }
      if (is_first) break;
    }
    for (const BlockId id : scratch_blocks) ReleaseBlock(id);
    return released >= target;  // blocks already freed stay freed
  }
  ReleaseBlock(it.value());
  return true;
}

// §4.7 release_cached_blocks (also empty_cache).
void CachingAllocatorSim::Impl::ReleaseCachedBlocks() {
  SynchronizeAndFreeEvents();
  ReleaseBlocks(kLargePool);
  ReleaseBlocks(kSmallPool);
}

void CachingAllocatorSim::Impl::ReleaseBlocks(std::uint8_t pool) {
  // PyTorch walks the free set, cudaFrees unsplit blocks as it goes and unmaps expandable ones
  // afterwards. Releasing an unsplit block touches no other block, so collecting first and
  // acting in the same order is equivalent.
  scratch_blocks.clear();
  pools[pool].ForEachFree(
      [this](std::uint64_t, const FreeKey&, BlockId id) { scratch_blocks.push_back(id); });
  scratch_unmap.clear();
  for (const BlockId id : scratch_blocks) {
    if (blocks[id].exp != kNil) {
      scratch_unmap.push_back(id);
    } else if (!IsSplit(blocks[id])) {
      ReleaseBlock(id);
    }
  }
  for (const BlockId id : scratch_unmap) {
    UnmapBlock(id);
    if (!blocks[id].mapped && !IsSplit(blocks[id])) ReleaseExpandableSegment(id);
  }
}

// cudaFree of a whole cached segment.
void CachingAllocatorSim::Impl::ReleaseBlock(BlockId id) {
  BlockRec& b = blocks[id];
  ++stats.num_device_free;
  Emit(Action::kSegmentFree, b.addr, b.size, b.stream, 0, PoolEnum(b.pool));
  if (!pinned.erase(b.addr)) cuda_space.Free(b.addr, b.size);
  total_reserved -= b.size;
  Dec(stats.segment, b.pool, 1);
  Dec(stats.reserved_bytes, b.pool, b.size);
  if (AtLeastMaxSplit(b.size)) stats.oversize_segments.Decrease(1);
  EraseFree(id);
  DeleteBlock(id);
}

// §6.4: unmap the whole pages inside the free block `id`; partial pages at either end stay
// mapped as new free blocks; the unmapped range merges with unmapped neighbours.
void CachingAllocatorSim::Impl::UnmapBlock(BlockId id) {
  const ExpSegment& seg = exp_segments[blocks[id].exp];
  const std::uint64_t page = seg.page;
  const std::uint64_t rel = blocks[id].addr - seg.base;
  const std::uint64_t begin = (rel + page - 1) / page;
  const std::uint64_t end = (rel + blocks[id].size) / page;
  if (begin >= end) return;
  const std::uint64_t unmap_addr = seg.base + begin * page;
  const std::uint64_t unmap_size = (end - begin) * page;
  EraseFree(id);
  const std::uint64_t before = unmap_addr - blocks[id].addr;
  if (before > 0) {
    const BlockId bf = NewBlock();
    BlockRec& f = blocks[bf];
    BlockRec& b = blocks[id];
    f.addr = b.addr;
    f.size = before;
    f.stream = b.stream;
    f.pool = b.pool;
    f.exp = b.exp;
    f.prev = b.prev;
    f.next = id;
    if (b.prev != kNil) blocks[b.prev].next = bf;
    b.prev = bf;
    InsertFree(bf);
  }
  const std::uint64_t after = blocks[id].size - before - unmap_size;
  if (after > 0) {
    const BlockId af = NewBlock();
    BlockRec& f = blocks[af];
    BlockRec& b = blocks[id];
    f.addr = unmap_addr + unmap_size;
    f.size = after;
    f.stream = b.stream;
    f.pool = b.pool;
    f.exp = b.exp;
    f.prev = id;
    f.next = b.next;
    if (b.next != kNil) blocks[b.next].prev = af;
    b.next = af;
    InsertFree(af);
  }
  {
    BlockRec& b = blocks[id];
    b.addr = unmap_addr;
    b.size = unmap_size;
    b.mapped = false;
  }
  TryMerge(id, blocks[id].prev);
  TryMerge(id, blocks[id].next);
  InsertUnmapped(id);
  const std::uint8_t pool = blocks[id].pool;
  total_reserved -= unmap_size;
  exp_segments[blocks[id].exp].mapped -= unmap_size;
  Dec(stats.reserved_bytes, pool, unmap_size);
  ++stats.num_device_free;
  Emit(Action::kSegmentUnmap, unmap_addr, unmap_size, blocks[id].stream, 0, PoolEnum(pool));
}

void CachingAllocatorSim::Impl::ReleaseExpandableSegment(BlockId id) {
  const std::uint32_t seg_id = blocks[id].exp;
  ExpSegment& seg = exp_segments[seg_id];
  EraseUnmapped(id);
  DeleteBlock(id);
  va_space.Free(seg.base, seg.va_size + seg.page);
  seg.live = false;
  free_exp_ids.push_back(seg_id);
}

// §8 garbage_collect_cached_blocks.
void CachingAllocatorSim::Impl::GarbageCollect() {
  const auto gc_threshold = static_cast<std::uint64_t>(config.garbage_collection_threshold *
                                                       static_cast<double>(LimitBytes()));
  if (total_reserved <= gc_threshold) return;
  probes.gc_ran = true;
  const std::uint64_t target = total_reserved - gc_threshold;
  PoolState& large = pools[kLargePool];
  auto age = [&large](const BlockRec& b) {
    return static_cast<std::uint64_t>(large.search_count - b.gc_base);
  };
  std::uint64_t total_age = 0;
  std::int64_t freeable = 0;
  large.ForEachFree([&](std::uint64_t, const FreeKey&, BlockId id) {
    if (!IsSplit(blocks[id])) {
      total_age += age(blocks[id]);
      ++freeable;
    }
  });
  if (freeable == 0) return;
  std::uint64_t reclaimed = 0;
  bool block_freed = true;
  while (reclaimed < target && block_freed && freeable > 0) {
    const double age_threshold = static_cast<double>(total_age) / static_cast<double>(freeable);
    block_freed = false;
    // Every block at least as old as the average goes, even past the target. Eligibility
    // within a pass does not depend on other releases: collect, then release in set order.
    scratch_blocks.clear();
    large.ForEachFree([&](std::uint64_t, const FreeKey&, BlockId id) {
      const BlockRec& b = blocks[id];
      if (!IsSplit(b) && b.exp == kNil && static_cast<double>(age(b)) >= age_threshold) {
        block_freed = true;
        reclaimed += b.size;
        total_age -= age(b);
        --freeable;
        scratch_blocks.push_back(id);
      }
    });
    for (const BlockId id : scratch_blocks) ReleaseBlock(id);
  }
}

// §4.8 split and hand-out, with the §11.3 inactive_split accounting.
BlockId CachingAllocatorSim::Impl::AllocFoundBlock(BlockId id, std::uint64_t request,
                                                   std::uint64_t size, bool split) {
  const bool already_split = IsSplit(blocks[id]);
  const bool expandable = blocks[id].exp != kNil;
  const std::uint8_t pool = blocks[id].pool;
  if (split) {
    // The allocation takes the lower address; the remainder (the old block) stays cached.
    const BlockId remaining = id;
    id = NewBlock();
    BlockRec& r = blocks[remaining];
    BlockRec& a = blocks[id];
    a.addr = r.addr;
    a.size = size;
    a.stream = r.stream;
    a.pool = r.pool;
    a.exp = r.exp;
    a.prev = r.prev;
    a.next = remaining;
    if (a.prev != kNil) blocks[a.prev].next = id;
    r.prev = id;
    r.addr += size;
    r.size -= size;
    InsertFree(remaining);
    if (!expandable) {
      if (already_split) {
        Dec(stats.inactive_split_bytes, pool, size);
      } else {
        Inc(stats.inactive_split_bytes, pool, blocks[remaining].size);
        Inc(stats.inactive_split, pool, 1);
      }
    }
  } else if (already_split && !expandable) {
    Dec(stats.inactive_split_bytes, pool, blocks[id].size);
    Dec(stats.inactive_split, pool, 1);
  }
  BlockRec& a = blocks[id];
  a.allocated = true;
  a.requested = request;
  if (addresses_indexed) allocated.Insert(a.addr, id);
  ++num_allocated;
  Emit(Action::kAlloc, a.addr, request, a.stream, a.size);
  Inc(stats.allocation, pool, 1);
  Inc(stats.allocated_bytes, pool, a.size);
  Inc(stats.active, pool, 1);
  Inc(stats.active_bytes, pool, a.size);
  Inc(stats.requested_bytes, pool, request);
  if (AtLeastMaxSplit(a.size)) stats.oversize_allocations.Increase(1);
  return id;
}

// §12: the OOM event, num_ooms and PyTorch's message.
Status CachingAllocatorSim::Impl::OutOfMemory(std::uint64_t request, std::uint64_t size,
                                              std::uint64_t alloc_size, std::uint64_t stream) {
  const std::uint64_t device_free = DeviceFree();
  const std::uint64_t device_total = options.driver.capacity_bytes;
  std::optional<std::uint64_t> limit;
  if (LimitEnabled()) limit = LimitBytes();
  if (sink) {
    // PyTorch's trace entry carries the rounded size (params.size()) and the driver's free bytes.
    Event& e = scratch_event;
    e.action = Action::kOom;
    e.stream = stream;
    e.addr = 0;
    e.size = size;
    e.block_size = 0;
    e.pool = Pool::kUnknown;
    e.device_free = device_free;
    sink(e);
  }
  ++stats.num_ooms;
  const auto allocated_bytes = static_cast<std::uint64_t>(stats.allocated_bytes[0].current);
  const auto reserved_bytes = static_cast<std::uint64_t>(stats.reserved_bytes[0].current);
  const std::string allowed = limit ? FormatBytesLikePyTorch(*limit) + " allowed; " : std::string();
  std::string message;
  if (options.version == ConfigVersion::kV1_13) {
    // §12.2 (PyTorch 1.10-2.1).
    message = fmt::format(
        "CUDA out of memory. Tried to allocate {} (GPU {}; {} total capacity; {} already "
        "allocated; {} free; {}{} reserved in total by PyTorch) If reserved memory is >> "
        "allocated memory try setting max_split_size_mb to avoid fragmentation.  See "
        "documentation for Memory Management and PYTORCH_CUDA_ALLOC_CONF",
        FormatBytesLikePyTorch(alloc_size), options.device, FormatBytesLikePyTorch(device_total),
        FormatBytesLikePyTorch(allocated_bytes), FormatBytesLikePyTorch(device_free), allowed,
        FormatBytesLikePyTorch(reserved_bytes));
  } else {
    // §12.1. No NVML process list ({P} empty) and no private pools ({Q} empty, nothing added
    // to the allocated figure): the simulator models neither.
    message = fmt::format(
        "CUDA out of memory. Tried to allocate {}. GPU {} has a total capacity of {} of which {} "
        "is free. {}Of the allocated memory {} is allocated by PyTorch, and {} is reserved by "
        "PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
        "documentation for Memory Management  "
        "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)",
        FormatBytesLikePyTorch(alloc_size), options.device, FormatBytesLikePyTorch(device_total),
        FormatBytesLikePyTorch(device_free), allowed, FormatBytesLikePyTorch(allocated_bytes),
        FormatBytesLikePyTorch(reserved_bytes - allocated_bytes));
  }
  OomDetails details;
  details.requested = request;
  details.rounded = size;
  details.reported = alloc_size;
  details.device_total = device_total;
  details.device_free = device_free;
  details.allocated = allocated_bytes;
  details.reserved = reserved_bytes;
  details.limit = limit;
  details.message = message;
  details.address_space_full = address_space_refusals > refusals_before_malloc;
  last_oom = std::move(details);
  return Status::OutOfMemory(std::move(message));
}

// ---------------------------------------------------------------------------------------------
// Free path and events (§5)

Status CachingAllocatorSim::Impl::Free(std::uint64_t addr) {
  if (addr == 0) return Status::Ok();  // free(nullptr) is a no-op
  EnsureAddressIndex();
  const BlockId id = allocated.Find(addr);
  if (id == AddressIndex::kNotFound) {
    return Status::InvalidArgument(fmt::format("invalid device pointer: {:#x}", addr));
  }
  FreeAllocated(id);
  return Status::Ok();
}

void CachingAllocatorSim::Impl::EnsureAddressIndex() {
  if (addresses_indexed) return;
  addresses_indexed = true;
  for (BlockId id = 0; id < blocks.size(); ++id) {
    if (blocks[id].live && blocks[id].allocated) allocated.Insert(blocks[id].addr, id);
  }
}

// REQUIRES: `id` is allocated.
void CachingAllocatorSim::Impl::FreeAllocated(BlockId id) {
  BlockRec& b = blocks[id];
  if (addresses_indexed) allocated.Erase(b.addr);
  --num_allocated;
  b.allocated = false;
  Dec(stats.allocation, b.pool, 1);
  Dec(stats.allocated_bytes, b.pool, b.size);
  Emit(Action::kFreeRequested, b.addr, b.requested, b.stream);
  if (AtLeastMaxSplit(b.size)) stats.oversize_allocations.Decrease(1);
  if (b.has_uses) {
    InsertEvents(id);
  } else {
    FreeBlock(id);
  }
}

void CachingAllocatorSim::Impl::RecordStream(BlockId id, std::uint64_t stream) {
  BlockRec& b = blocks[id];
  if (stream == b.stream) return;  // uses on the allocation stream need nothing
  std::vector<std::uint64_t>& streams = uses[id];
  if (std::find(streams.begin(), streams.end(), stream) == streams.end()) {
    streams.push_back(stream);
  }
  b.has_uses = true;
}

// §5.3 free_block: merge with prev then next, cache, update stats by the net effect.
void CachingAllocatorSim::Impl::FreeBlock(BlockId id) {
  {
    const BlockRec& b = blocks[id];
    Emit(Action::kFreeCompleted, b.addr, b.requested, b.stream);
  }
  const std::uint64_t original_size = blocks[id].size;
  const std::uint64_t requested = blocks[id].requested;
  const std::uint8_t pool = blocks[id].pool;
  std::int64_t net_blocks = 0;
  std::int64_t net_bytes = 0;
  const BlockId candidates[2] = {blocks[id].prev, blocks[id].next};
  for (const BlockId c : candidates) {
    const std::uint64_t subsumed = TryMerge(id, c);
    if (subsumed > 0) {
      net_blocks -= 1;
      net_bytes -= static_cast<std::int64_t>(subsumed);
    }
  }
  InsertFree(id);
  const BlockRec& b = blocks[id];
  if (IsSplit(b)) {
    net_blocks += 1;
    net_bytes += static_cast<std::int64_t>(b.size);
  }
  if (b.exp == kNil) {  // expandable blocks are excluded from inactive_split (§6.3)
    if (net_blocks > 0) Inc(stats.inactive_split, pool, static_cast<std::uint64_t>(net_blocks));
    if (net_blocks < 0) Dec(stats.inactive_split, pool, static_cast<std::uint64_t>(-net_blocks));
    if (net_bytes > 0) Inc(stats.inactive_split_bytes, pool, static_cast<std::uint64_t>(net_bytes));
    if (net_bytes < 0) {
      Dec(stats.inactive_split_bytes, pool, static_cast<std::uint64_t>(-net_bytes));
    }
  }
  Dec(stats.active, pool, 1);
  Dec(stats.active_bytes, pool, original_size);
  Dec(stats.requested_bytes, pool, requested);
}

// One event per recorded stream, in ascending stream order (PyTorch iterates a hash set).
void CachingAllocatorSim::Impl::InsertEvents(BlockId id) {
  auto node = uses.find(id);
  std::vector<std::uint64_t> streams = std::move(node->second);
  uses.erase(node);
  std::sort(streams.begin(), streams.end());
  blocks[id].has_uses = false;
  for (const std::uint64_t s : streams) {
    ++blocks[id].event_count;
    events[s].queue.push_back(PendingEvent{++event_seq, id});
  }
}

// §5.2 process_events: per stream, pop completed events from the front; a block whose last
// event completes becomes cached.
void CachingAllocatorSim::Impl::ProcessEvents() {
  if (!events_ready) return;
  events_ready = false;
  for (auto it = events.begin(); it != events.end();) {
    StreamEvents& se = it->second;
    while (!se.queue.empty() && se.queue.front().seq <= se.synced_seq) {
      const BlockId id = se.queue.front().block;
      se.queue.pop_front();
      if (--blocks[id].event_count == 0) FreeBlock(id);
    }
    it = se.queue.empty() ? events.erase(it) : std::next(it);
  }
}

// §4.7 step 1: wait for every outstanding event.
void CachingAllocatorSim::Impl::SynchronizeAndFreeEvents() {
  ++stats.num_sync_all_streams;
  for (auto& [stream, se] : events) {
    for (const PendingEvent& pe : se.queue) {
      if (--blocks[pe.block].event_count == 0) FreeBlock(pe.block);
    }
  }
  events.clear();
  events_ready = false;
}

// ---------------------------------------------------------------------------------------------
// Snapshot and invariants

std::vector<SnapshotSegment> CachingAllocatorSim::Impl::Snapshot() const {
  // One segment per contiguous mapped range: a mapped block whose prev is absent or unmapped
  // starts one (§6.4, PyTorch's snapshot()).
  std::vector<BlockId> heads;
  for (BlockId id = 0; id < blocks.size(); ++id) {
    const BlockRec& b = blocks[id];
    if (b.live && b.mapped && (b.prev == kNil || !blocks[b.prev].mapped)) heads.push_back(id);
  }
  std::sort(heads.begin(), heads.end(),
            [this](BlockId a, BlockId b) { return blocks[a].addr < blocks[b].addr; });
  std::vector<SnapshotSegment> out;
  out.reserve(heads.size());
  for (const BlockId head : heads) {
    SnapshotSegment seg;
    const BlockRec& h = blocks[head];
    seg.device = options.device;
    seg.address = h.addr;
    seg.stream = h.stream;
    seg.segment_type = h.pool == kSmallPool ? "small" : "large";
    seg.is_expandable = h.exp != kNil;
    for (BlockId id = head; id != kNil && blocks[id].mapped; id = blocks[id].next) {
      const BlockRec& b = blocks[id];
      SnapshotBlock sb;
      sb.address = b.addr;
      sb.size = b.size;
      sb.requested_size = b.requested;
      const bool active = b.allocated || b.event_count > 0 || b.has_uses;
      sb.state = b.allocated ? "active_allocated" : active ? "active_pending_free" : "inactive";
      seg.total_size += b.size;
      if (b.allocated) seg.allocated_size += b.size;
      if (active) {
        seg.active_size += b.size;
        seg.requested_size += b.requested;
      }
      seg.blocks.push_back(std::move(sb));
    }
    out.push_back(std::move(seg));
  }
  return out;
}

Status CachingAllocatorSim::Impl::CheckInvariants() const {
  auto fail = [](std::string msg) { return Status::Internal("sim invariant violated: " + msg); };
  // Blocks and links.
  std::array<std::uint64_t, 2> free_count{}, unmapped_count{};
  std::uint64_t allocated_count = 0;
  for (BlockId id = 0; id < blocks.size(); ++id) {
    const BlockRec& b = blocks[id];
    if (!b.live) continue;
    if (b.size == 0) return fail(fmt::format("block {:#x} has size 0", b.addr));
    if (b.prev != kNil) {
      const BlockRec& p = blocks[b.prev];
      if (!p.live || p.next != id || p.addr + p.size != b.addr || p.stream != b.stream ||
          p.pool != b.pool || p.exp != b.exp) {
        return fail(fmt::format("block {:#x}: bad prev link", b.addr));
      }
    }
    if (b.next != kNil) {
      const BlockRec& n = blocks[b.next];
      if (!n.live || n.prev != id || b.addr + b.size != n.addr) {
        return fail(fmt::format("block {:#x}: bad next link", b.addr));
      }
    }
    if (!b.mapped && b.exp == kNil) return fail(fmt::format("block {:#x} unmapped", b.addr));
    if (b.event_count < 0) return fail(fmt::format("block {:#x}: negative events", b.addr));
    if (b.has_uses != (uses.count(id) != 0)) {
      return fail(fmt::format("block {:#x}: stream-use flag out of sync", b.addr));
    }
    const bool cached = b.mapped && !b.allocated && b.event_count == 0 && !b.has_uses;
    if (b.in_free != cached) {
      return fail(
          fmt::format("block {:#x}: in free set {} but cached {}", b.addr, b.in_free, cached));
    }
    if (!b.mapped && (b.allocated || b.event_count != 0 || b.has_uses)) {
      return fail(fmt::format("unmapped block {:#x} is in use", b.addr));
    }
    if (cached && b.next != kNil && blocks[b.next].in_free) {
      return fail(fmt::format("cached neighbours {:#x} and {:#x} were not merged", b.addr,
                              blocks[b.next].addr));
    }
    if (!b.mapped && b.next != kNil && !blocks[b.next].mapped) {
      return fail(fmt::format("unmapped neighbours at {:#x} were not merged", b.addr));
    }
    if (b.in_free) ++free_count[b.pool];
    if (!b.mapped) ++unmapped_count[b.pool];
    if (b.allocated) {
      ++allocated_count;
      if (addresses_indexed && allocated.Find(b.addr) != id) {
        return fail(fmt::format("allocated block {:#x} missing from the index", b.addr));
      }
    }
  }
  if (allocated_count != num_allocated ||
      (addresses_indexed && allocated.size() != num_allocated)) {
    return fail(
        fmt::format("{} allocated blocks, index holds {}", allocated_count, allocated.size()));
  }
  for (std::uint8_t p = 0; p < 2; ++p) {
    std::size_t in_trees = 0;
    Status bad = Status::Ok();
    pools[p].ForEachFree([&](std::uint64_t stream, const FreeKey& k, BlockId id) {
      ++in_trees;
      const BlockRec& b = blocks[id];
      if (bad.ok() &&
          (!b.live || b.pool != p || b.stream != stream || b.size != k.size || b.addr != k.addr)) {
        bad = fail(fmt::format("free set entry {:#x} is stale", k.addr));
      }
    });
    FRAGSCOPE_RETURN_IF_ERROR(bad);
    std::size_t tree_sizes = 0;
    for (const auto& [stream, tree] : pools[p].free) tree_sizes += tree->size();
    if (in_trees != free_count[p] || tree_sizes != free_count[p] ||
        pools[p].free_count != free_count[p] || pools[p].unmapped.size() != unmapped_count[p]) {
      return fail(fmt::format("pool {}: free/unmapped set sizes {}/{} but {}/{} blocks", p,
                              in_trees, pools[p].unmapped.size(), free_count[p],
                              unmapped_count[p]));
    }
    for (const UnmappedKey& k : pools[p].unmapped) {
      const BlockRec& b = blocks[k.id];
      if (!b.live || b.pool != p || b.stream != k.stream || b.addr != k.addr || b.mapped) {
        return fail(fmt::format("unmapped set entry {:#x} is stale", k.addr));
      }
    }
  }

  // Segments: cudaMalloc'd ones match the address space; expandable ones their reservation.
  std::uint64_t cuda_bytes = 0, cuda_segments = 0, mapped_bytes = 0;
  for (BlockId id = 0; id < blocks.size(); ++id) {
    const BlockRec& h = blocks[id];
    if (!h.live || h.prev != kNil) continue;
    std::uint64_t total = 0, mapped = 0;
    BlockId last = id;
    for (BlockId b = id; b != kNil; b = blocks[b].next) {
      total += blocks[b].size;
      if (blocks[b].mapped) mapped += blocks[b].size;
      last = b;
    }
    if (h.exp == kNil) {
      const auto& ranges = pinned.count(h.addr) != 0 ? pinned : cuda_space.used();
      auto it = ranges.find(h.addr);
      if (it == ranges.end() || it->second != total) {
        return fail(
            fmt::format("segment {:#x} ({} bytes) is not a live driver range", h.addr, total));
      }
      cuda_bytes += total;
      ++cuda_segments;
    } else {
      const ExpSegment& seg = exp_segments[h.exp];
      if (!seg.live || seg.base != h.addr || seg.va_size != total || seg.mapped != mapped ||
          blocks[last].next != kNil) {
        return fail(fmt::format("expandable segment {:#x} does not tile its reservation", h.addr));
      }
      mapped_bytes += mapped;
    }
  }
  if (cuda_segments != cuda_space.used().size() + pinned.size()) {
    return fail(fmt::format("{} driver ranges but {} segments",
                            cuda_space.used().size() + pinned.size(), cuda_segments));
  }
  std::uint64_t pinned_end = 0;
  for (const auto& [addr, bytes] : pinned) {
    if (addr < pinned_end || bytes > cuda_space.base() || addr > cuda_space.base() - bytes) {
      return fail(fmt::format("recorded-address segment {:#x} overlaps another or the base", addr));
    }
    pinned_end = addr + bytes;
  }
  FRAGSCOPE_RETURN_IF_ERROR(cuda_space.Check());
  if (cuda_bytes + mapped_bytes != total_reserved ||
      static_cast<std::int64_t>(total_reserved) != stats.reserved_bytes[0].current) {
    return fail(fmt::format("total_reserved {} != segments {} + mapped {} (stat {})",
                            total_reserved, cuda_bytes, mapped_bytes,
                            stats.reserved_bytes[0].current));
  }
  if (options.driver.used_by_others_bytes <= options.driver.capacity_bytes &&
      total_reserved > options.driver.capacity_bytes - options.driver.used_by_others_bytes) {
    return fail("reserved more than the driver had");
  }

  // Events.
  std::unordered_map<BlockId, std::int32_t> pending;
  for (const auto& [stream, se] : events) {
    for (const PendingEvent& pe : se.queue) ++pending[pe.block];
  }
  for (BlockId id = 0; id < blocks.size(); ++id) {
    if (!blocks[id].live) continue;
    auto it = pending.find(id);
    if ((it == pending.end() ? 0 : it->second) != blocks[id].event_count) {
      return fail(fmt::format("block {:#x}: event count {} but {} queued", blocks[id].addr,
                              blocks[id].event_count, it == pending.end() ? 0 : it->second));
    }
  }

  // Stats: all == small + large for every additive field.
  const std::array<const StatArray*, 9> arrays = {
      &stats.allocation,      &stats.segment,
      &stats.active,          &stats.inactive_split,
      &stats.allocated_bytes, &stats.reserved_bytes,
      &stats.active_bytes,    &stats.inactive_split_bytes,
      &stats.requested_bytes};
  for (const StatArray* a : arrays) {
    const StatArray& s = *a;
    if (s[0].current != s[1].current + s[2].current ||
        s[0].allocated != s[1].allocated + s[2].allocated ||
        s[0].freed != s[1].freed + s[2].freed) {
      return fail("a stat's all != small_pool + large_pool");
    }
    for (const Stat& st : s) {
      if (st.current < 0 || st.peak < st.current) return fail("a stat is negative or above peak");
    }
  }

  // §11.4: the snapshot reproduces the stats.
  std::array<std::int64_t, 3> seg{}, reserved{}, alloc_bytes{}, active_bytes{}, requested{},
      allocation{}, active{}, split_count{}, split_bytes{};
  std::int64_t oversize_allocs = 0, oversize_segs = 0;
  for (const SnapshotSegment& s : Snapshot()) {
    const std::size_t p = s.segment_type == "small" ? 1 : 2;
    auto add = [p](std::array<std::int64_t, 3>& a, std::uint64_t v) {
      a[0] += static_cast<std::int64_t>(v);
      a[p] += static_cast<std::int64_t>(v);
    };
    if (!s.is_expandable) {
      add(seg, 1);
      if (s.total_size >= MaxSplit()) ++oversize_segs;
    }
    add(reserved, s.total_size);
    add(alloc_bytes, s.allocated_size);
    add(active_bytes, s.active_size);
    add(requested, s.requested_size);
    std::uint64_t sum_requested = 0;
    for (const SnapshotBlock& b : s.blocks) {
      if (b.state == "active_allocated") {
        add(allocation, 1);
        if (b.size >= MaxSplit()) ++oversize_allocs;
      }
      if (b.state != "inactive") {
        add(active, 1);
        sum_requested += b.requested_size;
      }
      if (b.state == "inactive" && s.blocks.size() > 1 && !s.is_expandable) {
        add(split_count, 1);
        add(split_bytes, b.size);
      }
    }
    if (sum_requested != s.requested_size) return fail("segment requested_size mismatch");
  }
  struct Check {
    const char* name;
    const StatArray& stat;
    const std::array<std::int64_t, 3>& want;
  };
  const Check checks[] = {{"segment", stats.segment, seg},
                          {"reserved_bytes", stats.reserved_bytes, reserved},
                          {"allocated_bytes", stats.allocated_bytes, alloc_bytes},
                          {"active_bytes", stats.active_bytes, active_bytes},
                          {"requested_bytes", stats.requested_bytes, requested},
                          {"allocation", stats.allocation, allocation},
                          {"active", stats.active, active},
                          {"inactive_split", stats.inactive_split, split_count},
                          {"inactive_split_bytes", stats.inactive_split_bytes, split_bytes}};
  for (const Check& c : checks) {
    for (std::size_t i = 0; i < 3; ++i) {
      if (c.stat[i].current != c.want[i]) {
        return fail(fmt::format("{}[{}].current is {} but the snapshot gives {}", c.name, i,
                                c.stat[i].current, c.want[i]));
      }
    }
  }
  if (config.max_split_size == initial_max_split) {
    if (stats.oversize_allocations.current != oversize_allocs ||
        stats.oversize_segments.current != oversize_segs) {
      return fail(fmt::format("oversize stats {}/{} but the snapshot gives {}/{}",
                              stats.oversize_allocations.current, stats.oversize_segments.current,
                              oversize_allocs, oversize_segs));
    }
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Public API

CachingAllocatorSim::CachingAllocatorSim(const SimOptions& options)
    : impl_(std::make_unique<Impl>(options)) {}

CachingAllocatorSim::~CachingAllocatorSim() = default;

void CachingAllocatorSim::SetEventSink(std::function<void(const Event&)> sink) {
  impl_->sink = std::move(sink);
}

Result<std::uint64_t> CachingAllocatorSim::Malloc(std::uint64_t request, std::uint64_t stream) {
  Allocation a;
  Status s = impl_->Malloc(request, stream, &a);
  if (!s.ok()) return s;
  return a.addr;
}

Status CachingAllocatorSim::Free(std::uint64_t addr) { return impl_->Free(addr); }

Status CachingAllocatorSim::RecordStream(std::uint64_t addr, std::uint64_t stream) {
  if (addr == 0) return Status::Ok();  // an empty tensor's null pointer: nothing to record
  impl_->EnsureAddressIndex();
  const BlockId id = impl_->allocated.Find(addr);
  if (id == AddressIndex::kNotFound) {
    return Status::InvalidArgument(fmt::format("record_stream: no allocated block at {:#x}", addr));
  }
  impl_->RecordStream(id, stream);
  return Status::Ok();
}

Result<CachingAllocatorSim::Allocation> CachingAllocatorSim::MallocBlock(std::uint64_t request,
                                                                         std::uint64_t stream) {
  Allocation a;
  Status s = impl_->Malloc(request, stream, &a);
  if (!s.ok()) return s;
  return a;
}

void CachingAllocatorSim::FreeBlock(BlockHandle handle) {
  if (handle == kNoBlock) return;
  impl_->CheckHandle(handle);
  impl_->FreeAllocated(handle);
}

void CachingAllocatorSim::PrefetchBlock(BlockHandle handle, bool neighbours) const {
  const auto& blocks = impl_->blocks;
  if (handle >= blocks.size()) return;
  if (!neighbours) {
    __builtin_prefetch(&blocks[handle]);
    return;
  }
  const BlockRec& b = blocks[handle];
  if (b.prev < blocks.size()) __builtin_prefetch(&blocks[b.prev]);
  if (b.next < blocks.size()) __builtin_prefetch(&blocks[b.next]);
}

void CachingAllocatorSim::RecordStreamOnBlock(BlockHandle handle, std::uint64_t stream) {
  impl_->CheckHandle(handle);
  impl_->RecordStream(handle, stream);
}

void CachingAllocatorSim::StreamSync(std::optional<std::uint64_t> stream) {
  Impl& s = *impl_;
  if (stream) {
    auto it = s.events.find(*stream);
    if (it == s.events.end()) return;
    it->second.synced_seq = s.event_seq;
    s.events_ready = true;
    return;
  }
  for (auto& [id, se] : s.events) se.synced_seq = s.event_seq;
  s.events_ready = !s.events.empty();
}

void CachingAllocatorSim::EmptyCache() { impl_->ReleaseCachedBlocks(); }

Status CachingAllocatorSim::SetMemoryFraction(double fraction) {
  if (!(fraction >= 0.0 && fraction <= 1.0)) {
    return Status::InvalidArgument(
        fmt::format("invalid fraction:{}. Please set within [0, 1].", fraction));
  }
  impl_->fraction = fraction;
  impl_->fraction_set = true;
  impl_->probes.reconfigured = true;
  return Status::Ok();
}

Status CachingAllocatorSim::SetAllocatorSettings(std::string_view conf) {
  Result<AllocatorConfig> parsed =
      ParseAllocatorConfig(conf, impl_->config, impl_->options.version);
  if (!parsed.ok()) return parsed.status();
  impl_->config = std::move(parsed).value();
  impl_->rules = impl_->config.Rules();
  impl_->probes.reconfigured = true;
  return Status::Ok();
}

void CachingAllocatorSim::ResetPeakStats() {
  MemoryStats& s = impl_->stats;
  for (StatArray* a :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
        &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) st.peak = st.current;
  }
  s.oversize_allocations.peak = s.oversize_allocations.current;
  s.oversize_segments.peak = s.oversize_segments.current;
}

void CachingAllocatorSim::ResetAccumulatedStats() {
  MemoryStats& s = impl_->stats;
  for (StatArray* a :
       {&s.allocation, &s.segment, &s.active, &s.inactive_split, &s.allocated_bytes,
        &s.reserved_bytes, &s.active_bytes, &s.inactive_split_bytes, &s.requested_bytes}) {
    for (Stat& st : *a) st.allocated = st.freed = 0;
  }
  for (Stat* st : {&s.oversize_allocations, &s.oversize_segments}) st->allocated = st->freed = 0;
  s.num_alloc_retries = 0;
  s.num_ooms = 0;
  s.num_sync_all_streams = 0;
  s.num_device_alloc = 0;
  s.num_device_free = 0;
}

const MemoryStats& CachingAllocatorSim::stats() const { return impl_->stats; }

std::vector<SnapshotSegment> CachingAllocatorSim::MemorySnapshot() const {
  return impl_->Snapshot();
}

const std::optional<OomDetails>& CachingAllocatorSim::last_oom() const { return impl_->last_oom; }

const AllocatorConfig& CachingAllocatorSim::config() const { return impl_->config; }

std::uint64_t CachingAllocatorSim::device_free_bytes() const { return impl_->DeviceFree(); }

std::uint64_t CachingAllocatorSim::pinned_segments() const { return impl_->pinned_segments; }

std::uint64_t CachingAllocatorSim::unpinned_segments() const { return impl_->unpinned_segments; }
std::uint64_t CachingAllocatorSim::address_space_refusals() const {
  return impl_->address_space_refusals;
}

Status CachingAllocatorSim::CheckInvariants() const { return impl_->CheckInvariants(); }

bool CachingAllocatorSim::WouldMatch(const AllocatorConfig& other) const {
  return impl_->WouldMatch(other);
}

}  // namespace fragscope::model
