// Byte input for the trace reader, in three layers:
//   ByteSource  - raw bytes from a file or from memory;
//   InputStream - the decoded bytes of a ByteSource that holds plain text, gzip (one or more
//                 concatenated members) or zstd (one or more frames), told apart by magic bytes;
//   LineReader  - splits an InputStream into lines, refusing any line longer than a limit
//                 without ever buffering more than that limit.
// Memory is bounded by the line limit plus fixed buffers (kStreamBufferBytes each), never by the
// size of the input.
//
// Thread safety: each object is used by one thread at a time.
#ifndef FRAGSCOPE_SOURCES_TRACE_INPUT_STREAM_H_
#define FRAGSCOPE_SOURCES_TRACE_INPUT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "fragscope/status.h"
#include "fragscope/trace.h"

namespace fragscope::sources {

/// Size of the read buffers (raw input of a decoder, and the line buffer's initial size).
/// Big reads keep syscalls and decoder calls off the per-line path. Smaller inputs and line
/// limits get smaller buffers.
inline constexpr std::size_t kStreamBufferBytes = std::size_t{1} << 20;  // 1 MiB

/// Raw bytes: a file or a string in memory.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  /// Reads up to `n` bytes into `buf`. Returns 0 only at the end of the input; kIoError when the
  /// operating system refuses (the message does not name the source: callers add that).
  virtual Result<std::size_t> Read(char* buf, std::size_t n) = 0;
  /// The total size in bytes when known (regular files, memory), 0 otherwise (pipes).
  virtual std::uint64_t size_bytes() const = 0;
};

/// Opens a file for reading. kNotFound when it does not exist, kIoError otherwise (a directory,
/// no permission); messages start with the path.
///
/// Special inputs (issue 24 item 5): "-" is standard input, and an input that is not a regular
/// file (a pipe, a FIFO, /dev/stdin, process substitution's /dev/fd/N, a device) is a *stream*:
/// it is opened once per process, and every later OpenFileSource of the same path reads the
/// same bytes again from a buffer (the first kStreamSpoolBytes of it) and then continues where
/// the stream is, never by reopening or seeking it. So a command may look at an input's first
/// bytes (DetectInputKind) and then read it whole. Reading a stream again past what the buffer
/// kept is kUnimplemented ("... save it to a file first"). A stream is read up to
/// StreamInputLimit() bytes; more is kLimitExceeded, naming the limit and --max-input-bytes, so
/// an endless input (/dev/zero, `yes`) ends. Regular files are opened anew each time, have no
/// such limit (their size is known) and may be read any number of times.
Result<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path);

/// How much of a stream's beginning is kept to be read again (the default of a stream's limit
/// is far above it: a stream read once is never held in memory whole).
inline constexpr std::size_t kStreamSpoolBytes = std::size_t{32} << 20;  // 32 MiB
/// The default limit of the bytes read from one stream (--max-input-bytes).
inline constexpr std::uint64_t kDefaultStreamInputBytes = std::uint64_t{256} << 20;  // 256 MiB
/// The process-wide limit on the bytes read from one stream (CLI: --max-input-bytes). Set before
/// the first OpenFileSource; REQUIRES: bytes > 0.
void SetStreamInputLimit(std::uint64_t bytes);
std::uint64_t StreamInputLimit();

/// Reads the whole input at `path` (OpenFileSource's rules: "-", streams) as raw bytes, refusing
/// more than `max_bytes` with kLimitExceeded "path: larger than N (what)". For small files read
/// whole (configurations, samples). Errors start with the path.
Result<std::string> ReadWholeInput(const std::string& path, std::size_t max_bytes,
                                   std::string_view what);

/// Forgets the streams opened so far (tests only: a stream stays open until the process ends).
void ResetStreamsForTesting();
/// A source over `bytes`, which it owns.
std::unique_ptr<ByteSource> MemorySource(std::string bytes);

/// The decoded content of a ByteSource. Compression is detected from the first bytes: gzip
/// (1f 8b), zstd (28 b5 2f fd, or a skippable frame), else plain. File names play no part.
class InputStream {
 public:
  virtual ~InputStream() = default;

  /// Reads the first bytes of `source` to detect its compression. Fails (kCorruption) only for
  /// a format we recognise but do not read (xz, bzip2, lz4), or when the source fails.
  static Result<std::unique_ptr<InputStream>> Open(std::unique_ptr<ByteSource> source);

  /// Reads up to `n` (> 0) decoded bytes. Returns 0 only at a clean end of input: the end of a
  /// complete gzip member or zstd frame for compressed input. A compressed input that ends
  /// inside a member/frame is kCorruption ("truncated gzip stream ..."), as is corrupt data;
  /// messages give the compressed byte offset and do not name the source.
  virtual Result<std::size_t> Read(char* buf, std::size_t n) = 0;

  virtual Compression compression() const = 0;

  /// Bytes of the raw (possibly compressed) source read so far, and its size if known (else 0).
  std::uint64_t raw_bytes_consumed() const { return raw_consumed_; }
  std::uint64_t raw_bytes_total() const { return raw_total_; }

 protected:
  InputStream(std::unique_ptr<ByteSource> source, std::string prefix);
  /// Reads raw bytes: first what detection already read, then from the source.
  Result<std::size_t> ReadRaw(char* buf, std::size_t n);
  /// How big a decoder's raw input buffer should be: kStreamBufferBytes, or less for a
  /// smaller input of known size.
  std::size_t RawBufferBytes() const;

 private:
  std::unique_ptr<ByteSource> source_;
  std::string prefix_;  // the bytes Open() read to detect the format, not yet handed out
  std::size_t prefix_pos_ = 0;
  std::uint64_t raw_consumed_ = 0;
  std::uint64_t raw_total_ = 0;
};

/// Splits an InputStream into lines. A line ends at "\n"; a "\r" before it is dropped (CRLF
/// files), and the last line needs no "\n".
class LineReader {
 public:
  /// REQUIRES: max_line_bytes > 0.
  LineReader(std::unique_ptr<InputStream> input, std::size_t max_line_bytes);

  /// Sets *line to the next line without its terminator and returns true, or returns false at
  /// the end of the input. The view stays valid until the next call. A line longer than
  /// max_line_bytes is kLimitExceeded, detected after buffering at most max_line_bytes + 2
  /// bytes of it. Errors do not name a location: line_number() is the line being read.
  Result<bool> Next(std::string_view* line);

  /// 1-based number of the line last returned, or of the line whose reading failed.
  std::uint64_t line_number() const { return line_number_; }
  const InputStream& input() const { return *input_; }

 private:
  Status Fill();  // makes room in the buffer (compact/grow) and reads more input

  std::unique_ptr<InputStream> input_;
  std::size_t max_line_bytes_;
  std::unique_ptr<char[]> buf_;
  std::size_t capacity_ = 0;
  std::size_t begin_ = 0;  // start of the unread data
  std::size_t scan_ = 0;   // [begin_, scan_) is known to hold no '\n'
  std::size_t end_ = 0;    // end of the valid data
  bool eof_ = false;
  std::uint64_t line_number_ = 0;
};

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_TRACE_INPUT_STREAM_H_
