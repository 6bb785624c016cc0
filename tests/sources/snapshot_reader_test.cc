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

}  // namespace
}  // namespace fragscope::sources
