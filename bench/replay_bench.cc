// Event replay throughput: applying allocator events to DeviceMemory with every counter and
// free-size index kept current, and the full `analyze` pipeline (TraceAnalyzer: peaks, request
// profiles, timeline windows with metrics), on a synthetic trace of 10 M events that holds
// 100 k live blocks in steady state.
#include <map>
#include <random>
#include <set>
#include <vector>

#include <benchmark/benchmark.h>

#include "analysis/trace_analyzer.h"
#include "model/allocator_rules.h"
#include "model/device_memory.h"

namespace fragscope {
namespace {

struct CompactEvent {
  Action action;
  std::uint64_t addr;
  std::uint64_t size;
};

// A compact best-fit allocator with PyTorch's rounding, pools and split rules, used only to
// produce a valid allocator trace quickly (std::map based; not timed).
class TraceGenerator {
 public:
  std::uint64_t Malloc(std::uint64_t request, std::vector<CompactEvent>* out) {
    const std::uint64_t size = rules_.RoundSize(request);
    const Pool pool = model::AllocatorRules::PoolFor(size);
    auto& by_size = by_size_[pool == Pool::kSmall];
    auto it = by_size.lower_bound({size, 0});
    std::uint64_t addr, block;
    if (it == by_size.end()) {
      block = model::AllocatorRules::SegmentSize(size);
      addr = next_;
      next_ += block + (2 << 20);
      out->push_back({Action::kSegmentAlloc, addr, block});
    } else {
      block = it->first;
      addr = it->second;
      by_size.erase(it);
      by_addr_.erase(addr);
    }
    if (rules_.ShouldSplit(pool, block, size)) {
      Insert(pool, addr + size, block - size);
      block = size;
    }
    live_[addr] = {block, request, pool};
    out->push_back({Action::kAlloc, addr, request});
    return addr;
  }

  void Free(std::uint64_t addr, std::vector<CompactEvent>* out) {
    const Live l = live_.at(addr);
    live_.erase(addr);
    out->push_back({Action::kFreeRequested, addr, l.request});
    out->push_back({Action::kFreeCompleted, addr, l.request});
    std::uint64_t start = addr, size = l.block;
    // Merge with free neighbours inside the same segment (live blocks separate segments' ends
    // because segments are never adjacent here).
    auto next = by_addr_.find(addr + size);
    if (next != by_addr_.end()) {
      size += next->second.first;
      by_size_[next->second.second == Pool::kSmall].erase({next->second.first, next->first});
      by_addr_.erase(next);
    }
    auto prev = by_addr_.lower_bound(addr);
    if (prev != by_addr_.begin()) {
      --prev;
      if (prev->first + prev->second.first == addr) {
        start = prev->first;
        size += prev->second.first;
        by_size_[prev->second.second == Pool::kSmall].erase({prev->second.first, prev->first});
        by_addr_.erase(prev);
      }
    }
    Insert(l.pool, start, size);
  }

 private:
  struct Live {
    std::uint64_t block, request;
    Pool pool;
  };
  void Insert(Pool pool, std::uint64_t addr, std::uint64_t size) {
    by_size_[pool == Pool::kSmall].insert({size, addr});
    by_addr_[addr] = {size, pool};
  }
  model::AllocatorRules rules_;
  std::set<std::pair<std::uint64_t, std::uint64_t>> by_size_[2];
  std::map<std::uint64_t, std::pair<std::uint64_t, Pool>> by_addr_;
  std::map<std::uint64_t, Live> live_;
  std::uint64_t next_ = std::uint64_t{1} << 40;
};

// Frees pick a live block: with `uniform`, any of the 100 k with equal chance (worst case for
// caches); otherwise 90% among the 1,000 most recently allocated (activations and temporaries
// die young, as in a training step) and 10% among all.
std::vector<CompactEvent> MakeTrace(bool uniform) {
  {
    constexpr std::size_t kEvents = 10'000'000;
    constexpr std::size_t kLive = 100'000;
    std::vector<CompactEvent> events;
    events.reserve(kEvents + 16);
    TraceGenerator gen;
    std::mt19937_64 rng(42);
    // Tensor sizes of a training job: many small ones, activations of a few MiB, rare big ones.
    auto size = [&] {
      const auto r = rng() % 100;
      if (r < 60) return 1 + rng() % (256 << 10);
      if (r < 95) return (1 << 20) + rng() % (8 << 20);
      return (8 << 20) + rng() % (64 << 20);
    };
    std::vector<std::uint64_t> live;
    while (live.size() < kLive) live.push_back(gen.Malloc(size(), &events));
    while (events.size() < kEvents) {
      const bool young = !uniform && rng() % 10 != 0;
      const std::size_t i = young ? live.size() - 1 - rng() % 1000 : rng() % live.size();
      gen.Free(live[i], &events);
      live[i] = gen.Malloc(size(), &events);
    }
    events.resize(kEvents);  // may cut between a free's two halves: harmless at the end
    return events;
  }
}

const std::vector<CompactEvent>& SyntheticTrace(bool uniform) {
  static const std::vector<CompactEvent> recent = MakeTrace(false);
  if (!uniform) return recent;
  static const std::vector<CompactEvent> random = MakeTrace(true);
  return random;
}

// Like the trace reader, which fills one Event per line, the loops reuse one Event.
const Event& ToEvent(const CompactEvent& c, Event* e) {
  e->action = c.action;
  e->addr = c.addr;
  e->size = c.size;
  return *e;
}

void BM_DeviceMemoryApply(benchmark::State& state) {
  const auto& trace = SyntheticTrace(state.range(0) != 0);
  for (auto _ : state) {
    model::DeviceMemory memory(0);
    Event e;
    const bool prefetch = state.range(1) != 0;
    for (std::size_t i = 0; i < trace.size(); ++i) {
      // A reader that looks ahead can hint the model about the addresses to come.
      if (prefetch && i + 8 < trace.size()) memory.Prefetch(trace[i + 8].addr);
      if (!memory.Apply(ToEvent(trace[i], &e)).ok()) state.SkipWithError("invalid event");
    }
    benchmark::DoNotOptimize(memory.reserved());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * trace.size()));
}
BENCHMARK(BM_DeviceMemoryApply)
    ->ArgNames({"uniform_frees", "prefetch"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

void BM_TraceAnalyzerConsume(benchmark::State& state) {
  const auto& trace = SyntheticTrace(state.range(0) != 0);
  for (auto _ : state) {
    TraceHeader header;
    header.kind = TraceKind::kAllocator;
    auto analyzer = analysis::TraceAnalyzer::Create(header, {});
    Event e;
    for (const CompactEvent& c : trace) {
      if (!(*analyzer)->Consume(ToEvent(c, &e)).ok()) state.SkipWithError("invalid event");
    }
    benchmark::DoNotOptimize((*analyzer)->events());
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations() * trace.size()));
}
BENCHMARK(BM_TraceAnalyzerConsume)
    ->ArgName("uniform_frees")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->Iterations(3);

}  // namespace
}  // namespace fragscope

BENCHMARK_MAIN();
