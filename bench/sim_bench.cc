// Simulator throughput (issue targets: >= 10 M replayed events/s on one core with stats and
// metrics kept; tune of >= 50 settings on a 1 M-event trace in < 10 s on 2 cores):
//   BM_ReplayBundled     the bundled real trace (tests/data/sample/gpt_tiny_50steps.jsonl.gz)
//                        through RequestReplayer -> CachingAllocatorSim -> TraceAnalyzer
//   BM_ReplaySynthetic   a synthetic 10 M-event request trace, 100 k live tensors, same path
//   BM_ReplayBundledTwoThreads, BM_ReplaySyntheticTwoThreads
//                        the same, with the TraceAnalyzer on a second thread (AnalyzerThread,
//                        as `replay --threads 2`); wall time
//   BM_SimOnly           the same synthetic trace through the simulator alone
//   BM_SimOnlyBundled    the bundled real trace through the simulator alone
//   BM_AccessFloor       not a simulation: the memory accesses any simulator of the synthetic
//                        trace must make (id lookup, block record, neighbours), for scale
//   BM_Tune              the default 72-setting grid on the first 1 M events, all threads
// FRAGSCOPE_SIM_BENCH_EVENTS=N makes the synthetic trace N events long instead of 10 M (for
// instruction counts under valgrind, which would take too long on the full trace).
#include <algorithm>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "analysis/analyzer_thread.h"
#include "analysis/trace_analyzer.h"
#include "analysis/tune.h"
#include "fragscope/trace.h"
#include "model/request_replayer.h"

namespace fragscope {
namespace {

constexpr std::uint64_t kCapacity = std::uint64_t{1} << 40;  // large enough never to OOM

model::SimOptions BenchSimOptions(std::int32_t /*device*/) {
  model::SimOptions o;
  o.driver.capacity_bytes = kCapacity;
  return o;
}

// Frees hit mostly recent tensors (activations die young), as in bench/replay_bench.cc.
const std::vector<Event>& SyntheticRequests() {
  static const std::vector<Event> events = [] {
    const char* env = std::getenv("FRAGSCOPE_SIM_BENCH_EVENTS");
    const std::size_t kEvents = env != nullptr ? std::strtoull(env, nullptr, 10) : 10'000'000;
    constexpr std::size_t kLive = 100'000;
    std::vector<Event> out;
    out.reserve(kEvents);
    std::mt19937_64 rng(7);
    auto size = [&]() -> std::uint64_t {
      const auto r = rng() % 100;
      if (r < 60) return 1 + rng() % (256 << 10);
      if (r < 95) return (1 << 20) + rng() % (8 << 20);
      return (8 << 20) + rng() % (64 << 20);
    };
    std::uint64_t next_id = 1;
    std::vector<std::uint64_t> live;
    auto alloc = [&] {
      Event e;
      e.action = Action::kAlloc;
      e.addr = next_id++;
      e.size = size();
      out.push_back(e);
      return e.addr;
    };
    while (live.size() < kLive) live.push_back(alloc());
    while (out.size() < kEvents) {
      const bool young = rng() % 10 != 0;
      const std::size_t i = young ? live.size() - 1 - rng() % 1000 : rng() % live.size();
      Event f;
      f.action = Action::kFreeRequested;
      f.addr = live[i];
      out.push_back(f);
      live[i] = alloc();
    }
    return out;
  }();
  return events;
}

std::vector<Event> ReadTrace(const std::string& path) {
  std::vector<Event> out;
  auto reader = TraceReader::Open(path);
  if (!reader.ok()) return out;
  Event e;
  while (true) {
    auto next = (*reader)->Next(&e);
    if (!next.ok() || !*next) break;
    out.push_back(e);
  }
  return out;
}

void ReplayThroughAnalyzer(benchmark::State& state, const std::vector<Event>& events) {
  for (auto _ : state) {
    TraceHeader header;
    header.kind = TraceKind::kAllocator;
    auto analyzer = analysis::TraceAnalyzer::Create(header, {});
    model::RequestReplayer replayer(BenchSimOptions, model::OomPolicy::kStop,
                                    [&](const Event& e) { (void)(*analyzer)->Consume(e); });
    if (!replayer.ConsumeAll(events).ok()) state.SkipWithError("replay failed");
    benchmark::DoNotOptimize((*analyzer)->events());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * events.size()));
}

// As ReplayThroughAnalyzer, with the analysis on a second thread.
void ReplayThroughAnalyzerThread(benchmark::State& state, const std::vector<Event>& events) {
  for (auto _ : state) {
    TraceHeader header;
    header.kind = TraceKind::kAllocator;
    auto analyzer = analysis::TraceAnalyzer::Create(header, {});
    analysis::AnalyzerThread thread(
        **analyzer, [&](const Event& e, std::uint64_t) { return (*analyzer)->Consume(e); });
    model::RequestReplayer* replayer_ptr = nullptr;
    model::RequestReplayer replayer(BenchSimOptions, model::OomPolicy::kStop, [&](const Event& e) {
      const model::CachingAllocatorSim* sim = replayer_ptr->sim(e.device);
      thread.Send(e, sim ? std::optional<std::uint64_t>(
                               static_cast<std::uint64_t>(sim->stats().num_alloc_retries))
                         : std::nullopt);
    });
    replayer_ptr = &replayer;
    (*analyzer)->SetAllocRetrySource([&](std::int32_t d) { return thread.AllocRetries(d); });
    if (!replayer.ConsumeAll(events).ok()) state.SkipWithError("replay failed");
    if (!thread.Finish().ok()) state.SkipWithError("analysis failed");
    benchmark::DoNotOptimize((*analyzer)->events());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * events.size()));
}

const std::vector<Event>& BundledRequests() {
  static const std::vector<Event> events =
      ReadTrace(std::string(FRAGSCOPE_SOURCE_DIR) + "/tests/data/sample/gpt_tiny_50steps.jsonl.gz");
  return events;
}

// Runs `bench` over the bundled trace, or skips when the sample is missing.
template <typename Bench>
void OnBundled(benchmark::State& state, Bench&& bench) {
  const auto& events = BundledRequests();
  if (events.empty()) {
    state.SkipWithError("bundled sample not found");
    return;
  }
  bench(state, events);
}

void BM_ReplayBundled(benchmark::State& state) { OnBundled(state, ReplayThroughAnalyzer); }
BENCHMARK(BM_ReplayBundled)->Unit(benchmark::kMillisecond);

void BM_ReplaySynthetic(benchmark::State& state) {
  ReplayThroughAnalyzer(state, SyntheticRequests());
}
BENCHMARK(BM_ReplaySynthetic)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_ReplayBundledTwoThreads(benchmark::State& state) {
  OnBundled(state, ReplayThroughAnalyzerThread);
}
BENCHMARK(BM_ReplayBundledTwoThreads)->Unit(benchmark::kMillisecond)->UseRealTime();

void BM_ReplaySyntheticTwoThreads(benchmark::State& state) {
  ReplayThroughAnalyzerThread(state, SyntheticRequests());
}
BENCHMARK(BM_ReplaySyntheticTwoThreads)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(2)
    ->UseRealTime();

void SimOnly(benchmark::State& state, const std::vector<Event>& events) {
  for (auto _ : state) {
    model::RequestReplayer replayer(BenchSimOptions, model::OomPolicy::kStop, {});
    if (!replayer.ConsumeAll(events).ok()) state.SkipWithError("replay failed");
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * events.size()));
}
void BM_SimOnly(benchmark::State& state) { SimOnly(state, SyntheticRequests()); }
BENCHMARK(BM_SimOnly)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_SimOnlyBundled(benchmark::State& state) { OnBundled(state, SimOnly); }
BENCHMARK(BM_SimOnlyBundled)->Unit(benchmark::kMillisecond);

// The floor under any simulation of the synthetic trace: per event, the id's slot in an
// open-addressing table (insert or backward-shift erase), a 64-byte block record taken from or
// returned to a free list, and for a free the records of two neighbours (a merge check); an
// alloc links its record after a pseudo-random one (the block it splits). No best-fit search,
// no statistics, no events.
void BM_AccessFloor(benchmark::State& state) {
  const auto& events = SyntheticRequests();
  struct Record {
    std::uint64_t addr, size, requested, stream;
    std::uint32_t prev, next, flags, pad;
    std::uint64_t more[2];
  };
  static_assert(sizeof(Record) == 64);
  struct Slot {
    std::uint64_t key;
    std::uint32_t record;
  };
  constexpr int kSlotBits = 18;  // 262,144 slots for 100 k live ids
  constexpr std::size_t kMask = (std::size_t{1} << kSlotBits) - 1;
  auto home = [](std::uint64_t key) {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> (64 - kSlotBits));
  };
  for (auto _ : state) {
    std::vector<Slot> slots(kMask + 1, Slot{0, 0});
    std::vector<Record> records(1);
    records.reserve(200'000);
    std::vector<std::uint32_t> free_records;
    std::uint64_t sum = 0;
    for (const Event& e : events) {
      std::size_t i = home(e.addr);
      if (e.action == Action::kAlloc) {
        std::uint32_t r;
        if (!free_records.empty()) {
          r = free_records.back();
          free_records.pop_back();
        } else {
          r = static_cast<std::uint32_t>(records.size());
          records.emplace_back();
        }
        const auto after = static_cast<std::uint32_t>((e.size * 2654435761u) % records.size());
        Record& x = records[r];
        x.addr = e.addr << 12;
        x.size = e.size;
        x.prev = after;
        x.next = records[after].next;
        records[after].next = r;
        while (slots[i].key != 0) i = (i + 1) & kMask;
        slots[i] = Slot{e.addr, r};
      } else {
        while (slots[i].key != e.addr) i = (i + 1) & kMask;
        const std::uint32_t r = slots[i].record;
        for (std::size_t j = (i + 1) & kMask; slots[j].key != 0; j = (j + 1) & kMask) {
          if (((j - home(slots[j].key)) & kMask) >= ((j - i) & kMask)) {
            slots[i] = slots[j];
            i = j;
          }
        }
        slots[i].key = 0;
        const Record& x = records[r];
        sum += records[x.prev].size + records[x.next].size + x.size;
        free_records.push_back(r);
      }
    }
    benchmark::DoNotOptimize(sum);
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * events.size()));
}
BENCHMARK(BM_AccessFloor)->Unit(benchmark::kMillisecond)->Iterations(2);

void BM_Tune(benchmark::State& state) {
  const auto& all = SyntheticRequests();
  static const std::vector<Event> events(
      all.begin(),
      all.begin() + static_cast<std::ptrdiff_t>(std::min<std::size_t>(all.size(), 1'000'000)));
  analysis::TuneOptions options;
  options.capacity_bytes = kCapacity;
  for (auto _ : state) {
    auto ranked = analysis::Tune(events, options);
    if (!ranked.ok()) state.SkipWithError("tune failed");
    benchmark::DoNotOptimize(ranked);
  }
  state.counters["settings"] = static_cast<double>(analysis::DefaultTuneGrid().size());
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * events.size() *
                                                    analysis::DefaultTuneGrid().size()));
}
BENCHMARK(BM_Tune)->Unit(benchmark::kMillisecond)->Iterations(1)->UseRealTime();

}  // namespace
}  // namespace fragscope

BENCHMARK_MAIN();
