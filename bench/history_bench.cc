// Appending agent samples to the SQLite history (docs/history.md): samples per second by batch
// size, with synchronous=FULL (the default: one fsync per commit) and NORMAL. The daemon's load
// target is 64 agents x 10 samples/s (issue 6); this says which batching that needs.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include <benchmark/benchmark.h>

#include "sinks/history/history_store.h"

namespace {

using fragscope::sinks::HistoryOptions;
using fragscope::sinks::HistoryStore;

fragscope::agent::AgentSample MakeSample(std::int64_t step, int rank) {
  fragscope::agent::AgentSample s;
  s.pid = 1000 + static_cast<std::uint32_t>(rank);
  s.rank = rank;
  s.job = "bench-job";
  s.run = "bench-run";
  s.architecture = "gpt-1.3b";
  s.device_uuid = "GPU-8c1e4a52-1d2b-4b8e-9a77-0c3f5e6d7a8b";
  s.device_index = rank % 8;
  s.step = step;
  s.reserved_bytes = 40ull << 30;
  s.allocated_bytes = 31ull << 30;
  s.fragmentation_ratio = 0.22;
  for (std::size_t b = 10; b < 32; ++b) {
    s.free_block_count[b] = b;
    s.free_block_bytes[b] = b << b;
  }
  return s;
}

void BM_AppendSamples(benchmark::State& state) {
  const auto batch_size = static_cast<std::size_t>(state.range(0));
  const bool sync_full = state.range(1) != 0;
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("fragscope_history_bench_" + std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  HistoryOptions options;
  options.sync_full = sync_full;
  auto store = HistoryStore::Open((dir / "history.sqlite").string(), options);
  if (!store.ok()) {
    state.SkipWithError(store.status().ToString().c_str());
    return;
  }
  std::vector<fragscope::agent::AgentSample> batch;
  for (std::size_t i = 0; i < batch_size; ++i) batch.push_back(MakeSample(0, static_cast<int>(i)));
  std::int64_t step = 0;
  for (auto _ : state) {
    for (auto& s : batch) s.step = step;
    ++step;
    fragscope::Status st = (*store)->AppendSamples(batch, 1'800'000'000'000'000);
    if (!st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      break;
    }
  }
  state.SetItemsProcessed(state.iterations() * static_cast<std::int64_t>(batch_size));
  store.value().reset();  // close before removing the files
  std::filesystem::remove_all(dir);
}
// Args: samples per batch (one transaction each), synchronous=FULL (1) or NORMAL (0).
BENCHMARK(BM_AppendSamples)
    ->ArgsProduct({{1, 64, 640}, {1, 0}})
    ->ArgNames({"batch", "full"})
    ->UseRealTime()  // the fsync wait is the cost being measured, and it is not CPU time
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
