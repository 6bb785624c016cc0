// TraceWriter for the fragscope trace format v1 (docs/formats.md).
//
// Lines are formatted by hand into a buffer that is handed to the compressor in 1 MiB pieces.
// The writer refuses events the reader would refuse (negative device, undefined frame, ...), so
// every file it writes reads back into the same events.
#include <charconv>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "fragscope/trace.h"
#include "sources/trace/json_scan.h"
#include "sources/trace/output_stream.h"

namespace fragscope {

Compression CompressionForPath(const std::string& path) {
  auto ends_with = [&](std::string_view suffix) {
    return path.size() >= suffix.size() &&
           std::string_view(path).substr(path.size() - suffix.size()) == suffix;
  };
  if (ends_with(".gz")) return Compression::kGzip;
  if (ends_with(".zst")) return Compression::kZstd;
  return Compression::kNone;
}

namespace {

// Formatted lines are passed to the compressor once this much has gathered.
constexpr std::size_t kTraceFlushBytes = std::size_t{1} << 20;

void AppendUint(std::uint64_t value, std::string* out) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), value);
  out->append(digits, end);
}
void AppendInt(std::int64_t value, std::string* out) {
  char digits[24];
  auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), value);
  out->append(digits, end);
}
// Shortest text that reads back as the same double (what from_chars in the reader expects).
void AppendDouble(double value, std::string* out) {
  char digits[32];
  auto [end, ec] = std::to_chars(digits, digits + sizeof(digits), value);
  out->append(digits, end);
}

// Appends ,"key":<string>; false if `value` is not UTF-8.
bool AppendStringMember(std::string_view key, std::string_view value, std::string* out) {
  out->append(",\"").append(key).append("\":");
  return sources::AppendJsonString(value, out);
}

Status AppendPairs(std::string_view key,
                   const std::vector<std::pair<std::string, std::string>>& pairs,
                   std::string* out) {
  out->append(",\"").append(key).append("\":{");
  std::set<std::string_view> seen;
  for (std::size_t i = 0; i < pairs.size(); ++i) {
    const auto& [name, value] = pairs[i];
    // A JSON object cannot hold a key twice (readers keep the last one).
    if (!seen.insert(name).second) {
      return Status::InvalidArgument(std::string(key) + ": key \"" + name + "\" appears twice");
    }
    if (i > 0) out->push_back(',');
    bool utf8 = sources::AppendJsonString(name, out);
    out->push_back(':');
    if (!utf8 || !sources::AppendJsonString(value, out)) {
      return Status::InvalidArgument(std::string(key) + ": an entry is not valid UTF-8");
    }
  }
  out->push_back('}');
  return Status::Ok();
}

Status AppendHeader(const TraceHeader& header, std::string* out) {
  out->append(R"({"format":"fragscope-trace","version":1)");
  if (header.kind == TraceKind::kRequest) out->append(R"(,"kind":"request")");
  if (header.kind == TraceKind::kAllocator) out->append(R"(,"kind":"allocator")");
  if (!header.producer.empty() && !AppendStringMember("producer", header.producer, out)) {
    return Status::InvalidArgument("header: producer is not valid UTF-8");
  }
  if (!header.devices.empty()) {
    out->append(R"(,"devices":[)");
    std::set<std::int32_t> seen;
    for (std::size_t i = 0; i < header.devices.size(); ++i) {
      const DeviceInfo& d = header.devices[i];
      if (d.device < 0 || !seen.insert(d.device).second) {
        return Status::InvalidArgument("header: device " + std::to_string(d.device) +
                                       " is negative or listed twice");
      }
      if (i > 0) out->push_back(',');
      out->append(R"({"device":)");
      AppendInt(d.device, out);
      if (!d.name.empty() && !AppendStringMember("name", d.name, out)) {
        return Status::InvalidArgument("header: device name is not valid UTF-8");
      }
      if (d.capacity_bytes) {
        out->append(R"(,"capacity_bytes":)");
        AppendUint(*d.capacity_bytes, out);
      }
      if (d.used_by_others_bytes) {
        out->append(R"(,"used_by_others_bytes":)");
        AppendUint(*d.used_by_others_bytes, out);
      }
      out->push_back('}');
    }
    out->push_back(']');
  }
  if (!header.allocator_settings.empty()) {
    FRAGSCOPE_RETURN_IF_ERROR(AppendPairs("allocator_settings", header.allocator_settings, out));
  }
  if (!header.labels.empty()) FRAGSCOPE_RETURN_IF_ERROR(AppendPairs("labels", header.labels, out));
  out->append("}\n");
  return Status::Ok();
}

// Actions whose lines always carry addr / size (the reader requires them).
bool RequiresAddr(Action a) {
  switch (a) {
    case Action::kAlloc:
    case Action::kFreeRequested:
    case Action::kFreeCompleted:
    case Action::kSegmentAlloc:
    case Action::kSegmentFree:
    case Action::kSegmentMap:
    case Action::kSegmentUnmap:
    case Action::kRecordStream:
    case Action::kBlock:
      return true;
    default:
      return false;
  }
}
bool RequiresSize(Action a) {
  switch (a) {
    case Action::kAlloc:
    case Action::kBlock:
    case Action::kSegmentAlloc:
    case Action::kSegmentMap:
    case Action::kSegmentUnmap:
    case Action::kOom:
      return true;
    default:
      return false;
  }
}

class TraceWriterImpl final : public TraceWriter {
 public:
  // File output: `tmp_path` is renamed to `path` by Close().
  explicit TraceWriterImpl(std::string path) : path_(std::move(path)) {}
  // String output: the bytes are moved to *string_out by Close().
  explicit TraceWriterImpl(std::string* string_out) : string_out_(string_out) {}

  // A file output not closed: destroying out_ destroys its SafeFile, which removes the
  // temporary.
  ~TraceWriterImpl() override = default;
  TraceWriterImpl(const TraceWriterImpl&) = delete;
  TraceWriterImpl& operator=(const TraceWriterImpl&) = delete;

  // Starts the output. Errors are also kept and returned by every later call.
  Status Start(Result<std::unique_ptr<sources::OutputStream>> out, const TraceHeader& header) {
    if (!out.ok()) return failure_ = out.status();
    out_ = std::move(*out);
    Status status = AppendHeader(header, &buffer_);
    if (!status.ok()) failure_ = status;
    return status;
  }

  std::string* collected() { return &collected_; }

  Status WriteFrame(const Frame& frame) override {
    FRAGSCOPE_RETURN_IF_ERROR(CheckOpen());
    std::string where = "frame " + std::to_string(frame.id);
    if (frame.id < 0 || static_cast<std::size_t>(frame.id) >= TraceLimits{}.max_frames) {
      return Status::InvalidArgument(where + ": id must be in [0, " +
                                     std::to_string(TraceLimits{}.max_frames) + ")");
    }
    std::size_t index = static_cast<std::size_t>(frame.id);
    if (index < defined_.size() && defined_[index]) {
      return Status::InvalidArgument(where + ": defined twice");
    }
    if (frame.line < 0) return Status::InvalidArgument(where + ": negative line");
    std::size_t rollback = buffer_.size();
    buffer_.append(R"({"action":"frame","id":)");
    AppendInt(frame.id, &buffer_);
    bool utf8 = AppendStringMember("name", frame.name, &buffer_);
    if (utf8 && !frame.filename.empty()) {
      utf8 = AppendStringMember("filename", frame.filename, &buffer_);
    }
    if (!utf8) {
      buffer_.resize(rollback);
      return Status::InvalidArgument(where + ": name or filename is not valid UTF-8");
    }
    if (frame.line != 0) {
      buffer_.append(R"(,"line":)");
      AppendInt(frame.line, &buffer_);
    }
    buffer_.append("}\n");
    if (index >= defined_.size()) defined_.resize(index + 1, false);
    defined_[index] = true;
    return MaybeFlush();
  }

  Status Write(const Event& e) override {
    FRAGSCOPE_RETURN_IF_ERROR(CheckOpen());
    FRAGSCOPE_RETURN_IF_ERROR(Validate(e));
    std::string& out = buffer_;
    const Action a = e.action;
    out.append(R"({"action":")").append(ActionName(a)).push_back('"');
    if (RequiresAddr(a) || e.addr != 0) {
      out.append(R"(,"addr":)");
      AppendUint(e.addr, &out);
    }
    if (RequiresSize(a) || e.size != 0) {
      out.append(R"(,"size":)");
      AppendUint(e.size, &out);
    }
    if ((a == Action::kAlloc || a == Action::kBlock) && e.block_size != 0) {
      out.append(R"(,"block_size":)");
      AppendUint(e.block_size, &out);
    }
    // stream_sync: an absent stream means "all streams", so has_stream decides, even for 0.
    bool write_stream = a == Action::kStreamSync     ? e.has_stream
                        : a == Action::kRecordStream ? true
                                                     : e.stream != 0;
    if (write_stream) {
      out.append(R"(,"stream":)");
      AppendUint(e.stream, &out);
    }
    if (e.device != 0) {
      out.append(R"(,"device":)");
      AppendInt(e.device, &out);
    }
    if (e.time_us >= 0) {
      out.append(R"(,"time_us":)");
      AppendInt(e.time_us, &out);
    }
    switch (a) {
      case Action::kStep:
        out.append(R"(,"step":)");
        AppendInt(e.step, &out);
        break;
      case Action::kOom:
        if (e.device_free) {
          out.append(R"(,"device_free":)");
          AppendUint(*e.device_free, &out);
        }
        break;
      case Action::kSegmentAlloc:
      case Action::kSegmentMap:
        if (e.pool != Pool::kUnknown) {
          out.append(R"(,"pool":")").append(PoolName(e.pool)).push_back('"');
        }
        break;
      case Action::kSetMemoryFraction:
        out.append(R"(,"fraction":)");
        AppendDouble(e.fraction, &out);
        break;
      case Action::kSetAllocatorSettings:
        AppendStringMember("conf", e.conf, &out);  // Validate() checked the UTF-8
        break;
      default:
        break;
    }
    if (e.frame >= 0) {
      out.append(R"(,"frame":)");
      AppendInt(e.frame, &out);
    }
    out.append("}\n");
    ++events_;
    return MaybeFlush();
  }

  Status Close() override {
    if (closed_) return Status::InvalidArgument("trace writer: Close() called twice");
    closed_ = true;
    Status status = failure_;
    if (status.ok()) status = Flush();
    if (status.ok()) status = out_->Finish();
    // For a file, Finish() closed the SafeFile, which renamed it into place; on a failure the
    // temporary goes with out_.
    if (!status.ok()) {
      out_.reset();
    } else if (path_.empty()) {
      *string_out_ = std::move(collected_);
    }
    if (!status.ok()) failure_ = status;
    return status;
  }

 private:
  Status CheckOpen() const {
    if (closed_) return Status::InvalidArgument("trace writer: write after Close()");
    return failure_;
  }

  Status Validate(const Event& e) const {
    auto bad = [&](const std::string& what) {
      const int action = static_cast<int>(e.action);
      std::string name = action >= 0 && action < kNumActions ? std::string(ActionName(e.action))
                                                             : "action " + std::to_string(action);
      return Status::InvalidArgument("event " + std::to_string(events_) + " (" + name +
                                     "): " + what);
    };
    if (static_cast<int>(e.action) >= kNumActions) return bad("unknown action");
    if (e.device < 0) return bad("negative device");
    if (e.time_us < -1) return bad("time_us is negative (use -1 for unknown)");
    if (e.frame < -1) return bad("frame must be -1 (none) or a defined id");
    if (e.frame >= 0 && (static_cast<std::size_t>(e.frame) >= defined_.size() ||
                         !defined_[static_cast<std::size_t>(e.frame)])) {
      return bad("frame " + std::to_string(e.frame) + " was not defined with WriteFrame()");
    }
    const std::uint64_t max_size = TraceLimits{}.max_size_bytes;
    // A requested size may be anything (the reader's rule): PyTorch fails >= 1 EiB itself.
    const bool request = e.action == Action::kAlloc || e.action == Action::kFreeRequested ||
                         e.action == Action::kFreeCompleted;
    if ((e.size >= max_size && !request) || e.block_size >= max_size ||
        (e.device_free && *e.device_free >= max_size)) {
      return bad("a size is at or above max_size_bytes (1 EiB)");
    }
    switch (e.action) {
      case Action::kStep:
        if (e.step < 0) return bad("negative step");
        break;
      case Action::kBlock:
        if (e.size == 0 || e.block_size < e.size) {
          return bad("a block needs 0 < size <= block_size");
        }
        break;
      case Action::kStreamSync:
        if (!e.has_stream && e.stream != 0) return bad("stream is set but has_stream is false");
        break;
      case Action::kSetMemoryFraction:
        if (!(e.fraction >= 0.0 && e.fraction <= 1.0)) return bad("fraction is not in [0, 1]");
        break;
      case Action::kSetAllocatorSettings:
        if (!sources::IsValidUtf8(e.conf)) return bad("conf is not valid UTF-8");
        break;
      default:
        break;
    }
    return Status::Ok();
  }

  Status MaybeFlush() { return buffer_.size() >= kTraceFlushBytes ? Flush() : Status::Ok(); }
  Status Flush() {
    if (buffer_.empty()) return Status::Ok();
    Status status = out_->Write(buffer_);
    buffer_.clear();
    if (!status.ok()) failure_ = status;
    return status;
  }

  std::string path_;  // file output only
  std::string* string_out_ = nullptr;
  std::string collected_;  // string output, before Close(); outlives out_ (declared first)
  std::unique_ptr<sources::OutputStream> out_;
  std::string buffer_;         // formatted lines not yet handed to out_
  std::vector<bool> defined_;  // defined_[id]: WriteFrame(id) was called
  std::uint64_t events_ = 0;
  bool closed_ = false;
  Status failure_;  // sticky: an output error or a bad header
};

}  // namespace

Result<std::unique_ptr<TraceWriter>> TraceWriter::Create(const std::string& path,
                                                         const TraceHeader& header,
                                                         bool path_named_by_user) {
  Result<std::unique_ptr<sources::ByteSink>> sink = sources::CreateFileSink(
      path, path_named_by_user ? OutputOrigin::kNamedByUser : OutputOrigin::kChosenByTool);
  if (!sink.ok()) return sink.status();
  // From here on the writer owns the temporary file (in its SafeFile) and removes it on failure.
  auto writer = std::make_unique<TraceWriterImpl>(path);
  FRAGSCOPE_RETURN_IF_ERROR(writer->Start(
      sources::OutputStream::Create(CompressionForPath(path), std::move(*sink)), header));
  return std::unique_ptr<TraceWriter>(std::move(writer));
}

std::unique_ptr<TraceWriter> TraceWriter::ToString(std::string* out, const TraceHeader& header,
                                                   Compression compression) {
  auto writer = std::make_unique<TraceWriterImpl>(out);
  // A failure (bad header) is kept and returned by the first Write/WriteFrame/Close.
  (void)writer->Start(
      sources::OutputStream::Create(compression, sources::StringSink(writer->collected())), header);
  return writer;
}

// ---- What a reader accepts, made writable (issue 30 item 12) -------------------------------

namespace {

std::vector<std::pair<std::string, std::string>> WritablePairs(
    const std::vector<std::pair<std::string, std::string>>& pairs) {
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(pairs.size());
  std::unordered_map<std::string, std::size_t> index;
  for (const auto& [name, value] : pairs) {
    std::string key = sources::ToValidUtf8(name);
    const auto [it, inserted] = index.try_emplace(key, out.size());
    if (inserted) {
      out.emplace_back(std::move(key), sources::ToValidUtf8(value));
    } else {
      out[it->second].second = sources::ToValidUtf8(value);
    }
  }
  return out;
}

}  // namespace

TraceHeader WritableHeader(const TraceHeader& header) {
  TraceHeader out = header;
  out.producer = sources::ToValidUtf8(header.producer);
  out.devices.clear();
  std::set<std::int32_t> seen;
  for (const DeviceInfo& d : header.devices) {
    if (d.device < 0 || !seen.insert(d.device).second) continue;
    DeviceInfo copy = d;
    copy.name = sources::ToValidUtf8(d.name);
    out.devices.push_back(std::move(copy));
  }
  out.allocator_settings = WritablePairs(header.allocator_settings);
  out.labels = WritablePairs(header.labels);
  return out;
}

Frame WritableFrame(const Frame& frame) {
  Frame out = frame;
  out.name = sources::ToValidUtf8(frame.name);
  out.filename = sources::ToValidUtf8(frame.filename);
  if (out.line < 0) out.line = 0;
  return out;
}

Event WritableEvent(const Event& event) {
  Event out = event;
  if (out.time_us < -1) out.time_us = -1;
  return out;
}

}  // namespace fragscope
