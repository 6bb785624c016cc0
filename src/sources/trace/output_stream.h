// Byte output for the trace writer: ByteSink (a file or a string) and OutputStream, which
// compresses into a sink (none, gzip via zlib's deflate with a gzip wrapper, or zstd via
// ZSTD_compressStream2). The mirror image of input_stream.h.
//
// Thread safety: each object is used by one thread at a time.
#ifndef FRAGSCOPE_SOURCES_TRACE_OUTPUT_STREAM_H_
#define FRAGSCOPE_SOURCES_TRACE_OUTPUT_STREAM_H_

#include <memory>
#include <string>
#include <string_view>

#include "common/safe_file.h"
#include "fragscope/status.h"
#include "fragscope/trace.h"

namespace fragscope::sources {

class ByteSink {
 public:
  virtual ~ByteSink() = default;
  /// Writes all of `data`; kIoError when the operating system refuses.
  virtual Status Write(std::string_view data) = 0;
  /// Flushes and closes; the sink accepts no more writes.
  virtual Status Close() = 0;
};

/// A file written through a SafeFile (common/safe_file.h): bytes go to a new temporary next to
/// `path`, and Close() renames it onto `path`; a sink destroyed before Close() leaves nothing.
/// Errors name the path; a refused target (a link, see SafeFile) is kInvalidArgument.
Result<std::unique_ptr<ByteSink>> CreateFileSink(const std::string& path, OutputOrigin origin);
/// Appends to *out. REQUIRES: out outlives the sink.
std::unique_ptr<ByteSink> StringSink(std::string* out);

/// Compresses what is written to it into a sink.
class OutputStream {
 public:
  virtual ~OutputStream() = default;
  static Result<std::unique_ptr<OutputStream>> Create(Compression compression,
                                                      std::unique_ptr<ByteSink> sink);
  virtual Status Write(std::string_view data) = 0;
  /// Ends the compressed stream (gzip trailer, zstd frame end) and closes the sink.
  virtual Status Finish() = 0;
};

/// Compresses `data` in one go (tests, fixtures).
Result<std::string> Compress(Compression compression, std::string_view data);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_TRACE_OUTPUT_STREAM_H_
