// RequestReplayer::ConsumeAll reads ahead (prefetching id slots and the records of blocks about
// to be freed) once a device holds kReadAheadMinLive live ids. The hints must change nothing:
// the same events, results and errors as feeding Consume one event at a time.
#include "model/request_replayer.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

namespace fragscope::model {
namespace {

struct Outcome {
  std::vector<std::string> emitted;  // every allocator event, printed
  std::string status;
  std::uint64_t events = 0;
  std::vector<std::string> stats;
};

SimOptions Options(std::int32_t) {
  SimOptions o;
  o.driver.capacity_bytes = std::uint64_t{1} << 40;
  return o;
}

Outcome Replay(const std::vector<Event>& requests, bool all_at_once) {
  Outcome out;
  RequestReplayer replayer(Options, OomPolicy::kStop, [&](const Event& e) {
    out.emitted.push_back(fmt::format("{} d{} a{} s{} st{} b{}", ActionName(e.action), e.device,
                                      e.addr, e.size, e.stream, e.block_size));
  });
  Status status;
  if (all_at_once) {
    status = replayer.ConsumeAll(requests);
  } else {
    for (const Event& e : requests) {
      replayer.Prefetch(e);  // a hint too early is as harmless as none
      status = replayer.Consume(e);
      if (!status.ok()) break;
    }
  }
  out.status = status.ToString();
  out.events = replayer.events();
  for (const auto& [device, sim] : replayer.devices()) {
    for (const auto& [key, value] : sim->stats().Flatten()) {
      out.stats.push_back(fmt::format("{}:{}={}", device, key, value));
    }
  }
  return out;
}

// Two devices, the first with 20,000 live ids (above the read-ahead threshold), frees mostly of
// recent ids, some of old ones, on two streams.
std::vector<Event> BigTrace(std::size_t events) {
  std::mt19937_64 rng(11);
  std::vector<Event> out;
  std::vector<std::uint64_t> live[2];
  std::uint64_t next_id = 1;
  auto alloc = [&](std::int32_t device) {
    Event e;
    e.action = Action::kAlloc;
    e.device = device;
    e.addr = next_id++;
    e.size = 1 + rng() % (rng() % 4 == 0 ? (16u << 20) : (256u << 10));
    e.stream = rng() % 8 == 0 ? 7 : 0;
    out.push_back(e);
    live[device].push_back(e.addr);
  };
  for (int i = 0; i < 20'000; ++i) alloc(0);
  for (int i = 0; i < 100; ++i) alloc(1);
  while (out.size() < events) {
    const std::int32_t device = rng() % 10 == 0 ? 1 : 0;
    std::vector<std::uint64_t>& ids = live[device];
    const std::size_t i = rng() % 4 != 0
                              ? ids.size() - 1 - rng() % std::min<std::size_t>(ids.size(), 500)
                              : rng() % ids.size();
    Event f;
    f.action = rng() % 2 == 0 ? Action::kFreeRequested : Action::kFreeCompleted;
    f.device = device;
    f.addr = ids[i];
    out.push_back(f);
    ids[i] = ids.back();
    ids.pop_back();
    alloc(device);
  }
  return out;
}

TEST(RequestReplayerTest, ReadingAheadChangesNothing) {
  const std::vector<Event> trace = BigTrace(120'000);
  const Outcome ahead = Replay(trace, true);
  const Outcome plain = Replay(trace, false);
  EXPECT_EQ(ahead.status, "OK");
  EXPECT_EQ(ahead.events, trace.size());
  EXPECT_GT(ahead.emitted.size(), trace.size());
  EXPECT_EQ(ahead.emitted, plain.emitted);
  EXPECT_EQ(ahead.stats, plain.stats);
}

// A double free a few events after the first free of the same id: when the read-ahead looks at
// the second free, the id is still live and names a block; by the time it is consumed it is
// not. The error must be the same, at the same event.
TEST(RequestReplayerTest, DoubleFreeInsideTheReadAheadWindowIsStillAnError) {
  std::vector<Event> trace = BigTrace(30'000);
  Event free_it;  // the trace's last alloc on device 0: live at its end
  free_it.action = Action::kFreeRequested;
  for (const Event& e : trace) {
    if (e.action == Action::kAlloc && e.device == 0) free_it.addr = e.addr;
  }
  auto small_allocs = [&](std::uint64_t first_id, int n) {
    for (int i = 0; i < n; ++i) {
      Event a;
      a.action = Action::kAlloc;
      a.addr = first_id + static_cast<std::uint64_t>(i);
      a.size = 4096;
      trace.push_back(a);
    }
  };
  trace.push_back(free_it);
  small_allocs(1'000'000'000, 5);
  trace.push_back(free_it);
  small_allocs(2'000'000'000, 20);
  const Outcome ahead = Replay(trace, true);
  const Outcome plain = Replay(trace, false);
  EXPECT_NE(ahead.status.find("which is not live"), std::string::npos) << ahead.status;
  EXPECT_EQ(ahead.status, plain.status);
  EXPECT_EQ(ahead.events, trace.size() - 20);  // stopped at the second free
  EXPECT_EQ(ahead.events, plain.events);
  EXPECT_EQ(ahead.emitted, plain.emitted);
}

TEST(RequestReplayerTest, PrefetchOfAnUnknownDeviceIsANoOp) {
  RequestReplayer replayer(Options, OomPolicy::kStop, {});
  Event e;
  e.device = 40000;
  replayer.Prefetch(e);
  e.device = -3;
  replayer.Prefetch(e);
  EXPECT_EQ(replayer.events(), 0u);
}

}  // namespace
}  // namespace fragscope::model
