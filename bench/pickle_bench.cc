// Throughput of the safe pickle reader (MB/s of pickle bytes) on real snapshots and on a big
// generated one, and a one-shot load for peak-memory comparisons.
//
// Real files are read in place from FRAGSCOPE_SHARED_SNAPSHOTS (shared/snapshots beside the
// repository; skipped when absent). The big file is $FRAGSCOPE_BENCH_BIG_PICKLE, written by
//   /usr/bin/python3 tools/make_snapshot_fixtures.py --big /tmp/big.pickle --entries 2000000
// (skipped when unset). Files are read into memory first, so the figures are parsing only
// (ReadPickleBytes), except BM_ReadDocumentFile, which includes reading the file.
// BM_OpcodeWalkFloor/big is not a reader: it measures the least any single-threaded reader of
// that file must do (see the comment on it).
//
//   cmake --preset bench && cmake --build --preset bench --target pickle_bench
//   FRAGSCOPE_BENCH_BIG_PICKLE=/tmp/big.pickle build/bench/bench/pickle_bench
//   build/bench/bench/pickle_bench --load=FILE   # load once; print seconds and heap_bytes
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include <benchmark/benchmark.h>

#include "sources/document/json_document.h"
#include "sources/pickle/pickle_reader.h"

namespace fragscope::sources {
namespace {

std::string ReadWhole(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void BM_ReadPickleBytes(benchmark::State& state, const std::string& path) {
  const std::string bytes = ReadWhole(path);
  if (bytes.empty()) {
    state.SkipWithError(("cannot read " + path).c_str());
    return;
  }
  std::uint64_t heap = 0;
  std::uint64_t objects = 0;
  for (auto _ : state) {
    Result<Document> doc = ReadPickleBytes(bytes);
    if (!doc.ok()) {
      state.SkipWithError(doc.status().ToString().c_str());
      return;
    }
    heap = doc->heap_bytes();
    objects = doc->object_count();
    benchmark::DoNotOptimize(doc->root());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes.size()));
  state.counters["heap_per_file_byte"] =
      static_cast<double>(heap) / static_cast<double>(bytes.size());
  state.counters["objects"] = static_cast<double>(objects);
}

void BM_ReadDocumentFile(benchmark::State& state, const std::string& path) {
  const std::uint64_t size = std::filesystem::file_size(path);
  for (auto _ : state) {
    Result<Document> doc = ReadDocumentFile(path);
    if (!doc.ok()) {
      state.SkipWithError(doc.status().ToString().c_str());
      return;
    }
    benchmark::DoNotOptimize(doc->root());
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * size));
}

// The floor under any single-threaded reader of a snapshot pickle (docs/benchmarks.md, "Loading
// and analyzing a large snapshot"): step over every opcode, resolve each memo reference to a
// handle and hash each run of them (the least that telling stacks apart needs), and build
// nothing: no objects, no checks beyond staying inside the buffer, no decoding into records.
// Knows only the opcodes Python's pickler writes for snapshots; anything else stops the walk
// with an error.
bool WalkOpcodes(std::string_view bytes, std::uint64_t* refs, std::uint64_t* hash) {
  const auto* p = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const std::uint8_t* const end = p + bytes.size();
  std::vector<std::uint32_t> memo;
  memo.reserve(bytes.size() / 64);
  auto u32 = [](const std::uint8_t* at) {
    std::uint32_t v;
    std::memcpy(&v, at, 4);
    return v;
  };
  std::uint64_t h = 0;
  std::uint64_t n = 0;
  while (p < end) {
    const std::uint8_t op = *p++;
    switch (op) {
      case 'h':  // BINGET and LONG_BINGET come in runs (a stack's frames)
      case 'j': {
        std::uint64_t run = 0;
        --p;
        while (p + 5 <= end && (*p == 'h' || *p == 'j')) {
          const std::uint32_t index = *p == 'h' ? p[1] : u32(p + 1);
          p += *p == 'h' ? 2 : 5;
          run = (run ^ (index < memo.size() ? memo[index] : 0)) * 0x9E3779B97F4A7C15ull;
          ++n;
        }
        h ^= run;
        break;
      }
      case 0x94:  // MEMOIZE
        memo.push_back(static_cast<std::uint32_t>(memo.size()));
        break;
      case 0x80:  // PROTO
      case 'K':   // BININT1
      case 'q':   // BINPUT
        p += 1;
        break;
      case 'M':  // BININT2
        p += 2;
        break;
      case 'J':  // BININT
      case 'r':  // LONG_BINPUT
        p += 4;
        break;
      case 0x95:  // FRAME
      case 'G':   // BINFLOAT
        p += 8;
        break;
      case 0x8a:  // LONG1
      case 0x8c:  // SHORT_BINUNICODE
        if (p >= end) return false;
        p += 1 + *p;
        break;
      case 'X':  // BINUNICODE
        if (end - p < 4) return false;
        p += 4 + u32(p);
        break;
      case '(':
      case '}':
      case ']':
      case ')':
      case 'u':
      case 'e':
      case 's':
      case 'a':
      case 't':
      case 0x85:
      case 0x86:
      case 0x87:
      case 'N':
      case 0x88:
      case 0x89:
      case '.':
        break;
      default:
        return false;
    }
  }
  *refs = n;
  *hash = h;
  return true;
}

void BM_OpcodeWalkFloor(benchmark::State& state, const std::string& path) {
  const std::string bytes = ReadWhole(path);
  std::uint64_t refs = 0;
  for (auto _ : state) {
    std::uint64_t hash = 0;
    if (!WalkOpcodes(bytes, &refs, &hash)) {
      state.SkipWithError("an opcode the floor walk does not know");
      return;
    }
    benchmark::DoNotOptimize(hash);
  }
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations() * bytes.size()));
  state.counters["memo_refs"] = static_cast<double>(refs);
}

void RegisterAll() {
  const std::string shared = FRAGSCOPE_SHARED_SNAPSHOTS;
  // The largest real files of each generation, and one small one.
  for (const char* name :
       {"real/nothanmin_memory_snapshot.pickle", "real/wedsonlin_medium_128_training.pickle",
        "real/kkaitlyn_memory_ctx128_fullstep.pickle", "real/constructorsun_memory_snapshot.pickle",
        "real/cranberrii_memory_snapshot.pickle", "real/maphsge4_snapshot_04d383c.pickle",
        "real/yiyi_1.3b_snapshot_a21816f.pickle"}) {
    const std::string path = shared + "/" + name;
    if (!std::filesystem::exists(path)) continue;
    const std::string label = std::filesystem::path(name).stem().string();
    benchmark::RegisterBenchmark(("BM_ReadPickleBytes/" + label).c_str(), BM_ReadPickleBytes, path)
        ->Unit(benchmark::kMillisecond);
  }
  if (const char* big = std::getenv("FRAGSCOPE_BENCH_BIG_PICKLE"); big != nullptr && *big) {
    benchmark::RegisterBenchmark("BM_ReadPickleBytes/big", BM_ReadPickleBytes, std::string(big))
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
    benchmark::RegisterBenchmark("BM_ReadDocumentFile/big", BM_ReadDocumentFile, std::string(big))
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
    benchmark::RegisterBenchmark("BM_OpcodeWalkFloor/big", BM_OpcodeWalkFloor, std::string(big))
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
}

// --load=FILE: one ReadDocumentFile, as a program that only loads a snapshot would do it
// (tools/bench_pickle_vs_python.sh runs this under /usr/bin/time -v for its peak RSS).
int LoadOnce(const std::string& path) {
  auto start = std::chrono::steady_clock::now();
  Result<Document> doc = ReadDocumentFile(path);
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!doc.ok()) {
    std::fprintf(stderr, "%s\n", doc.status().ToString().c_str());
    return 1;
  }
  std::printf("fragscope ReadDocumentFile: %.3f s, %llu objects, heap_bytes %llu\n", seconds,
              static_cast<unsigned long long>(doc->object_count()),
              static_cast<unsigned long long>(doc->heap_bytes()));
  return 0;
}

}  // namespace
}  // namespace fragscope::sources

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg.rfind("--load=", 0) == 0) {
      return fragscope::sources::LoadOnce(std::string(arg.substr(7)));
    }
  }
  fragscope::sources::RegisterAll();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
