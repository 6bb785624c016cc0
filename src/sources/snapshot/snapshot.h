// Snapshot: a PyTorch CUDA memory snapshot (torch.cuda.memory._snapshot(), or the segment list
// of torch.cuda.memory_snapshot()) decoded from a Document into compact records, for every
// format generation in ../shared/spec/memory-snapshot-format.md §7. The format is told by
// content: a dict with "segments" (and maybe "device_traces", "allocator_settings",
// "external_annotations"), or a bare list of segment dicts. docs/formats.md describes what is
// read and what is tolerated.
//
// Required fields: segments[].{address, total_size, blocks}, blocks[].{size, state}, and for a
// trace entry its action (plus addr and size for the actions that carry them). A missing or
// mistyped required field is an error naming its path ("segments[3].blocks[2].size: expected
// an int, found str"). Optional fields with an unexpected type are ignored with a warning.
// Everything else is optional and filled as the spec's rule of thumb says (§7): block addresses
// by running sum, requested size from requested_size, else history[0].real_size, else size.
//
// Stacks are interned: frames by content, stacks (frame lists) by the Document's object
// identity, so a file with a million references to a few hundred frames decodes to a few
// hundred frames (numbered in the order segments, blocks, then trace entries meet them, by
// either path); the strings in them are interned by object identity, then content, so a
// string shared through the pickle memo is read and hashed once. Text kept from the file (frame
// names and file names, allocator settings, annotations) is cut at 4096 bytes (ending in "...")
// and every copy is charged to the memory budget. The decoded Snapshot does not refer to the
// Document.
//
// Thread safety: plain values.
#ifndef FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_H_
#define FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"
#include "model/device_memory.h"
#include "sources/call_site.h"
#include "sources/document/document.h"
#include "sources/document/json_document.h"
#include "sources/pickle/pickle_reader.h"
#include "sources/snapshot/trace_history.h"

namespace fragscope::sources {

/// One stack frame. Index 0 of a stack is the innermost frame.
struct SnapshotFrame {
  std::string name;
  std::string filename;
  std::int64_t line = 0;
};

struct SnapshotBlock {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  std::uint64_t requested = 0;  // stale for free blocks (the last occupant's): never counted
  model::BlockState state = model::BlockState::kFree;
  std::int32_t stack = -1;  // index into Snapshot::stacks, -1 = none recorded
};

struct SnapshotSegment {
  std::int32_t device = 0;
  std::uint64_t addr = 0;
  std::uint64_t total_size = 0;
  std::uint64_t stream = 0;
  Pool pool = Pool::kUnknown;  // from segment_type; kUnknown when absent
  bool expandable = false;
  std::pair<std::int64_t, std::int64_t> pool_id{0, 0};  // (0, 0) = the default pools
  std::int32_t stack = -1;
  std::uint32_t first_block = 0;  // blocks [first_block, first_block + num_blocks)
  std::uint32_t num_blocks = 0;
  // The file's own totals, when present (checked against the blocks).
  std::optional<std::uint64_t> allocated_size;
  std::optional<std::uint64_t> active_size;
  std::optional<std::uint64_t> requested_size;
};

struct SnapshotAnnotation {
  std::string stage;  // "START" or "END"
  std::string name;
  std::int32_t device = 0;
  std::int64_t time_us = -1;
};

/// An `annotate` entry of device_traces[d] (PyTorch 2.11+): not part of the memory history, kept
/// for where it stands and what it says (sources/snapshot/snapshot_steps.h reads step markers
/// from it).
struct SnapshotTraceAnnotation {
  std::int32_t device = 0;
  /// The index in device_traces[device] of the first entry after it (size() = after the last).
  std::uint32_t before = 0;
  std::uint32_t entry = 0;  // index in the file's device_traces[d] (for messages)
  std::string text;         // user_metadata; "" when absent or not a string
};

enum class SnapshotLayout : std::uint8_t { kDict, kSegmentList };

struct Snapshot {
  SnapshotLayout layout = SnapshotLayout::kDict;
  /// "G0".."G6" as in the spec's §7, inferred from the keys present ("?" when nothing tells).
  std::string generation = "?";
  std::vector<SnapshotSegment> segments;  // in file order
  std::vector<SnapshotBlock> blocks;      // of all segments, each segment's in address order
  /// Index = device ordinal. Devices listed in the file with no entries have empty histories.
  /// Each is kept compact (about 10 bytes an entry, sources/snapshot/trace_history.h).
  std::vector<TraceHistory> device_traces;
  std::vector<SnapshotFrame> frames;
  std::vector<std::vector<std::uint32_t>> stacks;  // frame indexes, innermost first
  /// allocator_settings as found: key and value rendered as text ("roundup_power2_divisions"
  /// becomes "[1:0,2:0,...]"), in file order; empty when the file has none.
  std::vector<std::pair<std::string, std::string>> allocator_settings;
  bool has_allocator_settings = false;
  std::vector<SnapshotAnnotation> annotations;
  /// The `annotate` entries of every device, in file order.
  std::vector<SnapshotTraceAnnotation> trace_annotations;
  /// Things the reader tolerated (ignored fields, unknown actions), in order. Capped; the
  /// last says how many more there were.
  std::vector<std::string> warnings;
  std::uint64_t trace_entries = 0;  // all devices
  std::uint64_t ignored_entries = 0;
};

struct SnapshotDecodeOptions {
  std::size_t max_warnings = 50;
  /// Segments, blocks and trace entries decoded, counted each time one is reached; 0 =
  /// EventBudgetFor(the Document's input bytes) (sources/budget.h). Checked before each list
  /// is decoded, so nothing is built beyond it.
  std::uint64_t max_events = 0;
  /// Bytes of the strings the Snapshot keeps (call sites, settings, annotations) on top of the
  /// Document being read, charged at every copy; 0 = MemoryBudgetFor(the Document's input
  /// bytes) (sources/budget.h, issue 30 item 4).
  std::uint64_t max_memory_bytes = 0;
};

/// Decodes a snapshot from a Document (see ReadDocumentFile). kCorruption when the top level is
/// neither a snapshot dict nor a list of segments, or a required field is missing or mistyped.
Result<Snapshot> DecodeSnapshot(const Document& doc, const SnapshotDecodeOptions& options = {});

/// Reads and decodes the snapshot file `path` (plain, gzip or zstd; pickle or JSON) in one pass
/// (issue 34): a pickle's device trace lists are decoded into trace entries as the pickle reader
/// produces them (PickleListSink), so the Document never holds the history; what stays in it
/// (segments, blocks, settings, annotations) is decoded at the end and the Document dropped.
/// JSON files are read into a Document first. Errors and limits are DecodeSnapshot's and the
/// readers' (`options.max_memory_bytes` 0 = `limits.max_memory_bytes`); errors start with the path.
Result<Snapshot> ReadSnapshotFile(const std::string& path, const PickleLimits& limits = {},
                                  const ProgressFn& progress = {},
                                  const SnapshotDecodeOptions& options = {},
                                  DocumentFormat* format = nullptr);
/// Same over bytes in memory (plain, gzip or zstd); errors do not name a file.
Result<Snapshot> ReadSnapshotBytes(std::string_view bytes, const PickleLimits& limits = {},
                                   const SnapshotDecodeOptions& options = {});

/// The call site of a stack (ChooseCallSite, sources/call_site.h): `frame` is an index into
/// snapshot.frames (the innermost Python frame outside torch's own package, else the innermost
/// Python frame), or -1 with a `label` for a stack of C++ frames only ("C++ only (autograd
/// backward thread): at::_ops::mm in MmBackward0"); {-1, ""} for an empty or absent stack.
CallSite SnapshotCallSite(const Snapshot& snapshot, std::int32_t stack);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_H_
