#include "sources/trace/input_stream.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include <fmt/format.h>
#include <sys/stat.h>

#include "common/units.h"

namespace fragscope::sources {

// ---- Byte sources ---------------------------------------------------------------------------

namespace {

class FileSource final : public ByteSource {
 public:
  FileSource(int fd, std::uint64_t size) : fd_(fd), size_(size) {}
  ~FileSource() override { ::close(fd_); }
  FileSource(const FileSource&) = delete;
  FileSource& operator=(const FileSource&) = delete;

  Result<std::size_t> Read(char* buf, std::size_t n) override {
    for (;;) {
      ssize_t got = ::read(fd_, buf, n);
      if (got >= 0) return static_cast<std::size_t>(got);
      if (errno == EINTR) continue;
      return Status::IoError(std::string("read failed: ") + std::strerror(errno));
    }
  }
  std::uint64_t size_bytes() const override { return size_; }

 private:
  int fd_;
  std::uint64_t size_;
};

class StringSource final : public ByteSource {
 public:
  explicit StringSource(std::string bytes) : bytes_(std::move(bytes)) {}
  Result<std::size_t> Read(char* buf, std::size_t n) override {
    std::size_t take = std::min(n, bytes_.size() - pos_);
    std::memcpy(buf, bytes_.data() + pos_, take);
    pos_ += take;
    return take;
  }
  std::uint64_t size_bytes() const override { return bytes_.size(); }

 private:
  std::string bytes_;
  std::size_t pos_ = 0;
};

}  // namespace

// ---- Streams: inputs read once --------------------------------------------------------------

namespace {

std::atomic<std::uint64_t> g_stream_limit{kDefaultStreamInputBytes};

// One stream (a pipe, FIFO, device or standard input), shared by every source opened on its
// path. `spool` holds the stream's first bytes while `spooling`; afterwards it stays the prefix
// it was, and only the reader that is where the stream is can go on.
struct Stream {
  int fd = -1;
  bool own_fd = true;    // false for standard input, which is never closed
  bool regular = false;  // "-" redirected from a regular file: its size is known, no limit
  std::uint64_t size = 0;
  std::string spool;
  bool spooling = true;
  std::uint64_t consumed = 0;  // bytes read from fd so far
  bool eof = false;            // a read returned 0: never read again (a terminal would wait)
  ~Stream() {
    if (own_fd && fd >= 0) ::close(fd);
  }
};

std::mutex g_streams_mu;
std::map<std::string, std::shared_ptr<Stream>>& Streams() {
  static auto* streams = new std::map<std::string, std::shared_ptr<Stream>>();
  return *streams;
}

class StreamSource final : public ByteSource {
 public:
  explicit StreamSource(std::shared_ptr<Stream> stream) : stream_(std::move(stream)) {}

  Result<std::size_t> Read(char* buf, std::size_t n) override {
    Stream& s = *stream_;
    if (pos_ < s.spool.size()) {
      const std::size_t take = std::min<std::size_t>(n, s.spool.size() - pos_);
      std::memcpy(buf, s.spool.data() + pos_, take);
      pos_ += take;
      return take;
    }
    if (pos_ != s.consumed) {
      return Status::Unimplemented(fmt::format(
          "this input is a stream (a pipe, FIFO or standard input) and can be read only once, "
          "but this command reads it again after its first {}: save it to a file first",
          FormatBytes(s.spool.size())));
    }
    if (s.eof) return std::size_t{0};
    const std::uint64_t limit = g_stream_limit.load();
    ssize_t got;
    do {
      got = ::read(s.fd, buf, n);
    } while (got < 0 && errno == EINTR);
    if (got < 0) return Status::IoError(std::string("read failed: ") + std::strerror(errno));
    const auto bytes = static_cast<std::size_t>(got);
    if (bytes == 0 && n > 0) s.eof = true;
    const bool over = !s.regular && s.consumed + bytes > limit;
    if (s.spooling && !over && s.spool.size() + bytes <= kStreamSpoolBytes) {
      s.spool.append(buf, bytes);
    } else {
      s.spooling = false;
    }
    // Counted even when refused: the bytes are gone from the stream, and every later read of
    // it is refused too.
    s.consumed += bytes;
    pos_ += bytes;
    if (over) {
      return Status::LimitExceeded(fmt::format(
          "read more than {} from a stream (a pipe, FIFO, device or standard input, whose end is "
          "unknown) without reaching its end: the limit is --max-input-bytes (default {}); "
          "raise it for a longer stream, or save the input to a file",
          FormatBytes(limit), FormatBytes(kDefaultStreamInputBytes)));
    }
    return bytes;
  }
  std::uint64_t size_bytes() const override { return stream_->size; }

 private:
  std::shared_ptr<Stream> stream_;
  std::uint64_t pos_ = 0;
};

}  // namespace

void SetStreamInputLimit(std::uint64_t bytes) { g_stream_limit.store(bytes); }
std::uint64_t StreamInputLimit() { return g_stream_limit.load(); }

void ResetStreamsForTesting() {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  Streams().clear();
}

Result<std::unique_ptr<ByteSource>> OpenFileSource(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_streams_mu);
  if (auto it = Streams().find(path); it != Streams().end()) {
    return std::unique_ptr<ByteSource>(new StreamSource(it->second));
  }
  const bool standard_input = path == "-";
  int fd = standard_input ? STDIN_FILENO : ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IoError(path + ": cannot open: " + std::strerror(err));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    if (!standard_input) ::close(fd);
    return Status::IoError(path + ": cannot stat: " + std::strerror(err));
  }
  if (S_ISDIR(st.st_mode)) {
    if (!standard_input) ::close(fd);
    return Status::IoError(path + ": is a directory");
  }
  if (standard_input || !S_ISREG(st.st_mode)) {
    auto stream = std::make_shared<Stream>();
    stream->fd = fd;
    stream->own_fd = !standard_input;
    stream->regular = S_ISREG(st.st_mode);
    stream->size = stream->regular ? static_cast<std::uint64_t>(st.st_size) : 0;
    Streams().emplace(path, stream);
    return std::unique_ptr<ByteSource>(new StreamSource(std::move(stream)));
  }
  std::uint64_t size = static_cast<std::uint64_t>(st.st_size);
  // A hint only: the kernel may read ahead more aggressively.
  (void)::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  return std::unique_ptr<ByteSource>(new FileSource(fd, size));
}

Result<std::string> ReadWholeInput(const std::string& path, std::size_t max_bytes,
                                   std::string_view what) {
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource(path);
  if (!source.ok()) return source.status();
  std::string out;
  char buf[64 * 1024];
  for (;;) {
    Result<std::size_t> got = (*source)->Read(buf, sizeof buf);
    if (!got.ok()) return got.status().WithPrefix(path);
    if (*got == 0) return out;
    if (out.size() + *got > max_bytes) {
      return Status::LimitExceeded(
          fmt::format("{}: larger than {} ({})", path, FormatBytes(max_bytes), what));
    }
    out.append(buf, *got);
  }
}

std::unique_ptr<ByteSource> MemorySource(std::string bytes) {
  return std::make_unique<StringSource>(std::move(bytes));
}

// ---- InputStream: common part ---------------------------------------------------------------

InputStream::InputStream(std::unique_ptr<ByteSource> source, std::string prefix)
    : source_(std::move(source)),
      prefix_(std::move(prefix)),
      raw_consumed_(prefix_.size()),
      raw_total_(source_->size_bytes()) {}

Result<std::size_t> InputStream::ReadRaw(char* buf, std::size_t n) {
  if (prefix_pos_ < prefix_.size()) {
    std::size_t take = std::min(n, prefix_.size() - prefix_pos_);
    std::memcpy(buf, prefix_.data() + prefix_pos_, take);
    prefix_pos_ += take;
    return take;
  }
  Result<std::size_t> got = source_->Read(buf, n);
  if (got.ok()) raw_consumed_ += *got;
  return got;
}

std::size_t InputStream::RawBufferBytes() const {
  // A small input (in memory, or a small file) needs no more than its own size.
  if (raw_total_ > 0 && raw_total_ < kStreamBufferBytes)
    return static_cast<std::size_t>(raw_total_);
  return kStreamBufferBytes;
}

namespace {

// ---- Plain ----------------------------------------------------------------------------------

class PlainStream final : public InputStream {
 public:
  PlainStream(std::unique_ptr<ByteSource> source, std::string prefix)
      : InputStream(std::move(source), std::move(prefix)) {}
  Result<std::size_t> Read(char* buf, std::size_t n) override { return ReadRaw(buf, n); }
  Compression compression() const override { return Compression::kNone; }
};

// ---- gzip -----------------------------------------------------------------------------------

// Decodes one or more concatenated gzip members (what `cat a.gz b.gz` and pigz produce; gzip(1)
// reads them as one stream, so we do too).
class GzipStream final : public InputStream {
 public:
  GzipStream(std::unique_ptr<ByteSource> source, std::string prefix)
      : InputStream(std::move(source), std::move(prefix)),
        in_capacity_(RawBufferBytes()),
        in_buf_(new char[in_capacity_]) {}
  ~GzipStream() override {
    if (initialized_) inflateEnd(&zs_);
  }
  GzipStream(const GzipStream&) = delete;
  GzipStream& operator=(const GzipStream&) = delete;

  Status Init() {
    std::memset(&zs_, 0, sizeof(zs_));
    // 16 + MAX_WBITS: expect a gzip wrapper (header and CRC-32/ISIZE trailer) around deflate.
    // The function behind the inflateInit2 macro is called directly: the macro casts C-style.
    if (inflateInit2_(&zs_, 16 + MAX_WBITS, ZLIB_VERSION, static_cast<int>(sizeof(z_stream))) !=
        Z_OK) {
      return Status::Internal("cannot initialise zlib");
    }
    initialized_ = true;
    return Status::Ok();
  }

  Result<std::size_t> Read(char* buf, std::size_t n) override {
    zs_.next_out = reinterpret_cast<Bytef*>(buf);
    zs_.avail_out = static_cast<uInt>(std::min<std::size_t>(n, UINT32_MAX));
    const uInt want = zs_.avail_out;
    while (zs_.avail_out == want) {
      if (zs_.avail_in == 0) {
        if (!eof_) {
          FRAGSCOPE_RETURN_IF_ERROR(FillInput());
          continue;
        }
        if (in_member_) {
          return Status::Corruption("truncated gzip stream: the input ends inside a gzip member (" +
                                    std::to_string(raw_bytes_consumed()) + " compressed bytes)");
        }
        break;  // clean end after a complete member
      }
      if (!in_member_) {
        // More bytes after a complete member: they must form another member.
        inflateReset(&zs_);
        in_member_ = true;
      }
      const uInt avail_in_before = zs_.avail_in;
      int rc = inflate(&zs_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_member_ = false;
      } else if (rc == Z_BUF_ERROR) {
        // No progress was possible; only legitimate when all input was used up.
        if (zs_.avail_in != 0 && zs_.avail_in == avail_in_before) {
          return Status::Internal("zlib made no progress decoding gzip data");
        }
      } else if (rc != Z_OK) {
        std::uint64_t offset = raw_bytes_consumed() - zs_.avail_in;
        return Status::Corruption(
            "corrupt gzip stream near compressed byte " + std::to_string(offset) + ": " +
            (zs_.msg != nullptr ? zs_.msg : "zlib error " + std::to_string(rc)));
      }
    }
    return static_cast<std::size_t>(want - zs_.avail_out);
  }
  Compression compression() const override { return Compression::kGzip; }

 private:
  Status FillInput() {
    Result<std::size_t> got = ReadRaw(in_buf_.get(), in_capacity_);
    if (!got.ok()) return got.status();
    if (*got == 0) eof_ = true;
    zs_.next_in = reinterpret_cast<Bytef*>(in_buf_.get());
    zs_.avail_in = static_cast<uInt>(*got);
    return Status::Ok();
  }

  z_stream zs_;
  bool initialized_ = false;
  bool in_member_ = true;  // inside a member that has not reached its trailer yet
  bool eof_ = false;
  std::size_t in_capacity_;
  std::unique_ptr<char[]> in_buf_;
};

// ---- zstd -----------------------------------------------------------------------------------

// Decodes one or more zstd frames (skippable frames included). zstd's default window limit
// (ZSTD_WINDOWLOG_LIMIT_DEFAULT, 128 MiB) bounds the decoder's memory; frames written with
// --long=28 or more are refused with zstd's "Frame requires too much memory" error.
class ZstdStream final : public InputStream {
 public:
  ZstdStream(std::unique_ptr<ByteSource> source, std::string prefix)
      : InputStream(std::move(source), std::move(prefix)),
        dctx_(ZSTD_createDCtx()),
        in_capacity_(RawBufferBytes()),
        in_buf_(new char[in_capacity_]) {}
  ~ZstdStream() override { ZSTD_freeDCtx(dctx_); }
  ZstdStream(const ZstdStream&) = delete;
  ZstdStream& operator=(const ZstdStream&) = delete;

  Status Init() {
    if (dctx_ == nullptr) return Status::Internal("cannot create a zstd decoder");
    return Status::Ok();
  }

  Result<std::size_t> Read(char* buf, std::size_t n) override {
    ZSTD_outBuffer out{buf, n, 0};
    while (out.pos == 0) {
      if (in_.pos == in_.size && !eof_) {
        FRAGSCOPE_RETURN_IF_ERROR(FillInput());
        continue;
      }
      // At the end of the input: done if the last frame was complete. Otherwise let zstd flush
      // what it still holds; if it cannot produce anything, the frame was cut short.
      if (in_.pos == in_.size && frame_remaining_ == 0) break;
      std::size_t ret = ZSTD_decompressStream(dctx_, &out, &in_);
      if (ZSTD_isError(ret)) {
        std::uint64_t offset = raw_bytes_consumed() - (in_.size - in_.pos);
        return Status::Corruption("corrupt zstd stream near compressed byte " +
                                  std::to_string(offset) + ": " + ZSTD_getErrorName(ret));
      }
      frame_remaining_ = ret;
      if (eof_ && in_.pos == in_.size && out.pos == 0 && ret != 0) {
        return Status::Corruption("truncated zstd stream: the input ends inside a zstd frame (" +
                                  std::to_string(raw_bytes_consumed()) + " compressed bytes)");
      }
    }
    return out.pos;
  }
  Compression compression() const override { return Compression::kZstd; }

 private:
  Status FillInput() {
    Result<std::size_t> got = ReadRaw(in_buf_.get(), in_capacity_);
    if (!got.ok()) return got.status();
    if (*got == 0) eof_ = true;
    in_ = ZSTD_inBuffer{in_buf_.get(), *got, 0};
    return Status::Ok();
  }

  ZSTD_DCtx* dctx_;
  ZSTD_inBuffer in_{nullptr, 0, 0};
  // ZSTD_decompressStream's last return: 0 at a frame boundary, else the frame is incomplete.
  // Starts non-zero: detection saw a frame magic, so an input of just that is truncated.
  std::size_t frame_remaining_ = 1;
  bool eof_ = false;
  std::size_t in_capacity_;
  std::unique_ptr<char[]> in_buf_;
};

bool StartsWith(std::string_view bytes, std::string_view magic) {
  return bytes.size() >= magic.size() && bytes.substr(0, magic.size()) == magic;
}

}  // namespace

Result<std::unique_ptr<InputStream>> InputStream::Open(std::unique_ptr<ByteSource> source) {
  // Read up to 6 bytes (the longest magic we test); sources may return short reads.
  constexpr std::size_t kMagicBytes = 6;
  std::string prefix(kMagicBytes, '\0');
  std::size_t have = 0;
  while (have < kMagicBytes) {
    Result<std::size_t> got = source->Read(prefix.data() + have, kMagicBytes - have);
    if (!got.ok()) return got.status();
    if (*got == 0) break;
    have += *got;
  }
  prefix.resize(have);

  if (StartsWith(prefix, "\x1f\x8b")) {
    auto stream = std::make_unique<GzipStream>(std::move(source), std::move(prefix));
    FRAGSCOPE_RETURN_IF_ERROR(stream->Init());
    return std::unique_ptr<InputStream>(std::move(stream));
  }
  // zstd frame magic 0xFD2FB528 and skippable frames 0x184D2A50..5F, little-endian.
  bool zstd_skippable = prefix.size() >= 4 &&
                        (static_cast<unsigned char>(prefix[0]) & 0xF0) == 0x50 &&
                        prefix.substr(1, 3) == "\x2a\x4d\x18";
  if (StartsWith(prefix, "\x28\xb5\x2f\xfd") || zstd_skippable) {
    auto stream = std::make_unique<ZstdStream>(std::move(source), std::move(prefix));
    FRAGSCOPE_RETURN_IF_ERROR(stream->Init());
    return std::unique_ptr<InputStream>(std::move(stream));
  }
  // Formats people compress logs with that we do not read: say so instead of "not JSON".
  const char* other = nullptr;
  if (StartsWith(prefix, std::string_view("\xfd"
                                          "7zXZ\0",
                                          6)))
    other = "xz";
  if (StartsWith(prefix, "BZh")) other = "bzip2";
  if (StartsWith(prefix, "\x04\x22\x4d\x18")) other = "lz4";
  if (other != nullptr) {
    return Status::Corruption(std::string(other) +
                              "-compressed input is not supported (plain, gzip or zstd only)");
  }
  return std::unique_ptr<InputStream>(new PlainStream(std::move(source), std::move(prefix)));
}

// ---- LineReader -----------------------------------------------------------------------------

namespace {
// The line buffer starts at 1 MiB (big reads), or smaller when the line limit is small: it
// must only hold one line, and small buffers make each of the fuzzer's inputs cheap.
std::size_t InitialLineBufferBytes(std::size_t max_line_bytes) {
  constexpr std::size_t kMinBytes = std::size_t{64} << 10;
  if (max_line_bytes >= kStreamBufferBytes) return kStreamBufferBytes;
  return std::max(kMinBytes, max_line_bytes + 2);
}
}  // namespace

LineReader::LineReader(std::unique_ptr<InputStream> input, std::size_t max_line_bytes)
    : input_(std::move(input)),
      max_line_bytes_(max_line_bytes),
      buf_(new char[InitialLineBufferBytes(max_line_bytes)]),
      capacity_(InitialLineBufferBytes(max_line_bytes)) {}

Result<bool> LineReader::Next(std::string_view* line) {
  ++line_number_;
  for (;;) {
    const void* nl = std::memchr(buf_.get() + scan_, '\n', end_ - scan_);
    std::size_t line_end;
    if (nl != nullptr) {
      line_end = static_cast<std::size_t>(static_cast<const char*>(nl) - buf_.get());
      scan_ = line_end + 1;
    } else {
      scan_ = end_;
      // The pending bytes may still end in the "\r" of a CRLF, hence one byte of slack.
      std::size_t pending = end_ - begin_;
      if (pending > max_line_bytes_ && pending - max_line_bytes_ > 1) {
        return Status::LimitExceeded("line is longer than the limit of " +
                                     std::to_string(max_line_bytes_) + " bytes (max_line_bytes)");
      }
      if (!eof_) {
        FRAGSCOPE_RETURN_IF_ERROR(Fill());
        continue;
      }
      if (begin_ == end_) {  // clean end; a final "\n" does not start another line
        --line_number_;
        return false;
      }
      line_end = end_;  // the last line has no "\n"
      scan_ = end_;
    }
    std::size_t start = begin_;
    begin_ = scan_;
    std::size_t len = line_end - start;
    if (len > 0 && buf_[start + len - 1] == '\r') --len;
    if (len > max_line_bytes_) {
      return Status::LimitExceeded("line is longer than the limit of " +
                                   std::to_string(max_line_bytes_) + " bytes (max_line_bytes)");
    }
    *line = std::string_view(buf_.get() + start, len);
    return true;
  }
}

Status LineReader::Fill() {
  if (end_ == capacity_) {
    std::size_t pending = end_ - begin_;
    if (begin_ > 0) {
      // Move the partial line to the front; lines are short, so this is cheap.
      std::memmove(buf_.get(), buf_.get() + begin_, pending);
    } else {
      // One line fills the buffer: grow, but never beyond what Next()'s limit check needs to
      // see (max_line_bytes + "\r" + one byte). Next() has checked pending <= max + 1, so
      // the new capacity is larger than the old one.
      std::size_t needed = max_line_bytes_ > SIZE_MAX - 2 ? SIZE_MAX : max_line_bytes_ + 2;
      std::size_t grown = capacity_ > SIZE_MAX / 2 ? needed : std::min(capacity_ * 2, needed);
      std::unique_ptr<char[]> bigger(new char[grown]);
      std::memcpy(bigger.get(), buf_.get(), pending);
      buf_ = std::move(bigger);
      capacity_ = grown;
    }
    begin_ = 0;
    scan_ = pending;
    end_ = pending;
  }
  Result<std::size_t> got = input_->Read(buf_.get() + end_, capacity_ - end_);
  if (!got.ok()) return got.status();
  if (*got == 0) eof_ = true;
  end_ += *got;
  return Status::Ok();
}

}  // namespace fragscope::sources
