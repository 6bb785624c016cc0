#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fragscope/trace.h"
#include "sources/trace_test_util.h"
#include "testing/test_util.h"

namespace fragscope {
namespace {

using testing::DescribeEvent;
using testing::DescribeEvents;
using testing::ReadAll;

// The names in `dir` (a temporary file included), sorted.
std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::size_t DotFilesIn(const std::string& dir) {
  const std::vector<std::string> names = FilesIn(dir);
  return static_cast<std::size_t>(
      std::count_if(names.begin(), names.end(), [](const std::string& n) { return n[0] == '.'; }));
}

// The output of a writer fed `events` (no frames) with an empty header.
std::string WriteEvents(const std::vector<Event>& events, Compression c = Compression::kNone) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, TraceHeader{}, c);
  for (const Event& e : events) EXPECT_TRUE(writer->Write(e).ok()) << DescribeEvent(e);
  EXPECT_TRUE(writer->Close().ok());
  return out;
}

std::string WriteOne(const Event& e) {
  std::string out = WriteEvents({e});
  std::size_t nl = out.find('\n');
  return out.substr(nl + 1);
}

// One event per action, every field the action uses set to something other than its default.
std::vector<Event> EveryAction() {
  std::vector<Event> events;
  auto add = [&](Action a) -> Event& {
    Event& e = events.emplace_back();
    e.action = a;
    e.device = 3;
    e.stream = 94245052841536;
    e.time_us = 1708187029490966;
    e.frame = 1;
    return e;
  };
  Event& alloc = add(Action::kAlloc);
  alloc.addr = 140234567890123;
  alloc.size = 1000;
  alloc.block_size = 1024;
  for (Action a : {Action::kFreeRequested, Action::kFreeCompleted, Action::kSegmentFree,
                   Action::kSegmentUnmap}) {
    Event& e = add(a);
    e.addr = 140234567890123;
    e.size = 2097152;
  }
  Event& segment = add(Action::kSegmentAlloc);
  segment.addr = 1ull << 47;
  segment.size = 20971520;
  segment.pool = Pool::kLarge;
  Event& map = add(Action::kSegmentMap);
  map.addr = 1ull << 46;
  map.size = 2097152;
  map.pool = Pool::kSmall;
  Event& oom = add(Action::kOom);
  oom.size = 5308694528;
  oom.device_free = 95682560;
  add(Action::kSnapshot).size = 48760832;
  add(Action::kStep).step = 123456;
  add(Action::kRecordStream).addr = 42;
  add(Action::kStreamSync).has_stream = true;
  Event& all_streams = add(Action::kStreamSync);
  all_streams.stream = 0;
  Event& stream0 = add(Action::kStreamSync);
  stream0.stream = 0;
  stream0.has_stream = true;
  add(Action::kEmptyCache);
  add(Action::kSetMemoryFraction).fraction = 0.1;
  add(Action::kSetAllocatorSettings).conf =
      "expandable_segments:True,\"quoted\"\\back\nline\t\x01\xC3\xA9\xF0\x9F\x98\x80";
  // Zero values and defaults must survive as well.
  Event& zero_alloc = events.emplace_back();
  zero_alloc.action = Action::kAlloc;
  Event& zero_fraction = events.emplace_back();
  zero_fraction.action = Action::kSetMemoryFraction;
  Event& oom_unknown_free = events.emplace_back();
  oom_unknown_free.action = Action::kOom;
  oom_unknown_free.size = 1;
  Event& segment_no_pool = events.emplace_back();
  segment_no_pool.action = Action::kSegmentAlloc;
  segment_no_pool.addr = 1;
  segment_no_pool.size = 1;
  Event& step_zero = events.emplace_back();
  step_zero.action = Action::kStep;
  Event& big = events.emplace_back();
  big.action = Action::kAlloc;
  big.addr = UINT64_MAX;
  big.size = (std::uint64_t{1} << 60) - 1;
  big.stream = UINT64_MAX;
  big.device = INT32_MAX;
  big.time_us = INT64_MAX;
  Event& tiny_fraction = events.emplace_back();
  tiny_fraction.action = Action::kSetMemoryFraction;
  tiny_fraction.fraction = std::numeric_limits<double>::denorm_min();
  return events;
}

TraceHeader FullHeader() {
  TraceHeader h;
  h.kind = TraceKind::kRequest;
  h.producer = "test \"writer\"";
  h.devices.push_back({.device = 0,
                       .name = "NVIDIA H100 80GB HBM3",
                       .capacity_bytes = 85520809984,
                       .used_by_others_bytes = 0});
  h.devices.push_back(
      {.device = 7, .name = "", .capacity_bytes = std::nullopt, .used_by_others_bytes = 123});
  h.allocator_settings = {{"expandable_segments", "True"},
                          {"roundup_power2_divisions", "[256:1,512:2,>:8]"}};
  h.labels = {{"model", "llama-7b"}, {"run", "r\u00e9sum\u00e9"}};
  return h;
}

// ---- Exact output ---------------------------------------------------------------------------

TEST(TraceWriterTest, TypicalAllocLine) {
  Event e;
  e.action = Action::kAlloc;
  e.addr = 140234567890123;
  e.size = 1048576;
  e.time_us = 1708187029490966;
  EXPECT_EQ(WriteOne(e),
            R"({"action":"alloc","addr":140234567890123,"size":1048576,"time_us":1708187029490966})"
            "\n");
}

TEST(TraceWriterTest, KeyOrder) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, TraceHeader{});
  ASSERT_TRUE(writer->WriteFrame({.id = 0, .name = "f", .filename = "a.py", .line = 3}).ok());
  ASSERT_TRUE(writer->WriteFrame({.id = 1, .name = "g", .filename = "", .line = 0}).ok());
  Event alloc;
  alloc.action = Action::kAlloc;
  alloc.addr = 1;
  alloc.size = 2;
  alloc.block_size = 512;
  alloc.stream = 4;
  alloc.device = 5;
  alloc.time_us = 6;
  alloc.frame = 0;
  ASSERT_TRUE(writer->Write(alloc).ok());
  Event oom;
  oom.action = Action::kOom;
  oom.size = 9;
  oom.device_free = 8;
  oom.time_us = 0;
  ASSERT_TRUE(writer->Write(oom).ok());
  Event segment;
  segment.action = Action::kSegmentMap;
  segment.addr = 0;
  segment.size = 2;
  segment.pool = Pool::kLarge;
  segment.frame = 1;
  ASSERT_TRUE(writer->Write(segment).ok());
  Event step;
  step.action = Action::kStep;
  step.step = 0;
  ASSERT_TRUE(writer->Write(step).ok());
  Event sync;
  sync.action = Action::kStreamSync;
  ASSERT_TRUE(writer->Write(sync).ok());
  Event record;
  record.action = Action::kRecordStream;
  ASSERT_TRUE(writer->Write(record).ok());
  Event fraction;
  fraction.action = Action::kSetMemoryFraction;
  fraction.fraction = 0.25;
  ASSERT_TRUE(writer->Write(fraction).ok());
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(
      out,
      R"({"format":"fragscope-trace","version":1})"
      "\n"
      R"({"action":"frame","id":0,"name":"f","filename":"a.py","line":3})"
      "\n"
      R"({"action":"frame","id":1,"name":"g"})"
      "\n"
      R"({"action":"alloc","addr":1,"size":2,"block_size":512,"stream":4,"device":5,"time_us":6,"frame":0})"
      "\n"
      R"({"action":"oom","size":9,"time_us":0,"device_free":8})"
      "\n"
      R"({"action":"segment_map","addr":0,"size":2,"pool":"large","frame":1})"
      "\n"
      R"({"action":"step","step":0})"
      "\n"
      R"({"action":"stream_sync"})"
      "\n"
      R"({"action":"record_stream","addr":0,"stream":0})"
      "\n"
      R"({"action":"set_memory_fraction","fraction":0.25})"
      "\n");
}

TEST(TraceWriterTest, HeaderLine) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, FullHeader());
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(
      out,
      R"({"format":"fragscope-trace","version":1,"kind":"request","producer":"test \"writer\"",)"
      R"("devices":[{"device":0,"name":"NVIDIA H100 80GB HBM3","capacity_bytes":85520809984,)"
      R"("used_by_others_bytes":0},{"device":7,"used_by_others_bytes":123}],)"
      R"("allocator_settings":{"expandable_segments":"True","roundup_power2_divisions":"[256:1,512:2,>:8]"},)"
      R"("labels":{"model":"llama-7b","run":"résumé"}})"
      "\n");
}

TEST(TraceWriterTest, StringEscapes) {
  Event e;
  e.action = Action::kSetAllocatorSettings;
  e.conf = std::string("q\"b\\n\nr\rt\tb\bf\f\x01\x1f\x7f\xC3\xA9", 19) + std::string(1, '\0');
  EXPECT_EQ(WriteOne(e),
            "{\"action\":\"set_allocator_settings\","
            "\"conf\":\"q\\\"b\\\\n\\nr\\rt\\tb\\bf\\f\\u0001\\u001f\x7f\xC3\xA9\\u0000\"}\n");
}

TEST(TraceWriterTest, NothingAppearsBeforeClose) {
  std::string out = "old";
  auto writer = TraceWriter::ToString(&out, TraceHeader{});
  Event e;
  e.action = Action::kEmptyCache;
  ASSERT_TRUE(writer->Write(e).ok());
  EXPECT_EQ(out, "old");
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(out, R"({"format":"fragscope-trace","version":1})"
                 "\n"
                 R"({"action":"empty_cache"})"
                 "\n");
}

// ---- Round trips ----------------------------------------------------------------------------

void ExpectRoundTrip(const std::string& bytes, const std::vector<Event>& events,
                     const TraceHeader& header, const std::vector<Frame>& frames) {
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::FromBytes(bytes, "rt");
  ASSERT_TRUE(reader.ok()) << reader.status().ToString();
  std::vector<Event> read;
  Status status = ReadAll(**reader, &read);
  ASSERT_TRUE(status.ok()) << status.ToString();
  EXPECT_EQ(DescribeEvents(read), DescribeEvents(events));
  const TraceHeader& h = (*reader)->header();
  EXPECT_EQ(h.kind, header.kind);
  EXPECT_EQ(h.producer, header.producer);
  ASSERT_EQ(h.devices.size(), header.devices.size());
  for (std::size_t i = 0; i < h.devices.size(); ++i) {
    EXPECT_EQ(h.devices[i].device, header.devices[i].device);
    EXPECT_EQ(h.devices[i].name, header.devices[i].name);
    EXPECT_EQ(h.devices[i].capacity_bytes, header.devices[i].capacity_bytes);
    EXPECT_EQ(h.devices[i].used_by_others_bytes, header.devices[i].used_by_others_bytes);
  }
  EXPECT_EQ(h.allocator_settings, header.allocator_settings);
  EXPECT_EQ(h.labels, header.labels);
  ASSERT_EQ((*reader)->frames().size(), frames.size());
  for (std::size_t i = 0; i < frames.size(); ++i) {
    EXPECT_EQ((*reader)->frames()[i].id, frames[i].id);
    EXPECT_EQ((*reader)->frames()[i].name, frames[i].name);
    EXPECT_EQ((*reader)->frames()[i].filename, frames[i].filename);
    EXPECT_EQ((*reader)->frames()[i].line, frames[i].line);
  }
}

const std::vector<Frame> kFrames = {
    {.id = 0, .name = "<module>", .filename = "train.py", .line = 1},
    {.id = 1, .name = "f\u00e9\"x\"", .filename = "", .line = 0}};

TEST(TraceWriterTest, EveryActionRoundTripsInEveryCompression) {
  const std::vector<Event> events = EveryAction();
  for (Compression c : {Compression::kNone, Compression::kGzip, Compression::kZstd}) {
    SCOPED_TRACE(static_cast<int>(c));
    std::string out;
    auto writer = TraceWriter::ToString(&out, FullHeader(), c);
    for (const Frame& f : kFrames) ASSERT_TRUE(writer->WriteFrame(f).ok());
    for (const Event& e : events) ASSERT_TRUE(writer->Write(e).ok()) << DescribeEvent(e);
    ASSERT_TRUE(writer->Close().ok());
    ExpectRoundTrip(out, events, FullHeader(), kFrames);
  }
}

TEST(TraceWriterTest, ManyEventsRoundTripAcrossFlushes) {
  // Several MiB, so the writer flushes its 1 MiB buffer and the compressors emit many blocks.
  std::vector<Event> events;
  for (std::uint64_t i = 0; i < 60000; ++i) {
    Event e;
    e.action = i % 2 == 0 ? Action::kAlloc : Action::kFreeCompleted;
    e.addr = 140234567890123 + (i / 2) * 512;
    e.size = 512 * (i % 1000 + 1);
    e.time_us = static_cast<std::int64_t>(1708187029490966 + i);
    e.stream = i % 3;
    events.push_back(e);
  }
  for (Compression c : {Compression::kNone, Compression::kGzip, Compression::kZstd}) {
    SCOPED_TRACE(static_cast<int>(c));
    ExpectRoundTrip(WriteEvents(events, c), events, TraceHeader{}, {});
  }
}

TEST(TraceWriterTest, FilesRoundTripAndCompressionFollowsTheName) {
  std::string dir = fragscope::testing::MakeTempDir();
  const std::vector<Event> events = EveryAction();
  struct Case {
    const char* name;
    const char* magic;
  };
  for (const Case& c : {Case{"t.jsonl", "{\"f"}, Case{"t.jsonl.gz", "\x1f\x8b"},
                        Case{"t.jsonl.zst", "\x28\xb5\x2f\xfd"}}) {
    SCOPED_TRACE(c.name);
    std::string path = dir + "/" + c.name;
    Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, FullHeader());
    ASSERT_TRUE(writer.ok()) << writer.status().ToString();
    for (const Frame& f : kFrames) ASSERT_TRUE((*writer)->WriteFrame(f).ok());
    for (const Event& e : events) ASSERT_TRUE((*writer)->Write(e).ok());
    // Until Close() the data lives in a temporary file next to it only (a dot name).
    EXPECT_EQ(DotFilesIn(dir), 1u);
    EXPECT_FALSE(std::filesystem::exists(path));
    ASSERT_TRUE((*writer)->Close().ok());
    EXPECT_EQ(DotFilesIn(dir), 0u);
    std::string bytes = fragscope::testing::ReadFileOrDie(path);
    EXPECT_EQ(bytes.rfind(c.magic, 0), 0u);
    ExpectRoundTrip(bytes, events, FullHeader(), kFrames);
    // And through Open(), by path.
    Result<std::unique_ptr<TraceReader>> reader = TraceReader::Open(path);
    ASSERT_TRUE(reader.ok());
    std::vector<Event> read;
    ASSERT_TRUE(ReadAll(**reader, &read).ok());
    EXPECT_EQ(read.size(), events.size());
    EXPECT_EQ((*reader)->input_bytes_total(), bytes.size());
  }
  std::filesystem::remove_all(dir);
}

// Large enough for zstd to cut it into several jobs (on a machine with a second core it
// compresses on a worker thread): every event comes back, in order.
TEST(TraceWriterTest, LargeZstdTraceRoundTrips) {
  std::string dir = fragscope::testing::MakeTempDir();
  std::string path = dir + "/big.jsonl.zst";
  constexpr std::uint64_t kEvents = 600000;  // ~30 MB of JSON Lines
  {
    Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, TraceHeader{});
    ASSERT_TRUE(writer.ok());
    Event e;
    for (std::uint64_t i = 0; i < kEvents; ++i) {
      e.action = i % 2 == 0 ? Action::kAlloc : Action::kFreeRequested;
      e.addr = 0x7f0000000000 + (i / 2) * 512;
      e.size = 512 + (i * 7919) % 100000;
      e.time_us = static_cast<std::int64_t>(i);
      ASSERT_TRUE((*writer)->Write(e).ok());
    }
    ASSERT_TRUE((*writer)->Close().ok());
  }
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::Open(path);
  ASSERT_TRUE(reader.ok());
  Event e;
  std::uint64_t n = 0;
  for (;;) {
    Result<bool> next = (*reader)->Next(&e);
    ASSERT_TRUE(next.ok()) << next.status().message();
    if (!*next) break;
    ASSERT_EQ(e.time_us, static_cast<std::int64_t>(n));
    ASSERT_EQ(e.size, 512 + (n * 7919) % 100000);
    ++n;
  }
  EXPECT_EQ(n, kEvents);
  std::filesystem::remove_all(dir);
}

TEST(TraceWriterTest, DestroyingWithoutCloseRemovesTheTemporaryFile) {
  std::string dir = fragscope::testing::MakeTempDir();
  std::string path = dir + "/t.jsonl.zst";
  {
    Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(path, TraceHeader{});
    ASSERT_TRUE(writer.ok());
    Event e;
    e.action = Action::kEmptyCache;
    ASSERT_TRUE((*writer)->Write(e).ok());
    EXPECT_EQ(FilesIn(dir).size(), 1u);  // the temporary
  }
  EXPECT_TRUE(FilesIn(dir).empty());
  std::filesystem::remove_all(dir);
}

// Issue 24 item 4: a link at the output is followed only when the user named the path, and
// never to create the link's target; a link at a name the program chose is refused.
TEST(TraceWriterTest, Issue24LinksAtTheOutput) {
  std::string dir = fragscope::testing::MakeTempDir();
  const std::string victim = dir + "/victim";
  const std::string link = dir + "/t.jsonl";
  {  // closed at the end of this scope
    std::ofstream(victim) << "untouched";
  }
  std::filesystem::create_symlink("victim", link);
  Result<std::unique_ptr<TraceWriter>> chosen =
      TraceWriter::Create(link, TraceHeader{}, /*path_named_by_user=*/false);
  ASSERT_FALSE(chosen.ok());
  EXPECT_EQ(chosen.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(chosen.status().message().find("is a symbolic link (to victim)"), std::string::npos)
      << chosen.status().message();
  EXPECT_EQ(fragscope::testing::ReadFileOrDie(victim), "untouched");

  Result<std::unique_ptr<TraceWriter>> named = TraceWriter::Create(link, TraceHeader{});
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  ASSERT_TRUE((*named)->Close().ok());
  EXPECT_TRUE(std::filesystem::is_symlink(link));  // the link stays; its file is replaced
  EXPECT_EQ(fragscope::testing::ReadFileOrDie(victim).rfind("{\"format\"", 0), 0u);

  const std::string dangling = dir + "/d.jsonl";
  std::filesystem::create_symlink("nowhere", dangling);
  Result<std::unique_ptr<TraceWriter>> to_nothing = TraceWriter::Create(dangling, TraceHeader{});
  ASSERT_FALSE(to_nothing.ok());
  EXPECT_NE(to_nothing.status().message().find("which does not exist"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir + "/nowhere"));
  std::filesystem::remove_all(dir);
}

TEST(TraceWriterTest, CreateInMissingDirectoryFails) {
  Result<std::unique_ptr<TraceWriter>> writer =
      TraceWriter::Create("/nonexistent/dir/t.jsonl", TraceHeader{});
  ASSERT_FALSE(writer.ok());
  EXPECT_EQ(writer.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(writer.status().message(),
            "/nonexistent/dir/t.jsonl: cannot create: no such directory /nonexistent/dir");
}

TEST(TraceWriterTest, CompressionForPath) {
  EXPECT_EQ(CompressionForPath("a.jsonl.gz"), Compression::kGzip);
  EXPECT_EQ(CompressionForPath("a.jsonl.zst"), Compression::kZstd);
  EXPECT_EQ(CompressionForPath("a.jsonl"), Compression::kNone);
  EXPECT_EQ(CompressionForPath("gz"), Compression::kNone);
  EXPECT_EQ(CompressionForPath("a.zst.tmp"), Compression::kNone);
  EXPECT_EQ(CompressionForPath(""), Compression::kNone);
}

// ---- What the writer refuses ----------------------------------------------------------------

std::string WriteError(const Event& e) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, TraceHeader{});
  Status status = writer->Write(e);
  EXPECT_EQ(status.code(), StatusCode::kInvalidArgument);
  // A refused event leaves the writer usable.
  Event ok;
  ok.action = Action::kEmptyCache;
  EXPECT_TRUE(writer->Write(ok).ok());
  return status.message();
}

TEST(TraceWriterTest, RefusesEventsTheReaderWouldRefuse) {
  Event e;
  e.action = Action::kAlloc;
  e.device = -1;
  EXPECT_EQ(WriteError(e), "event 0 (alloc): negative device");
  e = Event{};
  e.frame = 0;
  EXPECT_EQ(WriteError(e), "event 0 (alloc): frame 0 was not defined with WriteFrame()");
  e = Event{};
  e.frame = -2;
  EXPECT_EQ(WriteError(e), "event 0 (alloc): frame must be -1 (none) or a defined id");
  e = Event{};
  e.time_us = -7;
  EXPECT_EQ(WriteError(e), "event 0 (alloc): time_us is negative (use -1 for unknown)");
  e = Event{};
  e.block_size = std::uint64_t{1} << 60;
  EXPECT_EQ(WriteError(e), "event 0 (alloc): a size is at or above max_size_bytes (1 EiB)");
  e = Event{};
  e.action = Action::kSegmentAlloc;
  e.size = std::uint64_t{1} << 60;
  EXPECT_EQ(WriteError(e), "event 0 (segment_alloc): a size is at or above max_size_bytes (1 EiB)");
  e = Event{};
  e.action = Action::kStep;
  e.step = -1;
  EXPECT_EQ(WriteError(e), "event 0 (step): negative step");
  e = Event{};
  e.action = Action::kSetMemoryFraction;
  e.fraction = 1.5;
  EXPECT_EQ(WriteError(e), "event 0 (set_memory_fraction): fraction is not in [0, 1]");
  e.fraction = std::nan("");
  EXPECT_EQ(WriteError(e), "event 0 (set_memory_fraction): fraction is not in [0, 1]");
  e = Event{};
  e.action = Action::kSetAllocatorSettings;
  e.conf = "\xff";
  EXPECT_EQ(WriteError(e), "event 0 (set_allocator_settings): conf is not valid UTF-8");
  e = Event{};
  e.action = Action::kStreamSync;
  e.stream = 5;
  EXPECT_EQ(WriteError(e), "event 0 (stream_sync): stream is set but has_stream is false");
  e = Event{};
  e.action = static_cast<Action>(200);
  EXPECT_EQ(WriteError(e), "event 0 (action 200): unknown action");
}

TEST(TraceWriterTest, RefusesBadFrames) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, TraceHeader{});
  EXPECT_EQ(writer->WriteFrame({.id = -1, .name = "f", .filename = "", .line = 0}).message(),
            "frame -1: id must be in [0, 4194304)");
  ASSERT_TRUE(writer->WriteFrame({.id = 3, .name = "f", .filename = "", .line = 0}).ok());
  EXPECT_EQ(writer->WriteFrame({.id = 3, .name = "g", .filename = "", .line = 0}).message(),
            "frame 3: defined twice");
  EXPECT_EQ(writer->WriteFrame({.id = 4, .name = "\xc3", .filename = "", .line = 0}).message(),
            "frame 4: name or filename is not valid UTF-8");
  EXPECT_EQ(writer->WriteFrame({.id = 5, .name = "f", .filename = "", .line = -1}).message(),
            "frame 5: negative line");
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(out, R"({"format":"fragscope-trace","version":1})"
                 "\n"
                 R"({"action":"frame","id":3,"name":"f"})"
                 "\n");
}

TEST(TraceWriterTest, BadHeaderFailsEveryCall) {
  TraceHeader h;
  h.labels = {{"a", "1"}, {"a", "2"}};
  std::string out = "untouched";
  auto writer = TraceWriter::ToString(&out, h);
  Event e;
  e.action = Action::kEmptyCache;
  EXPECT_EQ(writer->Write(e).message(), "labels: key \"a\" appears twice");
  EXPECT_EQ(writer->Close().message(), "labels: key \"a\" appears twice");
  EXPECT_EQ(out, "untouched");

  std::string dir = fragscope::testing::MakeTempDir();
  TraceHeader bad_device;
  bad_device.devices.push_back(
      {.device = -2, .name = "", .capacity_bytes = {}, .used_by_others_bytes = {}});
  Result<std::unique_ptr<TraceWriter>> file = TraceWriter::Create(dir + "/t.jsonl", bad_device);
  ASSERT_FALSE(file.ok());
  EXPECT_EQ(file.status().message(), "header: device -2 is negative or listed twice");
  EXPECT_TRUE(std::filesystem::is_empty(dir));  // no temporary file left behind
  std::filesystem::remove_all(dir);
}

TEST(TraceWriterTest, CloseTwiceAndWriteAfterClose) {
  std::string out;
  auto writer = TraceWriter::ToString(&out, TraceHeader{});
  ASSERT_TRUE(writer->Close().ok());
  EXPECT_EQ(writer->Close().code(), StatusCode::kInvalidArgument);
  Event e;
  EXPECT_EQ(writer->Write(e).message(), "trace writer: write after Close()");
}

}  // namespace
}  // namespace fragscope
