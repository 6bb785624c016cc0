#include "sources/snapshot/snapshot_reader.h"

#include <vector>

#include <gtest/gtest.h>

#include "analysis/trace_analyzer.h"
#include "sources/snapshot_test_util.h"

namespace fragscope::sources {
namespace {

using testing::DocBuilder;

constexpr std::uint64_t kMiB = std::uint64_t{1} << 20;

std::vector<Event> AllEvents(SnapshotReader& reader) {
  std::vector<Event> out;
  Event e;
  while (true) {
    auto next = reader.Next(&e);
    EXPECT_TRUE(next.ok()) << next.status().message();
    if (!next.ok() || !*next) break;
    out.push_back(e);
  }
  return out;
}

std::unique_ptr<SnapshotReader> Open(DocBuilder& b) {
  auto snapshot = DecodeSnapshot(b.doc());
  EXPECT_TRUE(snapshot.ok()) << snapshot.status().message();
  return SnapshotReader::FromSnapshot(std::move(*snapshot), "test.pickle");
}

// Replays the reader's events through the analyzer and returns the final layout of device 0.
std::vector<analysis::LayoutSegment> Replay(SnapshotReader& reader,
                                            const std::vector<Event>& events) {
  auto analyzer = analysis::TraceAnalyzer::Create(reader.header(), {});
  EXPECT_TRUE(analyzer.ok());
  for (const Event& e : events) {
    Status st = (*analyzer)->Consume(e);
    EXPECT_TRUE(st.ok()) << st.message();
  }
  analysis::AnalysisResult r = (*analyzer)->Finish("test");
  EXPECT_EQ(r.devices.size(), 1u);
  return r.devices.empty() ? std::vector<analysis::LayoutSegment>{} : r.devices[0].layout;
}

// A trace entry with a time.
Value Timed(DocBuilder& b, std::string_view action, std::uint64_t addr, std::uint64_t size,
            std::int64_t time_us) {
  Value e = b.Entry(action, addr, size);
  b.doc().SetItem(e, b.S("time_us"), b.I(time_us));
  return e;
}

Value Annotation(DocBuilder& b, std::string_view stage, std::string_view name,
                 std::int64_t time_us) {
  return b.Dict(
      {{"stage", b.S(stage)}, {"name", b.S(name)}, {"device", b.I(0)}, {"time_us", b.I(time_us)}});
}

// The reader's events through the analyzer, the start state kept apart as the pipeline does.
analysis::AnalysisResult Analyze(SnapshotReader& reader) {
  auto analyzer = analysis::TraceAnalyzer::Create(reader.header(), {});
  EXPECT_TRUE(analyzer.ok());
  reader.Rewind();
  Event e;
  while (true) {
    auto next = reader.Next(&e);
    EXPECT_TRUE(next.ok()) << next.status().message();
    if (!next.ok() || !*next) break;
    const Status st =
        reader.last_was_start() ? (*analyzer)->ConsumeStartState(e) : (*analyzer)->Consume(e);
    EXPECT_TRUE(st.ok()) << reader.Where() << ": " << st.message();
  }
  return (*analyzer)->Finish("test");
}

TEST(SnapshotReaderTest, OptimizerStepEndsDivideTheHistoryIntoSteps) {
  // One 20 MiB segment S, made in the history. Step 0 allocates and frees 4 MiB, the
  // optimizer step ends (time 1030); step 1 allocates and frees 8 MiB, the optimizer step ends
  // (1060); step 2 allocates 2 MiB, live at the end.
  DocBuilder b;
  const std::uint64_t s = 0x4000000;
  const Value root = b.Snapshot(
      {b.Segment(0, s, 20 * kMiB,
                 {b.Block(s, 2 * kMiB, 2 * kMiB, "active_allocated"),
                  b.Block(s + 2 * kMiB, 18 * kMiB, 0, "inactive")})},
      {{Timed(b, "segment_alloc", s, 20 * kMiB, 1000), Timed(b, "alloc", s, 4 * kMiB, 1010),
        Timed(b, "free_requested", s, 4 * kMiB, 1020),
        Timed(b, "free_completed", s, 4 * kMiB, 1020), Timed(b, "alloc", s, 8 * kMiB, 1040),
        Timed(b, "free_requested", s, 8 * kMiB, 1050),
        Timed(b, "free_completed", s, 8 * kMiB, 1050), Timed(b, "alloc", s, 2 * kMiB, 1070)}});
  b.doc().SetItem(root, b.S("external_annotations"),
                  b.List({Annotation(b, "START", "Optimizer.step#AdamW.step", 1025),
                          Annotation(b, "END", "Optimizer.step#AdamW.step", 1030),
                          Annotation(b, "START", "Optimizer.step#AdamW.step", 1055),
                          Annotation(b, "END", "Optimizer.step#AdamW.step", 1060)}));
  auto reader = Open(b);
  EXPECT_TRUE(reader->warnings().empty()) << reader->warnings().front();
  EXPECT_NE(reader->steps().source.find("3 steps"), std::string::npos) << reader->steps().source;
  const std::vector<Event> events = AllEvents(*reader);
  ASSERT_EQ(events.size(), 11u);  // 8 entries (no start state: S is made in the history), 3 steps
  const std::vector<std::pair<std::size_t, std::int64_t>> steps = {{0, 0}, {5, 1}, {9, 2}};
  for (const auto& [index, step] : steps) {
    EXPECT_EQ(events[index].action, Action::kStep) << index;
    EXPECT_EQ(events[index].step, step) << index;
  }
  EXPECT_EQ(events[4].action, Action::kFreeCompleted);
  EXPECT_EQ(events[6].action, Action::kAlloc);
  EXPECT_EQ(events[6].size, 8 * kMiB);
  // A step event names where it stands; the next entry is named as before.
  reader->Rewind();
  Event e;
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(*reader->Next(&e));
  EXPECT_EQ(reader->Where(), "test.pickle: step 1 (marked before device_traces[0][4])");
  EXPECT_FALSE(reader->last_was_start());
  ASSERT_TRUE(*reader->Next(&e));
  EXPECT_EQ(reader->Where(), "test.pickle: device_traces[0][4]");
  // A second pass yields the same events.
  reader->Rewind();
  const std::vector<Event> again = AllEvents(*reader);
  ASSERT_EQ(again.size(), events.size());
  for (std::size_t i = 0; i < again.size(); ++i) {
    EXPECT_EQ(again[i].action, events[i].action) << i;
    EXPECT_EQ(again[i].step, events[i].step) << i;
  }

  // The analysis has one timeline row per step, with the step's own peak.
  const analysis::AnalysisResult r = Analyze(*reader);
  EXPECT_EQ(r.timeline_unit, "step");
  EXPECT_EQ(r.steps, 3u);
  EXPECT_EQ(r.first_time_us, 1000);
  ASSERT_EQ(r.devices.size(), 1u);
  const auto& timeline = r.devices[0].timeline;
  ASSERT_EQ(timeline.size(), 3u);
  const std::uint64_t peaks[] = {4 * kMiB, 8 * kMiB, 2 * kMiB};
  const std::int64_t ends[] = {1020, 1050, 1070};
  for (std::size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(timeline[i].step_first, static_cast<std::int64_t>(i));
    EXPECT_EQ(timeline[i].peak_allocated_bytes, peaks[i]) << i;
    EXPECT_EQ(timeline[i].time_us, ends[i]) << i;
  }
  EXPECT_EQ(r.devices[0].peak_allocated.when.step, 1);
}

TEST(SnapshotReaderTest, ADeviceReadBeforeTheFirstStepCountsInTheSetup) {
  // Device 0 has only its final segment (no history); device 1's history has a ProfilerStep#3
  // start after its second entry. Device 0's state is the setup's (before the first step), as
  // device 1's first two entries are.
  DocBuilder b;
  const std::uint64_t s = 0x4000000, t = 0x8000000;
  const Value root = b.Snapshot(
      {b.Segment(0, s, 20 * kMiB,
                 {b.Block(s, 6 * kMiB, 6 * kMiB, "active_allocated"),
                  b.Block(s + 6 * kMiB, 14 * kMiB, 0, "inactive")}),
       b.Segment(1, t, 20 * kMiB, {b.Block(t, 20 * kMiB, 0, "inactive")})},
      {{},
       {Timed(b, "segment_alloc", t, 20 * kMiB, 1000), Timed(b, "alloc", t, 4 * kMiB, 1010),
        Timed(b, "free_requested", t, 4 * kMiB, 1020),
        Timed(b, "free_completed", t, 4 * kMiB, 1020)}});
  b.doc().SetItem(root, b.S("external_annotations"),
                  b.List({Annotation(b, "START", "ProfilerStep#3", 1015)}));
  auto reader = Open(b);
  EXPECT_EQ(reader->steps().device, 1);
  const analysis::AnalysisResult r = Analyze(*reader);
  EXPECT_EQ(r.steps, 1u);
  ASSERT_EQ(r.devices.size(), 2u);
  const auto& setup = r.devices[0].timeline.front();
  EXPECT_EQ(setup.step_first, -1);
  EXPECT_EQ(setup.peak_reserved_bytes, 20 * kMiB);
  EXPECT_EQ(setup.peak_allocated_bytes, 6 * kMiB);
  EXPECT_EQ(r.devices[0].peak_reserved.when.step, -1);
  EXPECT_EQ(r.devices[1].timeline.back().step_first, 3);
}

TEST(SnapshotReaderTest, RebuildsTheStartStateFromTheFinalSegments) {
  // Final state: a small segment S0 holding Q (512 B, allocated before the history began) and
  // free space; a large segment S1 (created in the history) holding A (4 MiB) and free space.
  // History: segment_free of S2 (so S2 existed at the start), free of P (live at the start, in
  // S0), segment_alloc of S1, alloc of A.
  DocBuilder b;
  const std::uint64_t s0 = 0x1000000, s1 = 0x4000000, s2 = 0x9000000;
  b.Snapshot({b.Segment(0, s0, 2 * kMiB,
                        {b.Block(s0, 512, 100, "active_allocated"),
                         b.Block(s0 + 512, 2 * kMiB - 512, 1000, "inactive")},
                        "small"),
              b.Segment(0, s1, 20 * kMiB,
                        {b.Block(s1, 4 * kMiB, 4 * kMiB - 100, "active_allocated"),
                         b.Block(s1 + 4 * kMiB, 16 * kMiB, 0, "inactive")})},
             {{b.Entry("segment_free", s2, 20 * kMiB), b.Entry("free_requested", s0 + 512, 1000),
               b.Entry("free_completed", s0 + 512, 1000), b.Entry("segment_alloc", s1, 20 * kMiB),
               b.Entry("alloc", s1, 4 * kMiB - 100)}});
  auto reader = Open(b);
  EXPECT_TRUE(reader->warnings().empty()) << reader->warnings().front();
  const std::vector<Event> events = AllEvents(*reader);
  // Start: S0 and S2 (address order), Q and P; then the five history entries.
  ASSERT_EQ(events.size(), 9u);
  EXPECT_EQ(events[0].action, Action::kSegmentAlloc);
  EXPECT_EQ(events[0].addr, s0);
  EXPECT_EQ(events[1].action, Action::kSegmentAlloc);
  EXPECT_EQ(events[1].addr, s2);
  EXPECT_EQ(events[2].action, Action::kBlock);
  EXPECT_EQ(events[2].addr, s0);
  EXPECT_EQ(events[2].block_size, 512u);  // exact: still live at the end
  EXPECT_EQ(events[3].action, Action::kBlock);
  EXPECT_EQ(events[3].addr, s0 + 512);
  EXPECT_EQ(events[3].size, 1000u);
  EXPECT_EQ(events[3].block_size, 1024u);  // freed in the history: PyTorch's rounding
  EXPECT_EQ(events[8].action, Action::kAlloc);
  EXPECT_EQ(events[8].block_size, 4 * kMiB);  // told by the final segments
  // The recorded entries keep their place for messages.
  reader = Open(b);
  Event e;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(*reader->Next(&e));
  EXPECT_EQ(reader->Where(), "test.pickle: device_traces[0][0]");
  EXPECT_EQ(e.action, Action::kSegmentFree);

  // Replayed forward, the history ends in exactly the final segments.
  const auto layout = Replay(*reader, events);
  ASSERT_EQ(layout.size(), 2u);
  EXPECT_EQ(layout[0].addr, s0);
  ASSERT_EQ(layout[0].blocks.size(), 2u);
  EXPECT_EQ(layout[0].blocks[0].size, 512u);
  EXPECT_EQ(layout[0].blocks[0].state, model::BlockState::kAllocated);
  EXPECT_EQ(layout[0].blocks[1].state, model::BlockState::kFree);
  EXPECT_EQ(layout[1].addr, s1);
  ASSERT_EQ(layout[1].blocks.size(), 2u);
  EXPECT_EQ(layout[1].blocks[0].size, 4 * kMiB);
}

TEST(SnapshotReaderTest, AStartBlockKeepsTheRemainderItsAllocationCouldNotSplitOff) {
  // Final state: one 20 MiB large segment S, all free. History: P (5 MiB asked) and Q (6 MiB)
  // are freed, so both were live at the start, and nothing recorded their block sizes. At the
  // start P occupies [S, S + 5.5 MiB) up to Q: the 0.5 MiB after its 5 MiB cannot be a free
  // block of the large pool (a split leaves more than 1 MiB), so it is the remainder P's
  // allocation kept unsplit (spec §4.8), and P's block is 5.5 MiB. Behind Q lie 8.5 MiB free:
  // that could be a split-off block, so Q's block is its rounded 6 MiB. In a small segment R
  // (1000 B asked, 1024 rounded) has 512 bytes free behind it: the small pool splits
  // remainders of 512 B and more, so R stays 1024.
  DocBuilder b;
  const std::uint64_t s = 0x4000000, t = 0x8000000;
  const std::uint64_t p = s, q = s + 5 * kMiB + kMiB / 2, r = t;
  b.Snapshot({b.Segment(0, s, 20 * kMiB, {b.Block(s, 20 * kMiB, 0, "inactive")}),
              b.Segment(0, t, 2 * kMiB,
                        {b.Block(t, 1536, 1000, "inactive"),
                         b.Block(t + 1536, 2 * kMiB - 1536, 4096, "active_allocated")},
                        "small")},
             {{b.Entry("free_requested", p, 5 * kMiB), b.Entry("free_completed", p, 5 * kMiB),
               b.Entry("free_requested", q, 6 * kMiB), b.Entry("free_completed", q, 6 * kMiB),
               b.Entry("free_requested", r, 1000), b.Entry("free_completed", r, 1000)}});
  auto reader = Open(b);
  const std::vector<Event> events = AllEvents(*reader);
  EXPECT_TRUE(reader->warnings().empty()) << reader->warnings().front();
  std::vector<Event> blocks;
  for (const Event& e : events) {
    if (e.action == Action::kBlock) blocks.push_back(e);
  }
  ASSERT_EQ(blocks.size(), 4u);  // P, Q, R and the small segment's live block
  EXPECT_EQ(blocks[0].addr, p);
  EXPECT_EQ(blocks[0].size, 5 * kMiB);
  EXPECT_EQ(blocks[0].block_size, 5 * kMiB + kMiB / 2);
  EXPECT_EQ(blocks[1].addr, q);
  EXPECT_EQ(blocks[1].block_size, 6 * kMiB);
  EXPECT_EQ(blocks[2].addr, r);
  EXPECT_EQ(blocks[2].block_size, 1024u);
  // Forward again, the history ends in the final segments.
  const auto layout = Replay(*reader, events);
  ASSERT_EQ(layout.size(), 2u);
  ASSERT_EQ(layout[0].blocks.size(), 1u);
  EXPECT_EQ(layout[0].blocks[0].size, 20 * kMiB);
  EXPECT_EQ(layout[0].blocks[0].state, model::BlockState::kFree);
}

TEST(SnapshotReaderTest, ExpandableMapsAndUnmapsAreUndone) {
  DocBuilder b;
  const std::uint64_t e0 = 0xa0000000;
  b.Snapshot(
      {b.Segment(0, e0, 20 * kMiB, {b.Block(e0, 20 * kMiB, 0, "inactive")}, "large", 0, true)},
      {{b.Entry("segment_map", e0 + 20 * kMiB, 20 * kMiB),
        b.Entry("segment_unmap", e0 + 20 * kMiB, 20 * kMiB)}});
  auto reader = Open(b);
  EXPECT_TRUE(reader->warnings().empty()) << reader->warnings().front();
  const std::vector<Event> events = AllEvents(*reader);
  ASSERT_EQ(events.size(), 3u);
  EXPECT_EQ(events[0].action, Action::kSegmentMap);
  EXPECT_EQ(events[0].addr, e0);
  EXPECT_EQ(events[0].size, 20 * kMiB);
  const auto layout = Replay(*reader, events);
  ASSERT_EQ(layout.size(), 1u);
  EXPECT_EQ(layout[0].size, 20 * kMiB);
  EXPECT_TRUE(layout[0].expandable);
}

TEST(SnapshotReaderTest, InconsistentHistoryWarnsWithTheEntry) {
  DocBuilder b;
  b.Snapshot(
      {b.Segment(0, 0x1000000, 2 * kMiB, {b.Block(0x1000000, 2 * kMiB, 0, "inactive")}, "small")},
      {{b.Entry("alloc", 0x1000000, 512)}});  // never freed, yet free at the end
  auto reader = Open(b);
  ASSERT_EQ(reader->warnings().size(), 1u);
  EXPECT_NE(reader->warnings()[0].find("device_traces[0][0]"), std::string::npos);
  EXPECT_NE(reader->warnings()[0].find("no block is live there afterwards"), std::string::npos);
}

TEST(SnapshotReaderTest, NoHistoryYieldsTheFinalState) {
  DocBuilder b;
  b.doc().set_root(b.List({b.Segment(1, 0x2000000, 2 * kMiB,
                                     {b.Block(0x2000000, 1024, 1000, "active_pending_free"),
                                      b.Block(0x2000400, 2 * kMiB - 1024, 0, "inactive")},
                                     "small")}));
  auto reader = Open(b);
  const std::vector<Event> events = AllEvents(*reader);
  ASSERT_EQ(events.size(), 3u);  // segment, block, and its pending free
  EXPECT_EQ(events[0].device, 1);
  EXPECT_EQ(events[1].action, Action::kBlock);
  EXPECT_EQ(events[2].action, Action::kFreeRequested);
  EXPECT_TRUE(reader->devices_with_history().empty());
  ASSERT_EQ(reader->header().devices.size(), 1u);
  EXPECT_EQ(reader->header().devices[0].device, 1);
}

// A block allocated on autograd's backward thread has C++ frames only: its call site is a
// label naming the operator, a frame of its own, not the unwinder's frame innermost in every
// stack; two stacks of the same operator share the label's frame (issue 29 item 9).
TEST(SnapshotReaderTest, CppOnlyStacksAreNamedByALabelFrame) {
  DocBuilder b;
  auto cpp_stack = [&b](std::string_view node_file) {
    return b.List({b.Frame("??", 0, "torch::unwind::unwind()"),
                   b.Frame("CUDACachingAllocator.cpp", 0,
                           "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::"
                           "malloc(signed char, unsigned long, CUstream_st*)"),
                   b.Frame("??", 0, "at::_ops::mm::call(at::Tensor const&, at::Tensor const&)"),
                   b.Frame(node_file, 0, "torch::autograd::generated::MmBackward0::apply()"),
                   b.Frame("??", 0, "torch::autograd::Engine::thread_main()")});
  };
  const Value python = b.List(
      {b.Frame("??", 0, "torch::unwind::unwind()"), b.Frame("/home/u/train.py", 12, "step")});
  const std::uint64_t base = 0x7f0000000000;
  b.Snapshot({b.Segment(0, base, 20 * kMiB,
                        {b.Block(base, 4 * kMiB, 4 * kMiB, "active_allocated", cpp_stack("??")),
                         b.Block(base + 4 * kMiB, 4 * kMiB, 4 * kMiB, "active_allocated",
                                 cpp_stack("Functions.cpp")),
                         b.Block(base + 8 * kMiB, 4 * kMiB, 4 * kMiB, "active_allocated", python),
                         b.Block(base + 12 * kMiB, 8 * kMiB, 0, "inactive")})},
             {});
  auto reader = Open(b);
  const std::vector<Event> events = AllEvents(*reader);
  std::vector<std::int32_t> sites;
  for (const Event& e : events) {
    if (e.action == Action::kBlock) sites.push_back(e.frame);
  }
  ASSERT_EQ(sites.size(), 3u);
  const std::vector<Frame>& frames = reader->frames();
  for (const std::int32_t site : sites) {
    ASSERT_GE(site, 0);
    ASSERT_LT(static_cast<std::size_t>(site), frames.size());
    EXPECT_EQ(frames[static_cast<std::size_t>(site)].id, site);
  }
  EXPECT_EQ(sites[0], sites[1]);
  const Frame& label = frames[static_cast<std::size_t>(sites[0])];
  EXPECT_EQ(label.name, "C++ only (autograd backward thread): at::_ops::mm in MmBackward0");
  EXPECT_EQ(label.filename, "");
  EXPECT_EQ(frames[static_cast<std::size_t>(sites[2])].filename, "/home/u/train.py");
}

}  // namespace
}  // namespace fragscope::sources
