// The worst input shapes for the readers' running time (issue 24 item 2): every reader must be
// linear in its input with a bounded constant, so time per item stays flat as N grows and
// Google Benchmark's complexity fit says O(N). Each shape is built in memory:
//
//   HeaderLabels/N       a trace header whose "labels" object has N keys (was quadratic)
//   HeaderSettingsConf/N a header whose "allocator_settings" string has N "k:v" items (was too)
//   EventManyKeys/N      an event line with N unknown keys, which the scanner must skip
//   LongLine/N           an event line whose unknown string value is N MiB (limit: 16 MiB)
//   JsonObjectKeys/N     a JSON document: one object of N keys (snapshot JSON input)
//   PickleDictKeys/N     a pickle: one dict of N str keys filled by SETITEMS
//   PickleManyLists/N    a pickle: N distinct small lists (the Document's run-sharing index)
//
//   cmake --preset bench && cmake --build --preset bench --target parse_shapes_bench
//   build/bench/bench/parse_shapes_bench
#include <cstdint>
#include <string>

#include <benchmark/benchmark.h>

#include "fragscope/status.h"
#include "fragscope/trace.h"
#include "sources/document/json_document.h"
#include "sources/pickle/pickle_reader.h"

namespace fragscope {
namespace {

constexpr const char* kHeaderStart = R"({"format":"fragscope-trace","version":1)";

// Runs `read(bytes)` (a Status: ok, or the reader's error, which skips the benchmark) once per
// iteration and reports `items` for the complexity fit.
template <typename Read>
void Measure(benchmark::State& state, const std::string& bytes, std::int64_t items, Read read) {
  for (auto _ : state) {
    if (const Status st = read(bytes); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
  }
  state.SetComplexityN(items);
  state.SetItemsProcessed(state.iterations() * items);
  state.SetBytesProcessed(state.iterations() * static_cast<std::int64_t>(bytes.size()));
}

// The whole trace read, header and every event.
Status ReadTrace(const std::string& text) {
  auto reader = TraceReader::FromBytes(text, "bench");
  if (!reader.ok()) return reader.status();
  Event event;
  while (true) {
    Result<bool> got = (*reader)->Next(&event);
    if (!got.ok()) return got.status();
    if (!*got) break;
  }
  benchmark::DoNotOptimize(reader);
  return Status::Ok();
}

void OpenTrace(benchmark::State& state, const std::string& text, std::int64_t items) {
  Measure(state, text, items, ReadTrace);
}

void HeaderLabels(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::string text = std::string(kHeaderStart) + R"(,"labels":{)";
  for (std::int64_t i = 0; i < n; ++i) {
    text += (i > 0 ? ",\"label" : "\"label") + std::to_string(i) + "\":\"value\"";
  }
  text += "}}\n";
  OpenTrace(state, text, n);
}
BENCHMARK(HeaderLabels)->RangeMultiplier(10)->Range(1000, 100'000)->Complexity(benchmark::oN);

void HeaderSettingsConf(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::string text = std::string(kHeaderStart) + R"(,"allocator_settings":")";
  for (std::int64_t i = 0; i < n; ++i) {
    text += (i > 0 ? ",key" : "key") + std::to_string(i) + ":1";
  }
  text += "\"}\n";
  OpenTrace(state, text, n);
}
BENCHMARK(HeaderSettingsConf)->RangeMultiplier(10)->Range(1000, 100'000)->Complexity(benchmark::oN);

void EventManyKeys(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::string text = std::string(kHeaderStart) + "}\n" + R"({"action":"alloc","addr":1,"size":1)";
  for (std::int64_t i = 0; i < n; ++i) text += ",\"x" + std::to_string(i) + "\":[1,{\"y\":2}]";
  text += "}\n";
  OpenTrace(state, text, n);
}
BENCHMARK(EventManyKeys)->RangeMultiplier(10)->Range(1000, 100'000)->Complexity(benchmark::oN);

void LongLine(benchmark::State& state) {
  const std::int64_t mib = state.range(0);
  // Just below TraceLimits' default max_line_bytes (16 MiB) at the top of the range.
  const std::size_t payload = static_cast<std::size_t>(mib << 20) - 100;
  std::string text = std::string(kHeaderStart) + "}\n" + R"({"action":"alloc","addr":1,"size":1)";
  text += ",\"note\":\"" + std::string(payload, 'a') + "\"}\n";
  OpenTrace(state, text, mib);
}
BENCHMARK(LongLine)->Arg(1)->Arg(4)->Arg(15)->Complexity(benchmark::oN);

void JsonObjectKeys(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::string text = "{";
  for (std::int64_t i = 0; i < n; ++i) {
    text += (i > 0 ? ",\"key" : "\"key") + std::to_string(i) + "\":" + std::to_string(i);
  }
  text += "}";
  Measure(state, text, n, [](const std::string& bytes) {
    auto doc = sources::ReadJsonDocumentBytes(bytes);
    benchmark::DoNotOptimize(doc);
    return doc.ok() ? Status::Ok() : doc.status();
  });
}
BENCHMARK(JsonObjectKeys)->RangeMultiplier(10)->Range(1000, 1'000'000)->Complexity(benchmark::oN);

// Pickle building blocks (protocol 4 opcodes).
void PutStr(std::string* out, const std::string& s) {
  out->push_back('\x8c');  // SHORT_BINUNICODE
  out->push_back(static_cast<char>(s.size()));
  *out += s;
}
void PutInt(std::string* out, std::uint32_t v) {
  out->push_back('J');  // BININT
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void ReadPickle(benchmark::State& state, const std::string& bytes, std::int64_t n) {
  Measure(state, bytes, n, [](const std::string& data) {
    auto doc = sources::ReadPickleBytes(data);
    benchmark::DoNotOptimize(doc);
    return doc.ok() ? Status::Ok() : doc.status();
  });
}

void PickleDictKeys(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::string bytes = "\x80\x04}(";  // PROTO 4, EMPTY_DICT, MARK
  for (std::int64_t i = 0; i < n; ++i) {
    PutStr(&bytes, "key" + std::to_string(i));
    PutInt(&bytes, static_cast<std::uint32_t>(i));
  }
  bytes += "u.";  // SETITEMS, STOP
  ReadPickle(state, bytes, n);
}
BENCHMARK(PickleDictKeys)->RangeMultiplier(10)->Range(1000, 1'000'000)->Complexity(benchmark::oN);

void PickleManyLists(benchmark::State& state) {
  const std::int64_t n = state.range(0);
  std::string bytes = "\x80\x04](";  // PROTO 4, EMPTY_LIST, MARK
  for (std::int64_t i = 0; i < n; ++i) {
    bytes += "](";  // EMPTY_LIST, MARK: a list of 3 ints, distinct per i
    PutInt(&bytes, static_cast<std::uint32_t>(i));
    PutInt(&bytes, 7);
    PutInt(&bytes, 1u << 30);
    bytes += "e";  // APPENDS
  }
  bytes += "e.";  // APPENDS, STOP
  ReadPickle(state, bytes, n);
}
BENCHMARK(PickleManyLists)->RangeMultiplier(10)->Range(1000, 1'000'000)->Complexity(benchmark::oN);

}  // namespace
}  // namespace fragscope

BENCHMARK_MAIN();
