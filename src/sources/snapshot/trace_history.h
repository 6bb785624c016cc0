// TraceHistory: one device's recorded history (device_traces[d]) in a compact encoding, about
// 10 bytes an entry (8-12 on real and generated files) instead of a 64-byte record (issue 34:
// a snapshot's history is most of what the read keeps). Entries are appended once, in order,
// then read forwards (iterators) or chunk by chunk in either direction (the walk that rebuilds
// the start state goes backwards).
//
// Encoding: chunks of kChunkEntries entries, each decodable alone (its deltas start from zero)
// and ending in 8 zero bytes. An entry is a 16-bit header (the action; the byte widths of the
// fields that follow; whether extra fields follow), then addr, size and time_us as zigzag
// deltas from the previous entry's (wrapping, so any 64-bit value round-trips) in 1-8 bytes,
// the stack as a zigzag delta in 0 (same as before), 1, 2 or 4 bytes, and, only when they are
// not the usual (stream as before, entry index = previous + 1, no device_free), a flags byte
// and varints for them. Fixed widths decode with one unaligned load and a mask each.
// SnapshotTraceEntry::block_size is not kept (the reader learns it in its walk and keeps it
// apart).
//
// Thread safety: plain values; const methods may run concurrently.
#ifndef FRAGSCOPE_SOURCES_SNAPSHOT_TRACE_HISTORY_H_
#define FRAGSCOPE_SOURCES_SNAPSHOT_TRACE_HISTORY_H_

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <vector>

#include "fragscope/event.h"

namespace fragscope::sources {

/// One entry of device_traces[d]. Actions: alloc, free_requested, free_completed (an old merged
/// "free" becomes both), segment_alloc/free/map/unmap, oom, snapshot. (`annotate` entries are
/// kept apart: Snapshot::trace_annotations.)
struct SnapshotTraceEntry {
  Action action = Action::kAlloc;
  std::int32_t stack = -1;
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  std::int64_t time_us = -1;      // -1 = not recorded (files before ~2.2)
  std::uint64_t device_free = 0;  // oom only
  /// alloc: the block's real size when the history tells it (the block is still live in the
  /// final segments); 0 = unknown (derived from size by the allocator's rules). Set by
  /// SnapshotReader's walk only; a TraceHistory does not keep it.
  std::uint64_t block_size = 0;
  std::uint32_t entry = 0;  // index in the file's device_traces[d] (for messages)

  bool operator==(const SnapshotTraceEntry&) const = default;
};

class TraceHistory {
 public:
  static constexpr std::size_t kChunkEntries = 1024;

  /// Appends `e` (its block_size is not kept). REQUIRES: e.action < 16.
  void push_back(const SnapshotTraceEntry& e);

  std::size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  std::size_t num_chunks() const { return chunks_.size(); }
  /// Heap bytes held (for the memory budget).
  std::uint64_t bytes() const;

  /// Entries [c * kChunkEntries, min(size(), (c + 1) * kChunkEntries)) into *out (replaced).
  void DecodeChunk(std::size_t c, std::vector<SnapshotTraceEntry>* out) const;
  /// Entry i: decodes its chunk up to it (O(kChunkEntries)); iterate for more than a few.
  SnapshotTraceEntry operator[](std::size_t i) const;

  /// The stacks the entries name (>= 0), in the order each first appears, as appended (before
  /// any MapStacks); one may recur later in the list (ids far beyond the number of entries are
  /// not looked up). What renumbering in the order entries meet stacks needs, without a pass.
  const std::vector<std::int32_t>& first_stacks() const { return first_stacks_; }

  /// Renumbers stacks: an entry's stack s >= 0 reads as map[s] from now on (-1 stays -1).
  /// REQUIRES: map covers every stack the entries name; nothing is appended afterwards.
  void MapStacks(std::shared_ptr<const std::vector<std::int32_t>> map);

  /// Forward iteration, a chunk decoded at a time. A reference from `*it` lives in the
  /// iterator's chunk buffer: it is overwritten when the iterator moves into the next chunk,
  /// so copy the entry to keep it past `++it`.
  class const_iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = SnapshotTraceEntry;
    using difference_type = std::ptrdiff_t;
    using pointer = const SnapshotTraceEntry*;
    using reference = const SnapshotTraceEntry&;

    const_iterator() = default;
    reference operator*() const { return buffer_[index_ % kChunkEntries]; }
    pointer operator->() const { return &buffer_[index_ % kChunkEntries]; }
    const_iterator& operator++();
    bool operator==(const const_iterator& other) const { return index_ == other.index_; }

   private:
    friend class TraceHistory;
    const_iterator(const TraceHistory* history, std::size_t index);
    const TraceHistory* history_ = nullptr;
    std::size_t index_ = 0;
    std::vector<SnapshotTraceEntry> buffer_;
  };
  const_iterator begin() const { return const_iterator(this, 0); }
  const_iterator end() const { return const_iterator(nullptr, size_); }

 private:
  struct State {
    std::uint64_t addr = 0, size = 0, time = 0, stream = 0;
    std::int32_t stack = 0;
    std::uint32_t entry = 0;
  };
  void NoteStack(std::int32_t stack);
  // Decodes up to `count` entries of chunk c into `out` (nullptr: skip), returns the last.
  SnapshotTraceEntry Decode(std::size_t c, std::size_t count, SnapshotTraceEntry* out) const;

  std::vector<std::vector<std::uint8_t>> chunks_;  // the last one is being written
  std::size_t size_ = 0;
  std::uint64_t sealed_bytes_ = 0;  // capacity of all chunks but the last
  State state_;                     // the encoder's, after the last entry
  std::shared_ptr<const std::vector<std::int32_t>> stack_map_;
  std::vector<std::int32_t> first_stacks_;
  std::vector<bool> stack_seen_;  // of ids below a bound that grows with size_
};

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_SNAPSHOT_TRACE_HISTORY_H_
