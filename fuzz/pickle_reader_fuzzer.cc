// Fuzz target for the snapshot readers: ReadPickleBytes on every input, ReadJsonDocumentBytes on
// inputs that look like JSON. Oracles: errors carry their location ("byte N: ..." / "line L,
// column C: ..."); reading the same bytes through an InputStream that hands them out a few at
// a time gives the same result (so the buffer refills agree with the in-memory path); and a
// document that was accepted can be walked with every accessor.
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt, preset "fuzz") and with replay_main.cc
// (pickle_reader_fuzz_replay, a ctest that runs fuzz/corpus/pickle_reader/).
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "sources/document/json_document.h"
#include "sources/pickle/pickle_reader.h"
#include "sources/trace/input_stream.h"

namespace {

using fragscope::Result;
using fragscope::Status;
using fragscope::sources::Document;
using fragscope::sources::PickleLimits;
using fragscope::sources::Value;

// An input above 64 KiB probably isn't interesting: every opcode is a few bytes, and smaller
// inputs reach the same states faster.
constexpr std::size_t kMaxInputBytes = std::size_t{64} << 10;
// Walking an accepted document visits at most this many values (containers may hold
// themselves, and a small pickle can reference one list a million times).
constexpr std::size_t kMaxWalkSteps = 200000;

PickleLimits FuzzLimits() {
  PickleLimits limits;
  // Small caps so that every limit is reachable from a small input and no input can make the
  // reader hold much: a 64 KiB input of DUPs fills max_stack, of MEMOIZEs max_memo.
  limits.max_depth = 200;
  limits.max_objects = 20000;
  limits.max_memo = 20000;
  limits.max_stack = 20000;
  // Above kMaxInputBytes, so the cap is reached only through gzip/zstd input.
  limits.max_input_bytes = std::uint64_t{1} << 20;
  limits.max_string_bytes = std::uint64_t{256} << 10;
  return limits;
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "oracle failed: %s\n", what.c_str());
  std::abort();
}

// Hands out the bytes `chunk` at a time.
class ChunkSource final : public fragscope::sources::ByteSource {
 public:
  ChunkSource(std::string bytes, std::size_t chunk) : bytes_(std::move(bytes)), chunk_(chunk) {}
  Result<std::size_t> Read(char* buf, std::size_t n) override {
    std::size_t take = std::min({n, chunk_, bytes_.size() - pos_});
    std::memcpy(buf, bytes_.data() + pos_, take);
    pos_ += take;
    return take;
  }
  std::uint64_t size_bytes() const override { return bytes_.size(); }

 private:
  std::string bytes_;
  std::size_t chunk_;
  std::size_t pos_ = 0;
};

void Walk(const Document& doc) {
  std::vector<Value> todo = {doc.root()};
  std::unordered_set<fragscope::sources::ObjectId> seen;
  std::size_t steps = 0;
  while (!todo.empty() && ++steps < kMaxWalkSteps) {
    Value v = todo.back();
    todo.pop_back();
    (void)doc.AsInt(v);
    (void)doc.AsUint(v);
    (void)doc.AsDouble(v);
    (void)doc.AsBool(v);
    (void)doc.AsString(v);
    (void)doc.AsBytes(v);
    (void)doc.BigIntBytes(v);
    (void)fragscope::sources::ValueKindName(v.kind());
    auto id = doc.Id(v);
    if (id && !seen.insert(*id).second) continue;
    for (Value item : doc.Items(v)) todo.push_back(item);
    for (const auto& [key, value] : doc.Entries(v)) {
      todo.push_back(key);
      todo.push_back(value);
    }
    (void)doc.Find(v, "segments");
  }
}

std::string Describe(const Result<Document>& doc) {
  if (!doc.ok()) return doc.status().ToString();
  return "OK, " + std::to_string(doc->object_count()) + " objects, root " +
         std::string(fragscope::sources::ValueKindName(doc->root().kind()));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return 0;
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  const PickleLimits limits = FuzzLimits();

  Result<Document> doc = fragscope::sources::ReadPickleBytes(bytes, limits);
  if (!doc.ok() && doc.status().message().rfind("byte ", 0) != 0) {
    Fail("pickle error without a byte offset: " + doc.status().message());
  }
  if (doc.ok()) Walk(*doc);

  // The same bytes, streamed a few at a time. Plain input only: where a corrupt gzip or zstd
  // stream fails depends on how its raw bytes arrive, so the pickle may get further one way.
  auto input =
      fragscope::sources::InputStream::Open(std::make_unique<ChunkSource>(bytes, 1 + size % 7));
  if (input.ok() && (*input)->compression() == fragscope::Compression::kNone) {
    Result<Document> streamed = fragscope::sources::ReadPickle(**input, limits);
    if (Describe(streamed) != Describe(doc)) {
      Fail("streamed read differs: " + Describe(streamed) + " vs " + Describe(doc));
    }
  }

  if (fragscope::sources::DetectDocumentFormat(bytes) ==
      fragscope::sources::DocumentFormat::kJson) {
    Result<Document> json = fragscope::sources::ReadJsonDocumentBytes(bytes, limits);
    if (!json.ok() && json.status().message().rfind("line ", 0) != 0) {
      Fail("JSON error without a line: " + json.status().message());
    }
    if (json.ok()) Walk(*json);
  }
  return 0;
}
