#include "sources/snapshot/snapshot_steps.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sources/snapshot_test_util.h"

namespace fragscope::sources {
namespace {

using testing::DocBuilder;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;
constexpr std::uint64_t kSeg = 0x4000000;

// A trace entry with a time; time_us < 0 leaves the key out (files before PyTorch 2.2).
Value Timed(DocBuilder& b, std::string_view action, std::uint64_t addr, std::uint64_t size,
            std::int64_t time_us) {
  Value e = b.Entry(action, addr, size);
  if (time_us >= 0) b.doc().SetItem(e, b.S("time_us"), b.I(time_us));
  return e;
}

Value Annotation(DocBuilder& b, std::string_view stage, std::string_view name,
                 std::int64_t time_us) {
  return b.Dict(
      {{"stage", b.S(stage)}, {"name", b.S(name)}, {"device", b.I(0)}, {"time_us", b.I(time_us)}});
}

Value Annotate(DocBuilder& b, std::string_view text) {
  return b.Dict({{"action", b.S("annotate")},
                 {"addr", b.U(kSeg)},
                 {"size", b.U(0)},
                 {"user_metadata", b.S(text)}});
}

// One 20 MiB segment S; the history allocates and frees 1, 2, 3, ... MiB at S, entry i at time
// 1000 + 10 i (or without times), and ends with the segment all free.
std::vector<Value> History(DocBuilder& b, int pairs, bool timed) {
  std::vector<Value> entries;
  std::int64_t t = 1000;
  auto time = [&] { return timed ? (t += 10) - 10 : -1; };
  entries.push_back(Timed(b, "segment_alloc", kSeg, 20 * kMiB, time()));
  for (int i = 1; i <= pairs; ++i) {
    const std::uint64_t size = static_cast<std::uint64_t>(i) * kMiB;
    entries.push_back(Timed(b, "alloc", kSeg, size, time()));
    entries.push_back(Timed(b, "free_requested", kSeg, size, time()));
    entries.push_back(Timed(b, "free_completed", kSeg, size, time()));
  }
  return entries;
}

Snapshot Decode(DocBuilder& b, std::vector<std::vector<Value>> traces,
                std::vector<Value> annotations) {
  std::vector<Value> segments;
  for (std::size_t d = 0; d < traces.size(); ++d) {
    if (traces[d].empty()) continue;
    segments.push_back(b.Segment(static_cast<std::int64_t>(d), kSeg, 20 * kMiB,
                                 {b.Block(kSeg, 20 * kMiB, 0, "inactive")}));
  }
  const Value root = b.Snapshot(segments, std::move(traces));
  b.doc().SetItem(root, b.S("external_annotations"), b.List(annotations));
  Result<Snapshot> s = DecodeSnapshot(b.doc());
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? std::move(*s) : Snapshot();
}

std::vector<std::pair<std::uint32_t, std::int64_t>> Marks(const SnapshotSteps& steps) {
  std::vector<std::pair<std::uint32_t, std::int64_t>> out;
  for (const SnapshotStepMark& m : steps.marks) out.emplace_back(m.before, m.step);
  return out;
}
using MarkList = std::vector<std::pair<std::uint32_t, std::int64_t>>;

TEST(SnapshotStepsTest, StepFromText) {
  EXPECT_EQ(StepFromText("ProfilerStep#12"), 12);
  EXPECT_EQ(StepFromText("step 3"), 3);
  EXPECT_EQ(StepFromText("Step=4"), 4);
  EXPECT_EQ(StepFromText("STEP:5"), 5);
  EXPECT_EQ(StepFromText("step#0"), 0);
  EXPECT_EQ(StepFromText("step"), std::nullopt);
  EXPECT_EQ(StepFromText("step "), std::nullopt);
  EXPECT_EQ(StepFromText("step 3a"), std::nullopt);
  EXPECT_EQ(StepFromText("step -3"), std::nullopt);
  EXPECT_EQ(StepFromText("steps 3"), std::nullopt);
  EXPECT_EQ(StepFromText("ProfilerStep#"), std::nullopt);
  EXPECT_EQ(StepFromText("ProfilerStep#1234567890123456789"), std::nullopt);  // > 18 digits
  EXPECT_EQ(StepFromText("activations"), std::nullopt);
}

TEST(SnapshotStepsTest, OptimizerStepEndsCloseSteps) {
  // Entries 0..9 at times 1000, 1010, ..., 1090. The optimizer's steps end at 950 (before the
  // history), 1035 (between entries 3 and 4), 1060 (exactly entry 6's time: entry 6 is still
  // in that step) and 2000 (after the history). zero_grad and a second optimizer do not count.
  DocBuilder b;
  const Snapshot s = Decode(b, {History(b, 3, true)},
                            {Annotation(b, "START", "Optimizer.step#AdamW.step", 940),
                             Annotation(b, "END", "Optimizer.step#AdamW.step", 950),
                             Annotation(b, "END", "Optimizer.zero_grad#AdamW.zero_grad", 1015),
                             Annotation(b, "END", "Optimizer.step#AdamW.step", 1035),
                             Annotation(b, "END", "Optimizer.step#SGD.step", 1045),
                             Annotation(b, "END", "Optimizer.step#AdamW.step", 1060),
                             Annotation(b, "END", "Optimizer.step#AdamW.step", 2000)});
  const SnapshotSteps steps = DeriveSteps(s);
  EXPECT_EQ(steps.device, 0);
  // The history begins after one optimizer step: step 1; the second end opens step 2 with
  // entry 4, the third step 3 with entry 7; the fourth end opens nothing recorded.
  EXPECT_EQ(Marks(steps), (MarkList{{0, 1}, {4, 2}, {7, 3}}));
  EXPECT_NE(steps.source.find("4 ends of Optimizer.step#AdamW.step"), std::string::npos)
      << steps.source;
  EXPECT_TRUE(steps.notes.empty());
}

TEST(SnapshotStepsTest, TheHistoryStartsInStepZeroBeforeTheFirstEnd) {
  DocBuilder b;
  const Snapshot s =
      Decode(b, {History(b, 2, true)}, {Annotation(b, "END", "Optimizer.step#AdamW.step", 1025)});
  EXPECT_EQ(Marks(DeriveSteps(s)), (MarkList{{0, 0}, {3, 1}}));
  // Every end after the last entry: nothing divides the history.
  DocBuilder late;
  const Snapshot t = Decode(late, {History(late, 2, true)},
                            {Annotation(late, "END", "Optimizer.step#AdamW.step", 5000)});
  const SnapshotSteps none = DeriveSteps(t);
  EXPECT_TRUE(none.marks.empty());
  EXPECT_EQ(none.device, -1);
  EXPECT_TRUE(none.source.empty());
}

TEST(SnapshotStepsTest, ProfilerStepStartsOpenTheirStep) {
  // Entries at 1000..1060. ProfilerStep#7 starts at exactly entry 2's time (1020): entry 2 is
  // its first; #8 at 1045: entry 5. Entries 0 and 1 come before any step (setup). Optimizer
  // ends are not used when ProfilerStep starts are there.
  DocBuilder b;
  const Snapshot s = Decode(b, {History(b, 2, true)},
                            {Annotation(b, "START", "ProfilerStep#7", 1020),
                             Annotation(b, "END", "Optimizer.step#AdamW.step", 1012),
                             Annotation(b, "START", "ProfilerStep#8", 1045),
                             Annotation(b, "END", "ProfilerStep#8", 1055)});
  const SnapshotSteps steps = DeriveSteps(s);
  EXPECT_EQ(Marks(steps), (MarkList{{2, 7}, {5, 8}}));
  EXPECT_NE(steps.source.find("2 ProfilerStep#N starts"), std::string::npos) << steps.source;
}

TEST(SnapshotStepsTest, AnnotateEntriesStandWhereTheyWereRecorded) {
  // An annotate entry is kept apart from the memory history with the index of the entry after
  // it; those naming steps mark them, before any external annotation.
  DocBuilder b;
  std::vector<Value> entries = History(b, 2, false);
  entries.insert(entries.begin() + 4, Annotate(b, "step 1"));
  entries.insert(entries.begin() + 2, Annotate(b, "activations"));
  entries.insert(entries.begin() + 1, Annotate(b, "step 0"));
  entries.push_back(Annotate(b, "step 2"));  // nothing follows it
  const Snapshot s =
      Decode(b, {entries}, {Annotation(b, "END", "Optimizer.step#AdamW.step", 1025)});
  ASSERT_EQ(s.device_traces.size(), 1u);
  EXPECT_EQ(s.device_traces[0].size(), 7u);  // the annotate entries are not memory events
  ASSERT_EQ(s.trace_annotations.size(), 4u);
  EXPECT_EQ(s.trace_annotations[0].text, "step 0");
  EXPECT_EQ(s.trace_annotations[0].before, 1u);
  EXPECT_EQ(s.trace_annotations[0].entry, 1u);
  EXPECT_EQ(s.trace_annotations[1].text, "activations");
  EXPECT_EQ(s.trace_annotations[1].before, 2u);
  EXPECT_EQ(s.trace_annotations[2].before, 4u);
  EXPECT_EQ(s.trace_annotations[3].before, 7u);
  EXPECT_TRUE(s.warnings.empty()) << s.warnings.front();
  const SnapshotSteps steps = DeriveSteps(s);
  EXPECT_EQ(Marks(steps), (MarkList{{1, 0}, {4, 1}}));
  EXPECT_NE(steps.source.find("3 annotate entries naming steps"), std::string::npos)
      << steps.source;
}

TEST(SnapshotStepsTest, WithoutTimesAnnotationsCannotBePlaced) {
  DocBuilder b;
  const Snapshot s =
      Decode(b, {History(b, 2, false)}, {Annotation(b, "END", "Optimizer.step#AdamW.step", 1025)});
  const SnapshotSteps steps = DeriveSteps(s);
  EXPECT_TRUE(steps.marks.empty());
  ASSERT_EQ(steps.notes.size(), 1u);
  EXPECT_NE(steps.notes[0].find("records no time_us"), std::string::npos) << steps.notes[0];
}

TEST(SnapshotStepsTest, SeveralDevicesWithHistoryAreNotDivided) {
  DocBuilder b;
  const Snapshot s = Decode(b, {History(b, 2, true), History(b, 1, true)},
                            {Annotation(b, "END", "Optimizer.step#AdamW.step", 1025)});
  const SnapshotSteps steps = DeriveSteps(s);
  EXPECT_TRUE(steps.marks.empty());
  ASSERT_EQ(steps.notes.size(), 1u);
  EXPECT_NE(steps.notes[0].find("2 devices have a recorded history"), std::string::npos)
      << steps.notes[0];
  // Annotations that name no step say nothing.
  DocBuilder quiet;
  const Snapshot q =
      Decode(quiet, {History(quiet, 2, true), History(quiet, 1, true)},
             {Annotation(quiet, "END",
                         "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 1025)});
  EXPECT_TRUE(DeriveSteps(q).notes.empty());
}

}  // namespace
}  // namespace fragscope::sources
