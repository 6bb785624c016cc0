// The fragscope trace format, version 1 (docs/formats.md): JSON Lines, a header line first,
// one event a line; read transparently from .jsonl, .jsonl.gz and .jsonl.zst.
//
// Main types: TraceHeader (what the first line says), Frame (a call site), TraceReader
// (streaming: memory is bounded by TraceLimits, never by file size) and TraceWriter.
//
// Thread safety: a reader or writer is used by one thread at a time.
#ifndef FRAGSCOPE_TRACE_H_
#define FRAGSCOPE_TRACE_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/status.h"

namespace fragscope {

/// Request trace: only what the program asked for (alloc/free of tensors, addr = an id).
/// Allocator trace: also what the allocator did with the driver (segment events, real addresses).
enum class TraceKind : std::uint8_t { kUnknown, kRequest, kAllocator };

struct DeviceInfo {
  std::int32_t device = 0;
  std::string name;
  std::optional<std::uint64_t> capacity_bytes;        // total device memory
  std::optional<std::uint64_t> used_by_others_bytes;  // CUDA context, NCCL, other processes
};

struct TraceHeader {
  int version = 1;
  TraceKind kind = TraceKind::kUnknown;  // kUnknown: decided by the first alloc/segment event
  std::string producer;
  std::vector<DeviceInfo> devices;
  /// allocator_settings as PYTORCH_CUDA_ALLOC_CONF-style "key:value" pairs, in file order.
  std::vector<std::pair<std::string, std::string>> allocator_settings;
  /// Free-form labels (model, architecture, run, ...), in file order.
  std::vector<std::pair<std::string, std::string>> labels;

  /// The entry for `device`, or nullptr.
  const DeviceInfo* FindDevice(std::int32_t device) const {
    for (const DeviceInfo& info : devices) {
      if (info.device == device) return &info;
    }
    return nullptr;
  }
};

/// A call site, defined by a {"action":"frame",...} line before the first event naming it.
struct Frame {
  std::int32_t id = 0;
  std::string name;
  std::string filename;
  std::int64_t line = 0;
};

/// Limits every reader enforces; exceeding one is a kLimitExceeded error naming the limit.
struct TraceLimits {
  std::size_t max_line_bytes = std::size_t{16} << 20;     // 16 MiB: real lines are < 1 KiB
  std::uint64_t max_size_bytes = std::uint64_t{1} << 60;  // 1 EiB, PyTorch's own guard
  std::size_t max_frames = std::size_t{1} << 22;          // distinct call sites
  std::size_t max_devices = 4096;
  /// Bytes of call sites (frame lines) held; 0 = 64 x the input file's size, at least 1 GiB, at
  /// most half of physical memory (--max-memory; docs/user-guide.md, "Input budgets").
  std::uint64_t max_memory_bytes = 0;
  /// Events read; 0 = 64 per byte of the input file (a compressed file cannot stand for more),
  /// at least 1,000,000 (--max-events).
  std::uint64_t max_events = 0;
};

/// Reads a trace one event at a time.
class TraceReader {
 public:
  virtual ~TraceReader() = default;

  /// Opens `path` (format detected by content: plain, gzip or zstd) and reads the header.
  /// Errors: kNotFound/kIoError for the file, kCorruption naming "path:1" for a bad header.
  static Result<std::unique_ptr<TraceReader>> Open(const std::string& path,
                                                   const TraceLimits& limits = {});
  /// Same, over bytes in memory (tests, fuzzing); `name` is used in messages.
  static Result<std::unique_ptr<TraceReader>> FromBytes(std::string bytes, std::string name,
                                                        const TraceLimits& limits = {});

  virtual const TraceHeader& header() const = 0;

  /// Reads the next event into *event. Returns true for an event, false at the clean end of
  /// the input. Errors say "name:line: what is wrong" (field, value, limit). Frame lines are
  /// consumed here and recorded in frames().
  virtual Result<bool> Next(Event* event) = 0;

  /// Call sites defined so far, indexed by id (ids are dense from 0 in files we write; a
  /// missing id has an empty name).
  virtual const std::vector<Frame>& frames() const = 0;

  /// "name:line" of the line last returned by Next() (for messages from later stages).
  virtual std::string Where() const = 0;
  virtual std::uint64_t line_number() const = 0;
  /// Bytes of the underlying (possibly compressed) input consumed so far, and its total size
  /// if known (0 otherwise): for progress reports.
  virtual std::uint64_t input_bytes_consumed() const = 0;
  virtual std::uint64_t input_bytes_total() const = 0;
};

enum class Compression : std::uint8_t { kNone, kGzip, kZstd };
/// .gz -> gzip, .zst -> zstd, anything else -> none.
Compression CompressionForPath(const std::string& path);

/// A reader accepts a few things TraceWriter refuses: strings that are not valid UTF-8 (a pickle's
/// strings are raw bytes), a negative frame line, a time_us below -1 (a snapshot's), a header
/// key or device listed twice. These return what the writer takes, so everything `analyze`
/// reads can be written as a trace (issue 30 item 12): each byte that starts no valid UTF-8
/// sequence becomes U+FFFD, a negative line 0, time_us -1 (unknown), a repeated key keeps its
/// first place and its last value (as readers keep it), a repeated or negative device is left
/// out.
TraceHeader WritableHeader(const TraceHeader& header);
Frame WritableFrame(const Frame& frame);
Event WritableEvent(const Event& event);

/// Writes a trace. Output goes to a new temporary file next to `path` (created exclusively, under
/// a random name) and is renamed to `path` by Close(), so a reader never sees a half-written file
/// under the final name, and nothing is written through a planted link.
class TraceWriter {
 public:
  virtual ~TraceWriter() = default;
  /// `path_named_by_user`: the user named `path` as the output, so a symbolic link there to an
  /// existing file is followed (that file is replaced); otherwise (a name the program chose) a
  /// link there is refused. A link to nothing is always refused (kInvalidArgument).
  static Result<std::unique_ptr<TraceWriter>> Create(const std::string& path,
                                                     const TraceHeader& header,
                                                     bool path_named_by_user = true);
  /// Writes into a string (tests): the bytes appear in *out after Close().
  static std::unique_ptr<TraceWriter> ToString(std::string* out, const TraceHeader& header,
                                               Compression compression = Compression::kNone);
  virtual Status WriteFrame(const Frame& frame) = 0;
  virtual Status Write(const Event& event) = 0;
  /// Flushes, finishes compression and publishes the file. Must be called; a writer destroyed
  /// without Close() removes its temporary file.
  virtual Status Close() = 0;
};

}  // namespace fragscope

#endif  // FRAGSCOPE_TRACE_H_
