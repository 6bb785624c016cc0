// AnalyzerThread: events reach the consumer in order on another thread, each device's retry
// count follows its latest event (step markers and unknown counts leave it alone), and the
// consumer's first error stops it.
#include "analysis/analyzer_thread.h"

#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::analysis {
namespace {

Event Ev(Action action, std::int32_t device, std::uint64_t addr) {
  Event e;
  e.action = action;
  e.device = device;
  e.addr = addr;
  e.size = 512;
  return e;
}

TEST(AnalyzerThreadTest, ConsumesInOrderAndTracksRetriesPerDevice) {
  TraceHeader header;
  header.kind = TraceKind::kAllocator;
  auto analyzer = TraceAnalyzer::Create(header, {});
  ASSERT_TRUE(analyzer.ok());
  std::vector<std::uint64_t> addrs;
  // What AllocRetries answered, read on the analyzing thread just before each event.
  std::vector<std::optional<std::uint64_t>> dev0, dev1;
  std::thread::id consumer;
  std::unique_ptr<AnalyzerThread> thread;
  std::vector<std::uint64_t> wheres;
  thread = std::make_unique<AnalyzerThread>(**analyzer, [&](const Event& e, std::uint64_t where) {
    wheres.push_back(where);
    consumer = std::this_thread::get_id();
    addrs.push_back(e.addr);
    dev0.push_back(thread->AllocRetries(0));
    dev1.push_back(thread->AllocRetries(1));
    return Status::Ok();
  });
  thread->Send(Ev(Action::kSegmentAlloc, 0, 1), 3, 101);
  thread->Send(Ev(Action::kSegmentAlloc, 1, 2), 7);
  Event step = Ev(Action::kStep, 0, 3);
  thread->Send(step, 99);  // a marker: not the simulator's count
  thread->Send(Ev(Action::kAlloc, 0, 4), 5);
  thread->Send(Ev(Action::kAlloc, 1, 5), std::nullopt);  // unknown: keeps the last
  thread->Send(Ev(Action::kAlloc, -1, 6), 8);            // no such device: ignored
  ASSERT_TRUE(thread->Finish().ok());
  EXPECT_NE(consumer, std::this_thread::get_id());
  EXPECT_EQ(addrs, (std::vector<std::uint64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(wheres, (std::vector<std::uint64_t>{101, 0, 0, 0, 0, 0}));
  using R = std::optional<std::uint64_t>;
  EXPECT_EQ(dev0, (std::vector<R>{3, 3, 3, 5, 5, 5}));
  EXPECT_EQ(dev1, (std::vector<R>{std::nullopt, 7, 7, 7, 7, 7}));
  EXPECT_EQ(thread->AllocRetries(0), R(5));
  EXPECT_EQ(thread->AllocRetries(1), R(7));
  EXPECT_EQ(thread->AllocRetries(2), std::nullopt);
  EXPECT_EQ(thread->AllocRetries(-1), std::nullopt);
}

TEST(AnalyzerThreadTest, FirstErrorStopsAndIsReturned) {
  TraceHeader header;
  auto analyzer = TraceAnalyzer::Create(header, {});
  ASSERT_TRUE(analyzer.ok());
  int consumed = 0;
  AnalyzerThread thread(**analyzer, [&](const Event& e, std::uint64_t) {
    ++consumed;
    return e.addr == 10 ? Status::Corruption("bad event 10") : Status::Ok();
  });
  for (std::uint64_t i = 0; i < 100000 && !thread.failed(); ++i) {
    thread.Send(Ev(Action::kAlloc, 0, i), 0);
  }
  const Status s = thread.Finish();
  EXPECT_EQ(s.message(), "bad event 10");
  EXPECT_EQ(consumed, 11);
}

}  // namespace
}  // namespace fragscope::analysis
