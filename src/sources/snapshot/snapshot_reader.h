// SnapshotReader: a PyTorch memory snapshot read as an allocator trace, so everything that
// reads traces (analyze, convert, replay) reads snapshots too.
//
// A snapshot holds the final segments and, when history was recorded, the last N allocator
// events per device (a ring buffer: the oldest are lost). The reader rebuilds the state at the
// start of the recorded history by walking each device's events backwards from the final
// segments (undoing allocs, frees and segment events), then yields, per device in ascending
// order: the start state (segment_alloc / segment_map for the segments, `block` for the blocks
// that were already live) followed by the recorded events. A snapshot without history yields
// just its final state. Inconsistencies found on the way (an alloc of an address that is not
// live later, a free of a block the segments do not know, ...) become warnings naming the
// device and trace entry; the history continues.
//
// Call sites: frames() holds every distinct frame of the file, then one frame per distinct label
// of a C++-only stack (name = the label, no file, line 0); an event's `frame` is the call site
// of its stack (SnapshotCallSite in snapshot.h, the rules in sources/call_site.h). The frames'
// strings are moved there from snapshot().frames, which keeps only their lines.
//
// Steps: when the file's annotations tell where training steps begin (snapshot_steps.h), a
// `step` event stands before the first entry of each step; one that begins with the history
// comes first of all, before any start state, so that every device's state counts in it.
// Step events belong to no start state (last_was_start() is false for them).
//
// Thread safety: none.
#ifndef FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_READER_H_
#define FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_READER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "fragscope/status.h"
#include "fragscope/trace.h"
#include "model/caching_allocator_sim.h"
#include "sources/pickle/pickle_reader.h"
#include "sources/snapshot/snapshot.h"
#include "sources/snapshot/snapshot_steps.h"

namespace fragscope::sources {

/// What a file holds, from its first decoded bytes.
enum class InputKind { kTrace, kSnapshot };
/// kTrace for a fragscope trace (a first line naming "fragscope-trace"), kSnapshot for a
/// pickle or a JSON document. Errors: the file cannot be opened or decompressed, or its first
/// bytes show it is something else (DescribeOtherInput): kInvalidArgument "PATH: expected a
/// fragscope trace or a PyTorch memory snapshot; this file is <what>" and the command or
/// function that makes or reads what it is.
Result<InputKind> DetectInputKind(const std::string& path);

/// What a file whose first (decompressed) bytes are `head` is, when they show it is neither a
/// fragscope trace nor a PyTorch memory snapshot, with what to do about it: "empty", "a ZIP
/// archive (torch.save writes these ...)", "text with an out-of-memory message (line 2: ...):
/// `fragscope explain PATH` reads it", "text (first line: ...)", "binary data (first bytes
/// ...)". "" when it may be one of the two: a pickle, JSON, or a trace; their readers judge.
/// `path` names the file in the advice.
std::string DescribeOtherInput(std::string_view head, std::string_view path);

struct SnapshotReadOptions {
  PickleLimits limits;
  ProgressFn progress;
  SnapshotDecodeOptions decode;
};

class SnapshotReader final : public TraceReader {
 public:
  /// Reads, decodes and prepares `path`. Errors start with the path.
  static Result<std::unique_ptr<SnapshotReader>> Open(const std::string& path,
                                                      const SnapshotReadOptions& options = {});
  /// Same, over an already decoded snapshot; `name` is used in messages.
  static std::unique_ptr<SnapshotReader> FromSnapshot(Snapshot snapshot, std::string name);
  ~SnapshotReader() override;

  const TraceHeader& header() const override { return header_; }
  Result<bool> Next(Event* event) override;
  /// Starts the events over from the first (a second pass over the same history).
  void Rewind();
  /// Whether the event Next() returned last belongs to a device's rebuilt start state.
  bool last_was_start() const { return last_in_start_; }
  /// The rebuilt start state of `device` (the events Next() yields first for it).
  std::span<const Event> start_events(std::int32_t device) const;
  const std::vector<Frame>& frames() const override { return frames_; }
  /// "PATH: device_traces[D][I]" for a recorded event, "PATH: start state of device D" for the
  /// rebuilt state, "PATH: step N (marked before device_traces[D][I])" for a step event.
  std::string Where() const override;
  std::uint64_t line_number() const override { return position_; }
  std::uint64_t input_bytes_consumed() const override { return input_bytes_; }
  std::uint64_t input_bytes_total() const override { return input_bytes_; }

  const Snapshot& snapshot() const { return snapshot_; }
  /// The steps the annotations give (marks empty: none), with notes on why none were placed.
  const SnapshotSteps& steps() const { return steps_; }
  /// Decoder warnings, then the history's, in order. Analyze prints them as notes.
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// "pickle protocol 4", "JSON", ...
  const std::string& container() const { return container_; }
  /// Devices whose history was read (non-empty device_traces), ascending.
  const std::vector<std::int32_t>& devices_with_history() const { return with_history_; }
  /// Whether `device`'s recorded history starts from nothing (no segment existed before its
  /// first event), so the history holds every request of the run.
  bool CompleteHistory(std::int32_t device) const;
  /// The final segments of `device` in the simulator's snapshot shape (for comparisons).
  std::vector<model::SnapshotSegment> FinalSegments(std::int32_t device) const;
  /// The recorded allocator settings as a PYTORCH_CUDA_ALLOC_CONF string (options that differ
  /// from the defaults only); a file without settings but with expandable segments gives
  /// "expandable_segments:True". Notes say what was inferred.
  std::string RecordedConf(std::vector<std::string>* notes) const;

 private:
  SnapshotReader() = default;
  void Prepare();
  /// REQUIRES: segment_indices lists the indices of `device`'s segments in snapshot_.segments.
  void BuildDevice(std::int32_t device, const std::vector<std::size_t>& segment_indices);
  std::string ComputeConf();

  struct DevicePlan {
    std::int32_t device = 0;
    std::vector<Event> start;  // the rebuilt start state
    std::size_t start_segments = 0;
    const TraceHistory* entries = nullptr;
    /// (entry index, block size) of the allocs whose block is live in the final segments,
    /// ascending: what the walk learnt (SnapshotTraceEntry::block_size).
    std::vector<std::pair<std::uint32_t, std::uint64_t>> block_sizes;
    std::vector<SnapshotStepMark> marks;  // within entries (the one at entry 0 goes first)
  };
  Event StepEvent(const SnapshotStepMark& mark) const;
  /// Entry `index` of plans_[plan]'s history, its chunk decoded into chunk_ when not there yet.
  const SnapshotTraceEntry& EntryAt(std::size_t plan, std::size_t index) const;

  std::string name_;
  std::string container_;
  Snapshot snapshot_;
  TraceHeader header_;
  std::vector<Frame> frames_;
  std::vector<std::int32_t> site_of_stack_;
  static constexpr std::uint64_t kMaxHistoryWarnings = 50;
  std::vector<std::string> warnings_;
  std::uint64_t history_warnings_ = 0;
  std::string recorded_conf_;
  std::vector<std::string> conf_notes_;
  std::vector<std::int32_t> with_history_;
  std::vector<DevicePlan> plans_;
  SnapshotSteps steps_;
  std::optional<SnapshotStepMark> first_mark_;  // a step that begins with the history
  std::uint64_t input_bytes_ = 0;
  // Iteration.
  std::size_t plan_ = 0;
  std::size_t index_ = 0;  // into start, then into entries (start.size() + i)
  std::uint64_t position_ = 0;
  bool in_start_ = true;
  bool first_mark_pending_ = false;
  std::size_t mark_ = 0;        // into the plan's marks
  std::size_t block_size_ = 0;  // into the plan's block_sizes
  // The chunk of a history last decoded (EntryAt): Next() reads a chunk at a time.
  mutable std::vector<SnapshotTraceEntry> chunk_;
  mutable std::size_t chunk_plan_ = ~std::size_t{0};
  mutable std::size_t chunk_index_ = ~std::size_t{0};
  std::size_t last_plan_ = 0;
  std::size_t last_index_ = 0;
  bool last_in_start_ = true;
  std::optional<std::int64_t> last_step_;  // the step of the last event, when it was a step
};

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_READER_H_
