// Reading an input for the pipeline: a fragscope trace or a PyTorch memory snapshot, told apart
// by content, and the read loops every command shares (events into an analyzer, a snapshot's
// events with its rebuilt start state kept apart, a replay's request events held in memory).
//
// Thread safety: none; one thread reads an input.
#ifndef FRAGSCOPE_PIPELINE_INPUT_H_
#define FRAGSCOPE_PIPELINE_INPUT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "analysis/analysis_result.h"
#include "analysis/trace_analyzer.h"
#include "fragscope/event.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"
#include "model/allocator_rules.h"
#include "sources/bfc_text/bfc_trace.h"
#include "sources/snapshot/snapshot_reader.h"

namespace fragscope::pipeline {

/// An input file: a fragscope trace or a PyTorch memory snapshot, told apart by content.
struct OpenedInput {
  std::unique_ptr<TraceReader> reader;
  sources::SnapshotReader* snapshot = nullptr;  // reader itself, when the input is a snapshot
  /// reader itself, when the input is a TensorFlow / JAX log with a BFC allocator dump.
  sources::BfcTraceReader* bfc = nullptr;
};
/// Opens `path`; a snapshot is read and decoded here, with a progress line for big files. A
/// text file with a BFC allocator dump (a TensorFlow / JAX log) is read as an allocator trace
/// (sources::BfcTraceReader).
/// Errors start with the path.
Result<OpenedInput> OpenInput(const std::string& path, const TraceLimits& limits = {});

/// Reads every event of a snapshot into `consume`. A consumer error does not stop the read: the
/// event is skipped and a note naming the trace entry goes to `notes` (the first 20, then a
/// count), so that an inconsistent file is analyzed as far as it can be; except kLimitExceeded
/// (a budget the consumer keeps), which ends the read with that error, prefixed by the entry.
/// `consume` can tell the rebuilt start state from the recorded history with
/// reader.last_was_start().
Result<std::uint64_t> ReadSnapshotEvents(sources::SnapshotReader& reader,
                                         const std::function<Status(const Event&)>& consume,
                                         std::vector<std::string>* notes);

/// ReadSnapshotEvents into `analyzer`: the rebuilt start state through ConsumeStartState (it
/// is not part of the recorded run), the recorded history through Consume.
Result<std::uint64_t> AnalyzeSnapshotEvents(sources::SnapshotReader& reader,
                                            analysis::TraceAnalyzer& analyzer,
                                            std::vector<std::string>* notes);

/// A snapshot does not record its devices' sizes, but a recorded OOM tells one: reserved +
/// the driver's free bytes then. For each device without a capacity in `header` whose history
/// records an OOM, sets it (a first pass over the events, only when one is needed) so that the
/// analysis takes every event's max allocatable against it, not only the events after the OOM;
/// a note per device says so. Leaves the reader rewound.
Status LearnCapacitiesFromOoms(sources::SnapshotReader& reader, TraceHeader* header,
                               std::vector<std::string>* notes);

/// Threads for a command whose analysis can run beside its input (--threads): 0 means two when
/// the machine has more than one hardware thread; more than two are two.
unsigned AnalysisThreads(unsigned requested);

/// Reads every event of `reader` into `analyzer`, as ReadAllEvents does; with two threads
/// (AnalysisThreads) the analysis runs on the second while this one parses (same result, same
/// messages: a consumer error still names its line and comes before a later reader error).
Result<std::uint64_t> AnalyzeAllEvents(TraceReader& reader, analysis::TraceAnalyzer& analyzer,
                                       unsigned threads);

/// Reads every event of `reader` into `consume`, with a progress line. On a reader error
/// returns its message ("file:line: ..."); on a consumer error, "file:line: " + its message.
/// `status_out` (optional) receives the consumer's Status (to tell OOMs from bad input).
/// `prefetch` (optional) sees each event a few events before `consume` does.
Result<std::uint64_t> ReadAllEvents(TraceReader& reader,
                                    const std::function<Status(const Event&)>& consume,
                                    Status* status_out = nullptr,
                                    const std::function<void(const Event&)>& prefetch = {});

/// A request trace or a snapshot's requests, held in memory for replays that run several
/// times (tune, explain).
struct RequestEvents {
  std::vector<Event> events;
  /// A snapshot's: per device, the index in `events` of its first request after the requests
  /// that rebuild its start state (events.size() when it has no recorded history). A replay's
  /// peaks count from there (the rebuild is not part of the run). Empty for a request trace.
  std::map<std::int32_t, std::size_t> recorded_from;
  /// A snapshot's: the device allocations (segment_alloc, segment_map) of its recorded history,
  /// all devices; 0 when every segment was reserved before recording began. Unset for a
  /// request trace (analysis::TuneCannotRank).
  std::optional<std::uint64_t> recorded_device_allocs;
};

/// The request events of an opened input (`path` names it in messages): a request trace's
/// events as they are (segment events refused: that is an allocator trace), or a snapshot's
/// requests rebuilt by SnapshotRequests for an allocator with `rules` (its recorded OOMs kept as
/// the requests that failed, except on the `drop_ooms` devices: replayed with unlimited memory,
/// the request would succeed there). `notes` receives what a snapshot's rebuild assumed and the
/// entries it skipped. Errors name the path.
Result<RequestEvents> ReadRequestEvents(OpenedInput& input, const std::string& path,
                                        const model::AllocatorRules& rules,
                                        std::vector<std::string>* notes,
                                        std::vector<std::int32_t> drop_ooms = {});

/// The note a replay of a snapshot's requests carries: its peaks leave out the requests that
/// rebuild the start state (ReplayInput, and ReadRequestEvents for tune and explain).
std::string RebuiltPeaksNote();

/// What `analyze` computes for the trace or snapshot at `path` (snapshot notes and call-site
/// names included). Errors name the file and where in it. `threads` as AnalysisThreads: a
/// trace is parsed and analyzed on two threads unless it is 1. For a snapshot, peaks, extremes
/// and the timeline come from the recorded history and the final state (AnalyzeSnapshotEvents).
/// `tap` (optional) sees every event the analyzer accepted, after it, with the input's header
/// (`report` records layouts) and whether it rebuilt a snapshot's start state (true: it is not
/// a moment of the recorded run); with a tap a trace is analyzed on this thread. An error from
/// the tap ends the read with it (a snapshot's too, when it is kLimitExceeded). `call_sites`
/// (optional) receives the input's call-site table (the ids of Event::frame), and `stacks`
/// (optional) a snapshot's stack table (the ids of Event::stack: frame ids, innermost first;
/// empty for a trace).
Result<analysis::AnalysisResult> AnalyzeInput(
    const std::string& path, const analysis::AnalysisOptions& options,
    const TraceLimits& limits = {}, unsigned threads = 0,
    const std::function<Status(const TraceHeader&, const Event&, bool)>& tap = {},
    std::vector<Frame>* call_sites = nullptr,
    std::vector<std::vector<std::uint32_t>>* stacks = nullptr);

}  // namespace fragscope::pipeline

#endif  // FRAGSCOPE_PIPELINE_INPUT_H_
