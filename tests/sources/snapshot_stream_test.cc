// Tests of the streaming snapshot path (issue 34): the pickle reader hands device trace lists to
// a PickleListSink while it reads, and ReadSnapshotFile decodes them without the Document
// holding them. The reference is the Document path (ReadDocumentFile + DecodeSnapshot), which
// must give the same Snapshot: on hand-assembled pickles whose trace lists come in several
// batches, and on every real snapshot in shared/snapshots.
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "sources/document/json_document.h"
#include "sources/pickle/pickle_reader.h"
#include "sources/snapshot/snapshot.h"
#include "testing/test_util.h"

namespace fragscope::sources {
namespace {

// Pickle bytes, protocol 4 opcodes (CPython's Lib/pickle.py).
struct P {
  std::string b;
  P& op(char c) {
    b.push_back(c);
    return *this;
  }
  P& s(std::string_view text) {  // SHORT_BINUNICODE
    b.push_back(static_cast<char>(0x8c));
    b.push_back(static_cast<char>(text.size()));
    b.append(text);
    return *this;
  }
  P& i(std::uint32_t v) {  // BININT
    b.push_back('J');
    for (int k = 0; k < 4; ++k) b.push_back(static_cast<char>((v >> (8 * k)) & 0xff));
    return *this;
  }
  P& memoize() { return op(static_cast<char>(0x94)); }
  P& get(std::uint8_t index) { return op('h').op(static_cast<char>(index)); }
};

// One trace entry dict: {"action": action, "addr": addr, "size": size, "frames": <memo 0>}
// (memo 0 is a frames list made first), as SETITEMS; `bad_addr` writes the address as a str.
void Entry(P& p, std::string_view action, std::uint32_t addr, bool bad_addr = false) {
  p.op('}').memoize().op('(');
  p.s("action").s(action);
  p.s("addr");
  if (bad_addr) {
    p.s("0x10");
  } else {
    p.i(addr);
  }
  p.s("size").i(512);
  p.s("frames").get(0);
  if (action == "annotate") p.s("user_metadata").s("step 1");
  p.op('u');
}

// {"segments": [], "device_traces": [dev0, dev1]}; each device list gets `batches` APPENDS of
// `per_batch` entries (alloc/free pairs, an annotate and an unknown action in later batches).
// `bad` (device, index) writes that entry's addr as a str.
std::string TwoDeviceSnapshot(int batches, int per_batch, int bad_device = -1, int bad_index = -1) {
  P p;
  p.op(static_cast<char>(0x80)).op(4);
  // memo 0: a frames list with one frame.
  p.op(']').memoize().op('(').op('}').memoize().op('(');
  p.s("name").s("fn").s("filename").s("/src/a.py").s("line").i(7).op('u').op('e');
  p.op('0');  // POP: the list stays in the memo only
  p.op('}').op('(').s("segments").op(']').s("device_traces").op(']').op('(');
  for (int d = 0; d < 2; ++d) {
    p.op(']');
    int index = 0;
    for (int batch = 0; batch < batches; ++batch) {
      p.op('(');
      for (int k = 0; k < per_batch; ++k, ++index) {
        const std::uint32_t addr = 0x1000u * static_cast<std::uint32_t>(d + 1) +
                                   0x200u * static_cast<std::uint32_t>(index / 2);
        const bool bad = d == bad_device && index == bad_index;
        if (batch == 1 && k == 0) {
          Entry(p, "annotate", 0);
        } else if (batch == 2 && k == 1) {
          Entry(p, "mystery", addr);
        } else {
          Entry(p, index % 2 == 0 ? "alloc" : "free", addr, bad);
        }
      }
      p.op('e');
    }
  }
  p.op('e').op('u').op('.');
  return p.b;
}

std::string WriteTemp(const std::string& bytes) {
  const std::string path = testing::MakeTempDir() + "/snapshot.pickle";
  std::ofstream(path, std::ios::binary) << bytes;
  return path;
}

// The Document path, the reference.
Result<Snapshot> ReadViaDocument(const std::string& path) {
  Result<Document> doc = ReadDocumentFile(path);
  if (!doc.ok()) return doc.status();
  Result<Snapshot> s = DecodeSnapshot(*doc);
  if (!s.ok()) return s.status().WithPrefix(path);
  return s;
}

void ExpectSameSnapshot(const Snapshot& a, const Snapshot& b) {
  EXPECT_EQ(a.generation, b.generation);
  EXPECT_EQ(a.warnings, b.warnings);
  EXPECT_EQ(a.trace_entries, b.trace_entries);
  EXPECT_EQ(a.ignored_entries, b.ignored_entries);
  ASSERT_EQ(a.segments.size(), b.segments.size());
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  for (std::size_t i = 0; i < a.blocks.size(); ++i) {
    EXPECT_EQ(a.blocks[i].addr, b.blocks[i].addr);
    EXPECT_EQ(a.blocks[i].stack, b.blocks[i].stack);
  }
  ASSERT_EQ(a.device_traces.size(), b.device_traces.size());
  for (std::size_t d = 0; d < a.device_traces.size(); ++d) {
    ASSERT_EQ(a.device_traces[d].size(), b.device_traces[d].size()) << "device " << d;
    // Read forwards (a TraceHistory decodes a chunk at a time).
    auto yi = b.device_traces[d].begin();
    for (const SnapshotTraceEntry& x : a.device_traces[d]) {
      const SnapshotTraceEntry y = *yi;  // a copy: ++ may decode the next chunk over it
      ++yi;
      EXPECT_EQ(x.action, y.action);
      EXPECT_EQ(x.addr, y.addr);
      EXPECT_EQ(x.size, y.size);
      EXPECT_EQ(x.stream, y.stream);
      EXPECT_EQ(x.time_us, y.time_us);
      EXPECT_EQ(x.device_free, y.device_free);
      EXPECT_EQ(x.stack, y.stack);
      EXPECT_EQ(x.entry, y.entry);
      if (::testing::Test::HasFailure()) return;
    }
  }
  ASSERT_EQ(a.trace_annotations.size(), b.trace_annotations.size());
  for (std::size_t i = 0; i < a.trace_annotations.size(); ++i) {
    EXPECT_EQ(a.trace_annotations[i].device, b.trace_annotations[i].device);
    EXPECT_EQ(a.trace_annotations[i].before, b.trace_annotations[i].before);
    EXPECT_EQ(a.trace_annotations[i].entry, b.trace_annotations[i].entry);
    EXPECT_EQ(a.trace_annotations[i].text, b.trace_annotations[i].text);
  }
  EXPECT_EQ(a.stacks, b.stacks);
  ASSERT_EQ(a.frames.size(), b.frames.size());
  for (std::size_t i = 0; i < a.frames.size(); ++i) {
    EXPECT_EQ(a.frames[i].name, b.frames[i].name);
    EXPECT_EQ(a.frames[i].filename, b.frames[i].filename);
    EXPECT_EQ(a.frames[i].line, b.frames[i].line);
  }
  EXPECT_EQ(a.allocator_settings, b.allocator_settings);
}

// A sink that takes every list whose first items are all dicts with an "action", and counts
// what it gets.
class RecordingSink final : public PickleListSink {
 public:
  Status TakeItems(const Document& doc, Value, bool taken, std::span<const Value> items,
                   std::uint64_t, bool* take) override {
    *take = taken;
    if (!taken) {
      *take = !items.empty();
      for (const Value v : items) *take = *take && doc.Find(v, "action").has_value();
    }
    if (*take) items_ += items.size();
    return Status::Ok();
  }
  void DictItems(const Document&, Value, std::span<const Value> pairs) override {
    pairs_ += pairs.size() / 2;
  }
  std::uint64_t used_bytes() const override { return 0; }
  std::uint64_t items_ = 0;
  std::uint64_t pairs_ = 0;
};

TEST(SnapshotStreamTest, ATakenListAndTheDictsBuiltInItsFramesStayOutOfTheDocument) {
  const std::string bytes = TwoDeviceSnapshot(/*batches=*/3, /*per_batch=*/4);
  Result<std::unique_ptr<InputStream>> input = InputStream::Open(MemorySource(bytes));
  ASSERT_TRUE(input.ok());
  RecordingSink sink;
  Result<Document> doc = ReadPickle(**input, {}, {}, &sink);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ(sink.items_, 2u * 3 * 4);
  // The first batch of each list was built before the list was taken (4 dicts, 4 or 5 keys);
  // the two later batches' dicts gave their pairs to the sink.
  EXPECT_EQ(sink.pairs_, 2u * 2 * 4 * 4 + 2);  // + the annotate's user_metadata, twice
  const Value traces = *doc->Find(doc->root(), "device_traces");
  ASSERT_EQ(doc->Items(traces).size(), 2u);
  for (const Value device : doc->Items(traces)) EXPECT_TRUE(doc->Items(device).empty());
}

TEST(SnapshotStreamTest, StreamedTraceListsDecodeAsTheDocumentPathDoes) {
  const std::string path = WriteTemp(TwoDeviceSnapshot(/*batches=*/4, /*per_batch=*/6));
  Result<Snapshot> streamed = ReadSnapshotFile(path);
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  Result<Snapshot> reference = ReadViaDocument(path);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  ASSERT_EQ(streamed->device_traces.size(), 2u);
  // 24 items per device: an annotate, an unknown action, 11 alloc and 11 merged frees (2 each).
  EXPECT_EQ(streamed->device_traces[1].size(), 11u + 2 * 11);
  ASSERT_EQ(streamed->trace_annotations.size(), 2u);
  EXPECT_EQ(streamed->trace_annotations[1].device, 1);
  ASSERT_EQ(streamed->warnings.size(), 2u);
  EXPECT_EQ(streamed->warnings[1], "device_traces[1][13]: unknown action \"mystery\"; ignored");
  ExpectSameSnapshot(*streamed, *reference);
}

TEST(SnapshotStreamTest, AnErrorInATakenListNamesItsDeviceAndEntry) {
  // Entry 9 of device 1 is in its second batch: decoded while the pickle is read, before the
  // list is known to be device_traces[1].
  const std::string path = WriteTemp(TwoDeviceSnapshot(3, 6, /*bad_device=*/1, /*bad_index=*/8));
  Result<Snapshot> streamed = ReadSnapshotFile(path);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().message(),
            path + ": device_traces[1][8].addr: expected an int, found str");
  Result<Snapshot> reference = ReadViaDocument(path);
  ASSERT_FALSE(reference.ok());
  EXPECT_EQ(streamed.status().message(), reference.status().message());
}

// {"segments": [], "device_traces": [[entries]]}: kFrames frame dicts (memo 0..kFrames-1),
// then `lists` alloc entries, each with a fresh frames list of `per_list` of those dicts in an
// order of its own (distinct stacks, as a generator's fresh stacks are). List 1 repeats list
// 0's frame objects (one stack in both paths), list 2 comes in two APPENDS and list 3 one
// APPEND a frame (each then a stack of its own, as the Document path makes it).
constexpr int kFrames = 200;
// The frame dicts (memo indexes) of list `l`: a pseudo-random walk of its own.
std::vector<int> FramesOf(int l, int per_list) {
  std::vector<int> frames;
  std::uint32_t x = static_cast<std::uint32_t>(l == 1 ? 0 : l) * 2654435761u + 1;
  for (int j = 0; j < per_list; ++j) {
    x = x * 1664525u + 1013904223u;
    frames.push_back(static_cast<int>((x >> 8) % kFrames));
  }
  return frames;
}
std::size_t DistinctStacks(int lists, int per_list) {
  std::set<std::vector<int>> distinct;
  for (int l = 0; l < lists; ++l) distinct.insert(FramesOf(l, per_list));
  return distinct.size() + 2;  // lists 2 and 3 (grown by later appends) each get their own
}
std::string DistinctStacksSnapshot(int lists, int per_list) {
  P p;
  p.op(static_cast<char>(0x80)).op(4);
  for (int f = 0; f < kFrames; ++f) {
    p.op('}').memoize().op('(');
    p.s("name").s("fn" + std::to_string(f)).s("filename").s("/src/a.py");
    p.s("line").i(static_cast<std::uint32_t>(f));
    p.op('u').op('0');  // POP: the dict stays in the memo only
  }
  p.op('}').op('(').s("segments").op(']').s("device_traces").op(']').op(']').op('(');
  for (int l = 0; l < lists; ++l) {
    p.op('}').op('(');
    p.s("action").s("alloc").s("addr").i(0x1000u * static_cast<std::uint32_t>(l + 1));
    p.s("size").i(512).s("frames").op(']');
    const std::vector<int> frames = FramesOf(l, per_list);
    const auto frame = [&](int j) { p.get(static_cast<std::uint8_t>(frames[j])); };
    if (l == 3) {
      for (int j = 0; j < per_list; ++j) {
        frame(j);
        p.op('a');
      }
    } else {
      p.op('(');
      for (int j = 0; j < per_list; ++j) {
        if (l == 2 && j == per_list / 2) p.op('e').op('(');
        frame(j);
      }
      p.op('e');
    }
    p.op('u');
    if (l % 100 == 99 || l + 1 == lists) p.op('e');
    if (l % 100 == 99 && l + 1 != lists) p.op('(');
  }
  p.op('a').op('u').op('.');
  return p.b;
}

TEST(SnapshotStreamTest, StacksTakenWhileReadDecodeAsTheDocumentPathDoes) {
  const std::string path = WriteTemp(DistinctStacksSnapshot(/*lists=*/300, /*per_list=*/20));
  Result<Snapshot> streamed = ReadSnapshotFile(path);
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  Result<Snapshot> reference = ReadViaDocument(path);
  ASSERT_TRUE(reference.ok()) << reference.status().ToString();
  ASSERT_EQ(streamed->device_traces.size(), 1u);
  ASSERT_EQ(streamed->device_traces[0].size(), 300u);
  EXPECT_EQ(streamed->device_traces[0][1].stack, streamed->device_traces[0][0].stack);
  EXPECT_EQ(streamed->stacks.size(), DistinctStacks(300, 20) - 2);  // 2, 3: one stack each
  for (const std::size_t l : {2, 3}) {
    const auto stack = static_cast<std::size_t>(streamed->device_traces[0][l].stack);
    EXPECT_EQ(streamed->stacks[stack].size(), 20u) << l;
  }
  ExpectSameSnapshot(*streamed, *reference);
}

// Issue 34: a frames list's items never sit in the Document (8 bytes a frame there; 4 in the
// stack it becomes). The budget is the frames' bytes at 7 a frame: enough for the stacks, not
// for the items too.
TEST(SnapshotStreamTest, Issue34FramesListsStayOutOfTheDocument) {
  constexpr int kLists = 3000, kPerList = 128;
  const std::string bytes = DistinctStacksSnapshot(kLists, kPerList);
  PickleLimits limits;
  limits.max_memory_bytes = std::uint64_t{7} * kLists * kPerList;
  Result<Snapshot> streamed = ReadSnapshotBytes(bytes, limits);
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  EXPECT_EQ(streamed->stacks.size(), DistinctStacks(kLists, kPerList) - 2);
  // The same file with its frames in the Document does not fit.
  Result<Document> doc = ReadPickleBytes(bytes, limits);
  EXPECT_FALSE(doc.ok());
}

// A list of frame dicts is taken as a stack while the pickle is read: where segments or a
// device's entries belong, it is an error naming the field, not an empty list.
TEST(SnapshotStreamTest, AStackWhereSegmentsOrEntriesBelongIsAnError) {
  const auto frame = [](P& p) {
    p.op('}').op('(').s("name").s("f").s("filename").s("/src/a.py").s("line").i(1).op('u');
  };
  for (const bool as_segments : {true, false}) {
    P p;
    p.op(static_cast<char>(0x80)).op(4);
    p.op('}').op('(').s("segments").op(']');
    if (as_segments) {
      p.op('(');
      frame(p);
      frame(p);
      p.op('e');
    }
    p.s("device_traces").op(']');
    if (!as_segments) {
      p.op(']').op('(');
      frame(p);
      frame(p);
      p.op('e').op('a');
    }
    p.op('u').op('.');
    Result<Snapshot> streamed = ReadSnapshotBytes(p.b);
    ASSERT_FALSE(streamed.ok());
    EXPECT_EQ(streamed.status().message(),
              as_segments ? "segments: expected a list of segments, found a list of stack frames "
                            "(dicts with a \"filename\")"
                          : "device_traces[0]: expected a list of trace entries, found a list of "
                            "stack frames (dicts with a \"filename\")");
  }
}

TEST(SnapshotStreamTest, EveryRealSnapshotDecodesAsTheDocumentPathDoes) {
  const std::string root = FRAGSCOPE_SHARED_SNAPSHOTS;
  if (!std::filesystem::is_directory(root + "/real")) {
    GTEST_SKIP() << root << " is absent (shared/ lives beside the repository)";
  }
  int files = 0;
  for (const char* sub : {"/real", "/synthetic"}) {
    for (const auto& entry : std::filesystem::directory_iterator(root + sub)) {
      const std::string path = entry.path().string();
      SCOPED_TRACE(path);
      Result<Snapshot> streamed = ReadSnapshotFile(path);
      Result<Snapshot> reference = ReadViaDocument(path);
      ASSERT_EQ(streamed.ok(), reference.ok());
      if (!streamed.ok()) {
        EXPECT_EQ(streamed.status().message(), reference.status().message());
        continue;
      }
      ExpectSameSnapshot(*streamed, *reference);
      ++files;
    }
  }
  EXPECT_GT(files, 30);
}

}  // namespace
}  // namespace fragscope::sources
