// Throughput of the trace reader (and writer) on synthetic traces of realistic event lines.
//
// The input is generated once per run into a temporary directory: about
// FRAGSCOPE_BENCH_TRACE_MB (default 200) MiB of JSONL, plain and compressed with gzip and zstd.
// Bytes/s counts *uncompressed* JSONL bytes, so the three variants compare directly; the
// compressed size is reported as a counter.
//
//   cmake --preset bench && cmake --build --preset bench --target trace_reader_bench
//   build/bench/bench/trace_reader_bench
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>
#include <string>

#include <benchmark/benchmark.h>

#include "fragscope/trace.h"
#include "sources/trace/output_stream.h"

namespace fragscope {
namespace {

std::uint64_t TargetBytes() {
  const char* mb = std::getenv("FRAGSCOPE_BENCH_TRACE_MB");
  std::uint64_t value = mb != nullptr ? std::strtoull(mb, nullptr, 10) : 0;
  return (value > 0 ? value : 200) << 20;
}

// A step of a training loop as PyTorch records it: allocations with real-looking addresses,
// requested sizes and wall-clock microseconds, each later freed (free_requested then
// free_completed), and an occasional new segment. Every line carries stream, device and
// time_us, as the lines PyTorch's snapshots produce do.
std::string MakeLines(std::uint64_t target_bytes, bool pytorch_extras, std::uint64_t* events) {
  std::mt19937_64 rng(42);
  std::string text = R"({"format":"fragscope-trace","version":1,"kind":"allocator"})"
                     "\n";
  text.reserve(target_bytes + 4096);
  std::int64_t time_us = 1708187029490966;
  std::uint64_t next_addr = 140234567890123;
  const char* extras =
      pytorch_extras
          ? R"(,"frames":[{"name":"forward","filename":"/opt/conda/lib/python3.10/site-packages/)"
            R"(torch/nn/modules/linear.py","line":116},{"name":"_call_impl","filename":"module.py",)"
            R"("line":1527}],"compile_context":"N/A","user_metadata":"")"
          : "";
  auto line = [&](const char* action, std::uint64_t addr, std::uint64_t size) {
    text += R"({"action":")";
    text += action;
    text += R"(","addr":)" + std::to_string(addr) + R"(,"size":)" + std::to_string(size) +
            R"(,"stream":0,"device":0,"time_us":)" + std::to_string(time_us) + extras + "}\n";
    time_us += static_cast<std::int64_t>(rng() % 50);
    ++*events;
  };
  while (text.size() < target_bytes) {
    if (rng() % 64 == 0) line("segment_alloc", next_addr + (1u << 30), 20971520);
    std::uint64_t live[8];
    for (std::uint64_t& addr : live) {
      // Requested sizes: mostly small tensors, some large activations.
      std::uint64_t size = rng() % 4 == 0 ? (rng() % 64 + 1) << 20 : (rng() % 4096 + 1) * 4;
      addr = next_addr;
      next_addr += (size + 511) / 512 * 512;
      line("alloc", addr, size);
    }
    for (std::uint64_t addr : live) {
      line("free_requested", addr, 4096);
      line("free_completed", addr, 4096);
    }
  }
  return text;
}

struct Trace {
  std::string path;
  std::uint64_t text_bytes = 0;
  std::uint64_t file_bytes = 0;
  std::uint64_t events = 0;
};

// The generated files, removed when the program exits.
class Inputs {
 public:
  Inputs()
      : dir_(std::filesystem::temp_directory_path() /
             ("fragscope_bench_" + std::to_string(::getpid()))) {
    std::filesystem::create_directories(dir_);
    std::uint64_t events = 0;
    std::string text = MakeLines(TargetBytes(), false, &events);
    for (Compression c : {Compression::kNone, Compression::kGzip, Compression::kZstd}) {
      traces_[static_cast<int>(c)] = Write(text, c, events, "trace");
    }
    events = 0;
    std::string extras = MakeLines(TargetBytes() / 4, true, &events);
    pytorch_ = Write(extras, Compression::kNone, events, "pytorch");
  }
  ~Inputs() { std::filesystem::remove_all(dir_); }
  const Trace& trace(Compression c) const { return traces_[static_cast<int>(c)]; }
  const Trace& pytorch_style() const { return pytorch_; }

 private:
  Trace Write(const std::string& text, Compression c, std::uint64_t events, const char* stem) {
    Trace trace;
    const char* suffix = c == Compression::kGzip   ? ".jsonl.gz"
                         : c == Compression::kZstd ? ".jsonl.zst"
                                                   : ".jsonl";
    trace.path = (dir_ / (std::string(stem) + suffix)).string();
    auto sink = sources::CreateFileSink(trace.path, OutputOrigin::kChosenByTool);
    if (!sink.ok()) std::abort();
    auto out = sources::OutputStream::Create(c, std::move(*sink));
    if (!out.ok() || !(*out)->Write(text).ok() || !(*out)->Finish().ok()) std::abort();
    trace.text_bytes = text.size();
    trace.file_bytes = std::filesystem::file_size(trace.path);
    trace.events = events;
    return trace;
  }

  std::filesystem::path dir_;
  Trace traces_[3];
  Trace pytorch_;
};

const Inputs& GetInputs() {
  static Inputs inputs;
  return inputs;
}

void ReadTrace(benchmark::State& state, const Trace& trace) {
  std::uint64_t events = 0;
  for (auto _ : state) {
    auto reader = TraceReader::Open(trace.path);
    if (!reader.ok()) {
      state.SkipWithError(reader.status().ToString().c_str());
      return;
    }
    Event event;
    for (;;) {
      Result<bool> got = (*reader)->Next(&event);
      if (!got.ok()) {
        state.SkipWithError(got.status().ToString().c_str());
        return;
      }
      if (!*got) break;
      ++events;
    }
    benchmark::DoNotOptimize(event);
  }
  if (events != trace.events * state.iterations()) state.SkipWithError("wrong event count");
  state.SetBytesProcessed(static_cast<std::int64_t>(trace.text_bytes * state.iterations()));
  state.SetItemsProcessed(static_cast<std::int64_t>(events));
  state.counters["file_MiB"] = static_cast<double>(trace.file_bytes) / (1 << 20);
  state.counters["line_bytes"] = static_cast<double>(trace.text_bytes) / trace.events;
}

void BM_ReadPlain(benchmark::State& state) {
  ReadTrace(state, GetInputs().trace(Compression::kNone));
}
void BM_ReadGzip(benchmark::State& state) {
  ReadTrace(state, GetInputs().trace(Compression::kGzip));
}
void BM_ReadZstd(benchmark::State& state) {
  ReadTrace(state, GetInputs().trace(Compression::kZstd));
}
// Lines as a converted PyTorch snapshot would have them: frames, compile_context and
// user_metadata to skip on every line.
void BM_ReadPlainPyTorchExtras(benchmark::State& state) {
  ReadTrace(state, GetInputs().pytorch_style());
}

void BM_WriteToString(benchmark::State& state) {
  const auto compression = static_cast<Compression>(state.range(0));
  std::vector<Event> events(100000);
  std::mt19937_64 rng(7);
  for (std::size_t i = 0; i < events.size(); ++i) {
    events[i].action = i % 2 == 0 ? Action::kAlloc : Action::kFreeCompleted;
    events[i].addr = 140234567890123 + rng() % (1u << 30);
    events[i].size = rng() % (1u << 24);
    events[i].time_us = 1708187029490966 + static_cast<std::int64_t>(i);
  }
  std::uint64_t bytes = 0;
  for (auto _ : state) {
    std::string out;
    auto writer = TraceWriter::ToString(&out, TraceHeader{}, compression);
    for (const Event& e : events) {
      if (!writer->Write(e).ok()) std::abort();
    }
    if (!writer->Close().ok()) std::abort();
    bytes += out.size();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(events.size() * state.iterations()));
  state.counters["output_bytes_per_event"] =
      static_cast<double>(bytes) / (events.size() * state.iterations());
}

BENCHMARK(BM_ReadPlain)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_ReadGzip)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_ReadZstd)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_ReadPlainPyTorchExtras)->Unit(benchmark::kMillisecond)->MinTime(3);
BENCHMARK(BM_WriteToString)->Arg(0)->Arg(1)->Arg(2)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace fragscope

BENCHMARK_MAIN();
