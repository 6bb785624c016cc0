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
Result<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path);
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
