// RenderExposition: the CPU cost of one /metrics answer. A node with 8 GPUs (NVML facts, two
// compute processes each) and `agents` processes, each with a full sample: 12 free-block
// buckets in use, GPU labels joined, rank and job set. Reports bytes of exposition per second.
#include <string>

#include <benchmark/benchmark.h>

#include "sinks/prometheus/exposition.h"

namespace {

namespace prom = fragscope::sinks::prometheus;

prom::NodeState MakeState(int agents) {
  prom::NodeState state;
  state.hostname = "gpu-node-017.cluster.example.org";
  for (int g = 0; g < 8; ++g) {
    fragscope::gpu::GpuInfo info;
    info.uuid = "GPU-6c1d2b3a-0000-4000-8000-00000000000" + std::to_string(g);
    info.index = static_cast<std::uint32_t>(g);
    info.pci_bus_id = "00000000:" + std::to_string(10 + g) + ":00.0";
    info.name = "NVIDIA H100 80GB HBM3";
    info.device_minor = static_cast<std::uint32_t>(g);
    info.memory_total_bytes = 85899345920ull;
    info.memory_used_bytes = 60000000000ull;
    info.memory_free_bytes = 25899345920ull;
    info.bar1_total_bytes = 1ull << 37;
    info.bar1_used_bytes = 1ull << 30;
    info.processes.push_back({100u + static_cast<std::uint32_t>(g), 1ull << 34, {}, {}});
    info.processes.push_back({200u + static_cast<std::uint32_t>(g), 1ull << 33, {}, {}});
    state.gpus.gpus.push_back(info);
  }
  for (int a = 0; a < agents; ++a) {
    fragscope::agent::AgentEntry e;
    auto& s = e.sample;
    s.pid = 100000u + static_cast<std::uint32_t>(a);
    s.rank = a;
    s.job = "llm-pretrain-70b-run-42";
    s.device_uuid = state.gpus.gpus[static_cast<std::size_t>(a % 8)].uuid;
    s.step = 123456;
    s.reserved_bytes = 70ull << 30;
    s.allocated_bytes = 60ull << 30;
    s.largest_free_block = 3ull << 30;
    s.fragmentation_ratio = 0.4321;
    for (int b = 12; b < 24; ++b) {
      s.free_block_count[static_cast<std::size_t>(b)] = 17;
      s.free_block_bytes[static_cast<std::size_t>(b)] = 17ull << b;
    }
    s.forecast_level = fragscope::RiskLevel::kWatch;
    s.steps_to_oom = 5000;
    e.samples = 99999;
    e.received_unix_ms = 1795328894064;
    state.agents.push_back(e);
  }
  return state;
}

void BM_RenderExposition(benchmark::State& bench) {
  const prom::NodeState state = MakeState(static_cast<int>(bench.range(0)));
  std::size_t bytes = 0;
  for (auto _ : bench) {
    std::string text = prom::RenderExposition(state);
    bytes += text.size();
    benchmark::DoNotOptimize(text);
  }
  bench.SetBytesProcessed(static_cast<std::int64_t>(bytes));
  bench.counters["exposition_bytes"] = static_cast<double>(prom::RenderExposition(state).size());
}
// 512: the daemon's default --max-series, the largest page it renders at its defaults.
BENCHMARK(BM_RenderExposition)->Arg(8)->Arg(64)->Arg(256)->Arg(512)->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
