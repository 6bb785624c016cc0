#include "sources/trace/output_stream.h"

#include <zlib.h>
#include <zstd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "sources/trace/input_stream.h"

namespace fragscope::sources {

// ---- Sinks ----------------------------------------------------------------------------------

namespace {

// Commits the SafeFile on Close(): the sink is closed only at the end of a complete output.
class FileSink final : public ByteSink {
 public:
  explicit FileSink(std::unique_ptr<SafeFile> file) : file_(std::move(file)) {}

  Status Write(std::string_view data) override { return file_->Write(data); }
  Status Close() override { return file_->Commit(); }

 private:
  std::unique_ptr<SafeFile> file_;
};

class StringSinkImpl final : public ByteSink {
 public:
  explicit StringSinkImpl(std::string* out) : out_(out) {}
  Status Write(std::string_view data) override {
    out_->append(data);
    return Status::Ok();
  }
  Status Close() override { return Status::Ok(); }

 private:
  std::string* out_;
};

}  // namespace

Result<std::unique_ptr<ByteSink>> CreateFileSink(const std::string& path, OutputOrigin origin) {
  Result<std::unique_ptr<SafeFile>> file = SafeFile::Create(path, origin);
  if (!file.ok()) return file.status();
  return std::unique_ptr<ByteSink>(new FileSink(std::move(*file)));
}

std::unique_ptr<ByteSink> StringSink(std::string* out) {
  return std::make_unique<StringSinkImpl>(out);
}

// ---- Encoders -------------------------------------------------------------------------------

namespace {

// Compressed output is handed to the sink in pieces of at most this size.
constexpr std::size_t kOutputChunkBytes = std::size_t{256} << 10;

class PlainOutput final : public OutputStream {
 public:
  explicit PlainOutput(std::unique_ptr<ByteSink> sink) : sink_(std::move(sink)) {}
  Status Write(std::string_view data) override { return sink_->Write(data); }
  Status Finish() override { return sink_->Close(); }

 private:
  std::unique_ptr<ByteSink> sink_;
};

class GzipOutput final : public OutputStream {
 public:
  explicit GzipOutput(std::unique_ptr<ByteSink> sink)
      : sink_(std::move(sink)), out_buf_(new char[kOutputChunkBytes]) {}
  ~GzipOutput() override {
    if (initialized_) deflateEnd(&zs_);
  }
  GzipOutput(const GzipOutput&) = delete;
  GzipOutput& operator=(const GzipOutput&) = delete;

  Status Init() {
    std::memset(&zs_, 0, sizeof(zs_));
    // 16 + MAX_WBITS: write a gzip header and trailer. The function behind the deflateInit2
    // macro is called directly because the macro casts C-style.
    if (deflateInit2_(&zs_, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                      Z_DEFAULT_STRATEGY, ZLIB_VERSION,
                      static_cast<int>(sizeof(z_stream))) != Z_OK) {
      return Status::Internal("cannot initialise zlib");
    }
    initialized_ = true;
    return Status::Ok();
  }

  Status Write(std::string_view data) override {
    while (!data.empty()) {
      // zlib counts in uInt; feed huge writes in pieces.
      std::size_t piece = std::min<std::size_t>(data.size(), kStreamBufferBytes);
      FRAGSCOPE_RETURN_IF_ERROR(Deflate(data.substr(0, piece), Z_NO_FLUSH));
      data.remove_prefix(piece);
    }
    return Status::Ok();
  }
  Status Finish() override {
    FRAGSCOPE_RETURN_IF_ERROR(Deflate({}, Z_FINISH));
    return sink_->Close();
  }

 private:
  Status Deflate(std::string_view data, int flush) {
    // zlib does not write through next_in; the cast only satisfies its pre-const API.
    zs_.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    zs_.avail_in = static_cast<uInt>(data.size());
    for (;;) {
      zs_.next_out = reinterpret_cast<Bytef*>(out_buf_.get());
      zs_.avail_out = static_cast<uInt>(kOutputChunkBytes);
      int rc = deflate(&zs_, flush);
      if (rc == Z_STREAM_ERROR) return Status::Internal("zlib deflate failed");
      std::size_t produced = kOutputChunkBytes - zs_.avail_out;
      if (produced > 0) {
        FRAGSCOPE_RETURN_IF_ERROR(sink_->Write(std::string_view(out_buf_.get(), produced)));
      }
      if (flush == Z_FINISH ? rc == Z_STREAM_END : (zs_.avail_in == 0 && zs_.avail_out != 0)) {
        return Status::Ok();
      }
    }
  }

  std::unique_ptr<ByteSink> sink_;
  z_stream zs_;
  bool initialized_ = false;
  std::unique_ptr<char[]> out_buf_;
};

class ZstdOutput final : public OutputStream {
 public:
  explicit ZstdOutput(std::unique_ptr<ByteSink> sink)
      : sink_(std::move(sink)), cctx_(ZSTD_createCCtx()), out_buf_(new char[kOutputChunkBytes]) {}
  ~ZstdOutput() override { ZSTD_freeCCtx(cctx_); }
  ZstdOutput(const ZstdOutput&) = delete;
  ZstdOutput& operator=(const ZstdOutput&) = delete;

  Status Init() {
    if (cctx_ == nullptr) return Status::Internal("cannot create a zstd encoder");
    // Level 3 is zstd's default; the checksum lets readers detect corrupted files.
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_compressionLevel, 3);
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_checksumFlag, 1);
    // zstd compresses on a worker thread of its own while this one makes the next data (a
    // converted trace on two cores: 2.85 -> 1.6 s; on one core no slower, docs/benchmarks.md).
    // Always one worker, whatever the machine: zstd's single- and multi-threaded modes write
    // different bytes, and the same input should give the same file everywhere. A libzstd
    // built without threads refuses the parameter and compresses here, with the same format.
    ZSTD_CCtx_setParameter(cctx_, ZSTD_c_nbWorkers, 1);
    return Status::Ok();
  }

  Status Write(std::string_view data) override { return Compress(data, ZSTD_e_continue); }
  Status Finish() override {
    FRAGSCOPE_RETURN_IF_ERROR(Compress({}, ZSTD_e_end));
    return sink_->Close();
  }

 private:
  Status Compress(std::string_view data, ZSTD_EndDirective mode) {
    ZSTD_inBuffer in{data.data(), data.size(), 0};
    for (;;) {
      ZSTD_outBuffer out{out_buf_.get(), kOutputChunkBytes, 0};
      std::size_t remaining = ZSTD_compressStream2(cctx_, &out, &in, mode);
      if (ZSTD_isError(remaining)) {
        return Status::Internal(std::string("zstd compression failed: ") +
                                ZSTD_getErrorName(remaining));
      }
      if (out.pos > 0) {
        FRAGSCOPE_RETURN_IF_ERROR(
            sink_->Write(std::string_view(static_cast<const char*>(out.dst), out.pos)));
      }
      bool done = mode == ZSTD_e_end ? remaining == 0 : in.pos == in.size;
      if (done) return Status::Ok();
    }
  }

  std::unique_ptr<ByteSink> sink_;
  ZSTD_CCtx* cctx_;
  std::unique_ptr<char[]> out_buf_;
};

}  // namespace

Result<std::unique_ptr<OutputStream>> OutputStream::Create(Compression compression,
                                                           std::unique_ptr<ByteSink> sink) {
  switch (compression) {
    case Compression::kGzip: {
      auto out = std::make_unique<GzipOutput>(std::move(sink));
      FRAGSCOPE_RETURN_IF_ERROR(out->Init());
      return std::unique_ptr<OutputStream>(std::move(out));
    }
    case Compression::kZstd: {
      auto out = std::make_unique<ZstdOutput>(std::move(sink));
      FRAGSCOPE_RETURN_IF_ERROR(out->Init());
      return std::unique_ptr<OutputStream>(std::move(out));
    }
    case Compression::kNone:
      break;
  }
  return std::unique_ptr<OutputStream>(new PlainOutput(std::move(sink)));
}

Result<std::string> Compress(Compression compression, std::string_view data) {
  std::string out;
  Result<std::unique_ptr<OutputStream>> stream =
      OutputStream::Create(compression, StringSink(&out));
  if (!stream.ok()) return stream.status();
  FRAGSCOPE_RETURN_IF_ERROR((*stream)->Write(data));
  FRAGSCOPE_RETURN_IF_ERROR((*stream)->Finish());
  return out;
}

}  // namespace fragscope::sources
