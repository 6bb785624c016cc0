// Fuzz target for TraceReader::FromBytes (plain, gzip and zstd input, header and event lines),
// with a round-trip oracle: whatever the reader accepts, TraceWriter must write and the reader
// must read back unchanged (header, frames and every event field).
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt, preset "fuzz") and with replay_main.cc
// (trace_reader_fuzz_replay, a ctest that runs fuzz/corpus/trace_reader/).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/trace.h"

namespace {

using fragscope::Event;
using fragscope::Frame;
using fragscope::TraceHeader;
using fragscope::TraceLimits;
using fragscope::TraceReader;

// An input above 64 KiB probably isn't interesting: everything the reader does is per line
// and per decoder block, and smaller inputs reach it faster.
constexpr std::size_t kMaxInputBytes = std::size_t{64} << 10;
// A few KiB of zstd or gzip can expand to gigabytes of valid lines (a decompression bomb);
// stop after this many events so one input cannot take minutes. Such inputs skip the
// round trip, which needs the whole trace.
constexpr std::size_t kMaxEvents = 20000;

TraceLimits FuzzLimits() {
  TraceLimits limits;
  // Lines longer than 4 KiB take the limit path; real lines are < 1 KiB.
  limits.max_line_bytes = 4096;
  // Frame slots are allocated up to the largest id, so a small cap bounds memory per input
  // while ids at and above it still reach the limit check.
  limits.max_frames = 256;
  // Likewise for the header's device list.
  limits.max_devices = 16;
  // max_size_bytes keeps its default (1 EiB): reachable with ordinary 19-digit numbers.
  return limits;
}

[[noreturn]] void Fail(const std::string& what) {
  std::fprintf(stderr, "round trip mismatch: %s\n", what.c_str());
  std::abort();
}

void Check(bool ok, const std::string& what) {
  if (!ok) Fail(what);
}

bool SameEvent(const Event& a, const Event& b) {
  return a.action == b.action && a.device == b.device && a.stream == b.stream && a.addr == b.addr &&
         a.size == b.size && a.block_size == b.block_size && a.time_us == b.time_us &&
         a.step == b.step && a.device_free == b.device_free && a.pool == b.pool &&
         a.fraction == b.fraction && a.has_stream == b.has_stream && a.frame == b.frame &&
         a.conf == b.conf;
}

void CheckSameHeader(const TraceHeader& a, const TraceHeader& b) {
  Check(a.version == b.version && a.kind == b.kind && a.producer == b.producer, "header");
  Check(a.allocator_settings == b.allocator_settings, "allocator_settings");
  Check(a.labels == b.labels, "labels");
  Check(a.devices.size() == b.devices.size(), "device count");
  for (std::size_t i = 0; i < a.devices.size(); ++i) {
    const auto& x = a.devices[i];
    const auto& y = b.devices[i];
    Check(x.device == y.device && x.name == y.name && x.capacity_bytes == y.capacity_bytes &&
              x.used_by_others_bytes == y.used_by_others_bytes,
          "device " + std::to_string(i));
  }
}

void RoundTrip(const TraceHeader& header, const std::vector<Frame>& frames,
               const std::vector<Event>& events, fragscope::Compression compression) {
  std::string bytes;
  auto writer = fragscope::TraceWriter::ToString(&bytes, header, compression);
  // Every slot is written, gaps included (as frames with empty names), so frames() of the
  // copy equals the original's.
  for (const Frame& frame : frames) {
    fragscope::Status status = writer->WriteFrame(frame);
    Check(status.ok(), "WriteFrame: " + status.ToString());
  }
  for (const Event& event : events) {
    fragscope::Status status = writer->Write(event);
    Check(status.ok(), "Write: " + status.ToString());
  }
  fragscope::Status closed = writer->Close();
  Check(closed.ok(), "Close: " + closed.ToString());

  // Default limits but the same frame cap: escaping can change line lengths.
  TraceLimits limits;
  limits.max_frames = FuzzLimits().max_frames;
  limits.max_devices = FuzzLimits().max_devices;
  auto reader = TraceReader::FromBytes(std::move(bytes), "copy", limits);
  Check(reader.ok(), "reopen: " + reader.status().ToString());
  CheckSameHeader(header, (*reader)->header());
  std::size_t i = 0;
  for (;; ++i) {
    Event event;
    fragscope::Result<bool> got = (*reader)->Next(&event);
    Check(got.ok(), "reread: " + got.status().ToString());
    if (!*got) break;
    Check(i < events.size(), "extra event");
    Check(SameEvent(event, events[i]), "event " + std::to_string(i));
  }
  Check(i == events.size(), "missing events");
  const std::vector<Frame>& copy = (*reader)->frames();
  Check(copy.size() == frames.size(), "frame count");
  for (std::size_t f = 0; f < frames.size(); ++f) {
    Check(copy[f].id == frames[f].id && copy[f].name == frames[f].name &&
              copy[f].filename == frames[f].filename && copy[f].line == frames[f].line,
          "frame " + std::to_string(f));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return 0;
  std::string bytes(reinterpret_cast<const char*>(data), size);
  auto reader = TraceReader::FromBytes(std::move(bytes), "fuzz", FuzzLimits());
  if (!reader.ok()) return 0;
  std::vector<Event> events;
  for (;;) {
    if (events.size() == kMaxEvents) return 0;
    Event event;
    fragscope::Result<bool> got = (*reader)->Next(&event);
    if (!got.ok()) {
      // Errors must name the input and a line.
      Check(got.status().message().rfind("fuzz:", 0) == 0,
            "error without location: " + got.status().message());
      return 0;
    }
    if (!*got) break;
    events.push_back(std::move(event));
  }
  // Vary the writer's compression with the input so all three encoders get exercised.
  auto compression = static_cast<fragscope::Compression>(size % 3);
  RoundTrip((*reader)->header(), (*reader)->frames(), events, compression);
  return 0;
}
