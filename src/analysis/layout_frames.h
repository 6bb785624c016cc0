// LayoutRecorder: the memory layout of each device at chosen moments of a run, for a map of
// "the memory at this moment" (the HTML report). It keeps its own memory model, fed the same
// allocator events as the TraceAnalyzer, and records:
//   * a periodic frame every `period` events; when more than `max_frames` periodic frames are
//     held, every other one is dropped and the period doubles (like the timeline's samples), so
//     frames stay spread over the whole run for runs of any length;
//   * a frame just before each oom event (the first kMaxOomDiagnoses per device, never dropped);
//   * a frame at the high-water mark of allocated bytes (taken again whenever allocated bytes
//     exceed the last one taken by more than 1%: within 1% of the true peak);
//   * the final layout.
// The blocks held by all frames of all devices -- periodic, before each OOM, at each peak and
// at the end -- are bounded by `max_blocks`: periodic frames are thinned out (as above, then
// dropped) until the rest fit; when the frames that are never dropped do not fit, the
// recording is refused (kLimitExceeded naming --max-map-blocks) as soon as they outgrow it,
// and every frame is released. The stranded flag uses the analyzer's rule (a free block below
// its pool's threshold: a fixed threshold, else the quantile of recent requests).
//
// Every allocation in a kept map is described once per device (LayoutAllocation: when it was
// made and freed, its stream, call site and stack), and every change of the bytes a call site
// holds is logged (SiteBytesChange), from every event, so that the report can draw "active
// memory by call site" at any sample of the timeline exactly (issue 33 item 1).
//
// Thread safety: none; one thread feeds events.
#ifndef FRAGSCOPE_ANALYSIS_LAYOUT_FRAMES_H_
#define FRAGSCOPE_ANALYSIS_LAYOUT_FRAMES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "fragscope/event.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"

namespace fragscope::analysis {

enum class FrameReason : std::uint8_t { kPeriodic, kBeforeOom, kPeak, kEnd };
/// "periodic", "before_oom", "peak", "end".
std::string_view FrameReasonName(FrameReason reason);

/// The layout of one device after events [0, event_index) (event indices count the events of
/// every device, as When::event_index does). Blocks carry their call site (LayoutBlock::frame).
struct LayoutFrame {
  std::uint64_t event_index = 0;
  std::int64_t step = -1;
  std::int64_t time_us = -1;
  FrameReason reason = FrameReason::kPeriodic;
  std::vector<LayoutSegment> segments;
  std::uint64_t blocks = 0;  // Σ blocks of the segments
};

/// An allocation (an allocated or pending-free block) seen in a kept map. Event indices count
/// the events of every device (as LayoutFrame::event_index); -1 = not known.
struct LayoutAllocation {
  /// The index of its alloc event; -1: it was live when a snapshot's recorded history began
  /// (a `block` event of the rebuilt start state).
  std::int64_t alloc_event = -1;
  std::int64_t alloc_step = -1;
  std::int64_t alloc_time_us = -1;  // the time of the last timed event at or before it
  /// The index of its first free event (free_requested, else free_completed); -1: not freed
  /// by the end of the input.
  std::int64_t free_event = -1;
  std::int64_t free_step = -1;
  std::int64_t free_time_us = -1;
  std::uint64_t stream = 0;
  std::int32_t site = -1;   // Event::frame
  std::int32_t stack = -1;  // Event::stack (snapshots)
};

/// The allocated bytes (as DeviceMemory::allocated() counts them: a pending-free block no
/// longer) of call site `site` (-1: none recorded) change by `delta_bytes` with event `event`
/// (an index: the state after events [0, end) includes it when event < end).
struct SiteBytesChange {
  std::uint64_t event = 0;
  std::int32_t site = -1;
  std::int64_t delta_bytes = 0;
};

struct LayoutFramesOptions {
  std::size_t max_frames = 64;         // periodic frames per device (>= 2)
  std::uint64_t max_blocks = 600'000;  // blocks of all frames of all devices
  std::uint64_t first_period = 16;     // events between periodic frames at the start
  std::optional<std::int32_t> device;  // record only this device
  std::optional<std::uint64_t> stranded_threshold;
  double stranded_quantile = 0.5;
  std::size_t request_window = 1024;
};

struct DeviceFrames {
  std::int32_t device = 0;
  std::vector<LayoutFrame> frames;  // by event index
  std::uint64_t period = 0;         // events between periodic frames at the end
  bool stopped = false;             // the model rejected an event: no frames after it
  /// The allocations the frames' blocks name (LayoutBlock::allocation), each once.
  std::vector<LayoutAllocation> allocations;
  /// Every change of a call site's live bytes, in event order (until `stopped`).
  std::vector<SiteBytesChange> site_changes;
};

class LayoutRecorder {
 public:
  /// `header` gives the allocator settings (rounding rules). Fails on malformed settings.
  static Result<std::unique_ptr<LayoutRecorder>> Create(const TraceHeader& header,
                                                        const LayoutFramesOptions& options);
  ~LayoutRecorder();

  /// Applies one event (of an allocator trace; others are counted only). An event the model
  /// rejects stops that device's recording (DeviceFrames::stopped); it does not fail the
  /// caller. Fails (kLimitExceeded, and every later call with it) when the frames that are never
  /// dropped hold more than max_blocks blocks.
  /// `start_state`: the event rebuilds a snapshot's state before its recorded history
  /// (TraceAnalyzer::ConsumeStartState): the moments between two such events never existed,
  /// so no frame is taken among them; the state they leave is the history's first moment.
  Status Consume(const Event& event, bool start_state = false);

  /// Adds the final frames and returns every device's frames, by device index. Fails as
  /// Consume does, counting the final frames too.
  Result<std::vector<DeviceFrames>> Finish();

 private:
  struct Impl;
  explicit LayoutRecorder(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_LAYOUT_FRAMES_H_
