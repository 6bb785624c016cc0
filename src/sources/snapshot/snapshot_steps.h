// Training steps of a PyTorch memory snapshot, from what the file records about them.
//
// A snapshot has no step markers of its own, but three things in it tell where steps begin,
// taken in this order (the first that gives a step boundary inside the history is used, never
// a mix):
//
//  1. `annotate` entries of device_traces (PyTorch 2.11+) whose text (user_metadata) names a
//     step: "ProfilerStep#N", or "step N" / "step=N" / "step:N" / "step#N" (any case). They
//     stand where they were recorded, so no clock is needed.
//  2. external_annotations "ProfilerStep#N" with stage START (torch.profiler's schedule): step
//     N begins with the first entry recorded at or after that time.
//  3. external_annotations "Optimizer.step#<Optimizer>.step" with stage END: each end closes a
//     step. The history starts in step 0; after the k-th end (counted over all the
//     annotations, those before the history's first entry too) step k begins, with the first
//     entry recorded after that time. With several optimizers, the first one's ends count.
//
// 2 and 3 place a boundary by time: they need `time_us` on the trace entries (PyTorch 2.2+),
// and compare it with the annotation's. Boundaries before the history's first timed entry
// collapse into one (the step in progress when the history begins); boundaries after its last
// entry are dropped (nothing of those steps was recorded).
//
// Steps are the process's: the events of every device belong to them. fragscope's reader yields
// a snapshot's devices one after the other, so steps are marked only when one device has a
// recorded history; with several, a note says the boundaries were not placed.
//
// Thread safety: plain values; DeriveSteps only reads the snapshot.
#ifndef FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_STEPS_H_
#define FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_STEPS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sources/snapshot/snapshot.h"

namespace fragscope::sources {

/// Step `step` begins with entry `before` of the device's history (device_traces[device]).
struct SnapshotStepMark {
  std::uint32_t before = 0;
  std::int64_t step = 0;
};

struct SnapshotSteps {
  std::int32_t device = -1;  // the device whose history holds the marks; -1: no steps
  /// Ascending in `before` (each position once); `before` < the history's size.
  std::vector<SnapshotStepMark> marks;
  /// What the steps come from, for a note ("3 ends of Optimizer.step#AdamW.step in
  /// external_annotations, placed by time_us"); "" when there are none.
  std::string source;
  /// Why annotations that name steps gave none (no time_us, several devices with history): for
  /// notes, beside `source`. Not warnings: nothing in the file is wrong.
  std::vector<std::string> notes;
};

SnapshotSteps DeriveSteps(const Snapshot& snapshot);

/// The step an annotate entry's text names ("ProfilerStep#12", "step 12", "Step=12", ...);
/// nullopt when it names none.
std::optional<std::int64_t> StepFromText(std::string_view text);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_SNAPSHOT_SNAPSHOT_STEPS_H_
