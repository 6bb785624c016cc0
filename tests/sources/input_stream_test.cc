#include "sources/trace/input_stream.h"

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <utility>

#include <gtest/gtest.h>

#include "sources/trace/output_stream.h"
#include "testing/test_util.h"

namespace fragscope::sources {
namespace {

// Hands out at most `chunk` bytes per Read, as pipes and sockets do.
class TrickleSource final : public ByteSource {
 public:
  TrickleSource(std::string bytes, std::size_t chunk) : bytes_(std::move(bytes)), chunk_(chunk) {}
  Result<std::size_t> Read(char* buf, std::size_t n) override {
    std::size_t take = std::min({n, chunk_, bytes_.size() - pos_});
    bytes_.copy(buf, take, pos_);
    pos_ += take;
    return take;
  }
  std::uint64_t size_bytes() const override { return 0; }

 private:
  std::string bytes_;
  std::size_t chunk_;
  std::size_t pos_ = 0;
};

class FailingSource final : public ByteSource {
 public:
  Result<std::size_t> Read(char*, std::size_t) override {
    return Status::IoError("read failed: disk on fire");
  }
  std::uint64_t size_bytes() const override { return 0; }
};

std::string Compressed(Compression c, std::string_view data) {
  Result<std::string> out = Compress(c, data);
  EXPECT_TRUE(out.ok()) << out.status().ToString();
  return out.ok() ? *out : std::string();
}

std::unique_ptr<InputStream> OpenOrDie(std::unique_ptr<ByteSource> source) {
  Result<std::unique_ptr<InputStream>> in = InputStream::Open(std::move(source));
  EXPECT_TRUE(in.ok()) << in.status().ToString();
  return in.ok() ? std::move(*in) : nullptr;
}

// Decodes everything; returns the error if one happens.
Result<std::string> DecodeAll(std::string bytes, std::size_t chunk = 0) {
  std::unique_ptr<ByteSource> source =
      chunk == 0 ? MemorySource(std::move(bytes))
                 : std::unique_ptr<ByteSource>(new TrickleSource(std::move(bytes), chunk));
  Result<std::unique_ptr<InputStream>> in = InputStream::Open(std::move(source));
  if (!in.ok()) return in.status();
  std::string out;
  char buf[4096];
  for (;;) {
    Result<std::size_t> got = (*in)->Read(buf, sizeof(buf));
    if (!got.ok()) return got.status();
    if (*got == 0) return out;
    out.append(buf, *got);
  }
}

std::string SampleText(std::size_t lines) {
  std::string text;
  for (std::size_t i = 0; i < lines; ++i) {
    text += R"({"action":"alloc","addr":)" + std::to_string(140234567890123 + i * 512) +
            R"(,"size":)" + std::to_string(512 * (i % 97 + 1)) + "}\n";
  }
  return text;
}

// ---- Detection and decoding -----------------------------------------------------------------

TEST(InputStreamTest, DetectsCompressionByContent) {
  const std::string text = SampleText(10);
  for (Compression c : {Compression::kNone, Compression::kGzip, Compression::kZstd}) {
    auto in = OpenOrDie(MemorySource(Compressed(c, text)));
    ASSERT_NE(in, nullptr);
    EXPECT_EQ(in->compression(), c);
  }
}

TEST(InputStreamTest, DecodesEachFormatWholeAndInTinyReads) {
  const std::string text = SampleText(5000);
  for (Compression c : {Compression::kNone, Compression::kGzip, Compression::kZstd}) {
    SCOPED_TRACE(static_cast<int>(c));
    std::string bytes = Compressed(c, text);
    Result<std::string> whole = DecodeAll(bytes);
    ASSERT_TRUE(whole.ok()) << whole.status().ToString();
    EXPECT_EQ(*whole, text);
    // One byte per read exercises detection and decoders across every boundary.
    Result<std::string> trickled = DecodeAll(bytes, 1);
    ASSERT_TRUE(trickled.ok()) << trickled.status().ToString();
    EXPECT_EQ(*trickled, text);
  }
}

TEST(InputStreamTest, InputShorterThanAnyMagicIsPlain) {
  for (std::string bytes : {"", "{", "\x1f", "\x28\xb5"}) {
    Result<std::string> out = DecodeAll(bytes);
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    EXPECT_EQ(*out, bytes);
  }
}

TEST(InputStreamTest, ConcatenatedGzipMembersReadAsOneStream) {
  // What `cat a.gz b.gz > c.gz` and pigz produce; an empty member in the middle too.
  std::string bytes = Compressed(Compression::kGzip, "first\n") +
                      Compressed(Compression::kGzip, "") +
                      Compressed(Compression::kGzip, "second\n");
  Result<std::string> out = DecodeAll(bytes);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "first\nsecond\n");
  Result<std::string> trickled = DecodeAll(bytes, 3);
  ASSERT_TRUE(trickled.ok()) << trickled.status().ToString();
  EXPECT_EQ(*trickled, "first\nsecond\n");
}

TEST(InputStreamTest, ConcatenatedZstdFramesReadAsOneStream) {
  std::string bytes =
      Compressed(Compression::kZstd, "first\n") + Compressed(Compression::kZstd, "second\n");
  Result<std::string> out = DecodeAll(bytes);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "first\nsecond\n");
}

TEST(InputStreamTest, ZstdSkippableFrameFirstIsDetected) {
  // A skippable frame (magic 0x184D2A50, 4-byte length, payload) before a normal frame.
  std::string skippable(
      "\x50\x2a\x4d\x18\x03\x00\x00\x00"
      "abc",
      11);
  Result<std::string> out = DecodeAll(skippable + Compressed(Compression::kZstd, "x\n"));
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(*out, "x\n");
}

TEST(InputStreamTest, EveryTruncatedGzipStreamIsAnError) {
  std::string bytes = Compressed(Compression::kGzip, SampleText(50));
  for (std::size_t len = 2; len < bytes.size(); ++len) {
    Result<std::string> out = DecodeAll(bytes.substr(0, len));
    ASSERT_FALSE(out.ok()) << "prefix of " << len << " bytes decoded without error";
    EXPECT_EQ(out.status().code(), StatusCode::kCorruption);
    EXPECT_NE(out.status().message().find("truncated gzip stream"), std::string::npos)
        << out.status().message();
  }
}

TEST(InputStreamTest, EveryTruncatedZstdStreamIsAnError) {
  std::string bytes = Compressed(Compression::kZstd, SampleText(50));
  for (std::size_t len = 4; len < bytes.size(); ++len) {
    Result<std::string> out = DecodeAll(bytes.substr(0, len));
    ASSERT_FALSE(out.ok()) << "prefix of " << len << " bytes decoded without error";
    EXPECT_NE(out.status().message().find("truncated zstd stream"), std::string::npos)
        << out.status().message();
  }
}

TEST(InputStreamTest, TruncatedSecondGzipMemberIsAnError) {
  std::string second = Compressed(Compression::kGzip, "second\n");
  std::string bytes = Compressed(Compression::kGzip, "first\n") + second.substr(0, 12);
  Result<std::string> out = DecodeAll(bytes);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("truncated gzip stream"), std::string::npos);
}

TEST(InputStreamTest, CorruptGzipDataIsAnError) {
  std::string bytes = Compressed(Compression::kGzip, SampleText(200));
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x55);
  Result<std::string> out = DecodeAll(bytes);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kCorruption);
  EXPECT_NE(out.status().message().find("corrupt gzip stream near compressed byte"),
            std::string::npos)
      << out.status().message();
}

TEST(InputStreamTest, GzipChecksumMismatchIsAnError) {
  std::string bytes = Compressed(Compression::kGzip, "hello\n");
  bytes[bytes.size() - 6] = static_cast<char>(bytes[bytes.size() - 6] ^ 1);  // inside the CRC-32
  Result<std::string> out = DecodeAll(bytes);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("incorrect data check"), std::string::npos)
      << out.status().message();
}

TEST(InputStreamTest, GarbageAfterGzipMemberIsAnError) {
  std::string bytes = Compressed(Compression::kGzip, "hello\n") + "trailing text";
  Result<std::string> out = DecodeAll(bytes);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("corrupt gzip stream"), std::string::npos)
      << out.status().message();
}

TEST(InputStreamTest, CorruptZstdDataIsAnError) {
  std::string bytes = Compressed(Compression::kZstd, SampleText(200));
  bytes[bytes.size() / 2] = static_cast<char>(bytes[bytes.size() / 2] ^ 0x55);
  Result<std::string> out = DecodeAll(bytes);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("corrupt zstd stream"), std::string::npos)
      << out.status().message();
}

TEST(InputStreamTest, UnsupportedCompressionIsNamed) {
  Result<std::unique_ptr<InputStream>> xz =
      InputStream::Open(MemorySource(std::string("\xfd"
                                                 "7zXZ\0rest",
                                                 10)));
  ASSERT_FALSE(xz.ok());
  EXPECT_EQ(xz.status().message(),
            "xz-compressed input is not supported (plain, gzip or zstd only)");
  Result<std::unique_ptr<InputStream>> bz = InputStream::Open(MemorySource("BZh91AY&SY"));
  ASSERT_FALSE(bz.ok());
  EXPECT_NE(bz.status().message().find("bzip2"), std::string::npos);
}

TEST(InputStreamTest, SourceErrorsPropagate) {
  Result<std::unique_ptr<InputStream>> in =
      InputStream::Open(std::unique_ptr<ByteSource>(new FailingSource));
  ASSERT_FALSE(in.ok());
  EXPECT_EQ(in.status().code(), StatusCode::kIoError);
}

TEST(InputStreamTest, CountsRawBytes) {
  std::string bytes = Compressed(Compression::kZstd, SampleText(100));
  auto in = OpenOrDie(MemorySource(bytes));
  ASSERT_NE(in, nullptr);
  EXPECT_EQ(in->raw_bytes_total(), bytes.size());
  char buf[1 << 16];
  while (true) {
    Result<std::size_t> got = in->Read(buf, sizeof(buf));
    ASSERT_TRUE(got.ok());
    if (*got == 0) break;
  }
  EXPECT_EQ(in->raw_bytes_consumed(), bytes.size());
}

// ---- Files ----------------------------------------------------------------------------------

TEST(FileSourceTest, MissingFileIsNotFound) {
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource("/nonexistent/trace.jsonl");
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(source.status().message(), "/nonexistent/trace.jsonl: no such file");
}

TEST(FileSourceTest, DirectoryIsAnIoError) {
  std::string dir = fragscope::testing::MakeTempDir();
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource(dir);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), StatusCode::kIoError);
  EXPECT_EQ(source.status().message(), dir + ": is a directory");
  std::filesystem::remove_all(dir);
}

TEST(FileSourceTest, ReadsFileAndKnowsItsSize) {
  std::string dir = fragscope::testing::MakeTempDir();
  std::string path = dir + "/x.bin";
  std::ofstream(path, std::ios::binary) << "hello\nworld\n";
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource(path);
  ASSERT_TRUE(source.ok()) << source.status().ToString();
  EXPECT_EQ((*source)->size_bytes(), 12u);
  char buf[64];
  Result<std::size_t> got = (*source)->Read(buf, sizeof(buf));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::string(buf, *got), "hello\nworld\n");
  std::filesystem::remove_all(dir);
}

// ---- Streams (issue 24 item 5) --------------------------------------------------------------

// A pipe whose read end is opened by path, as process substitution's /dev/fd/N is; a thread
// writes `bytes` into it and closes it.
class PipeInput {
 public:
  explicit PipeInput(std::string bytes) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    read_fd_ = fds[0];
    writer_ = std::thread([fd = fds[1], bytes = std::move(bytes)] {
      std::size_t done = 0;
      while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n <= 0) break;  // the reader went away
        done += static_cast<std::size_t>(n);
      }
      ::close(fd);
    });
    path_ = "/dev/fd/" + std::to_string(read_fd_);
  }
  ~PipeInput() {
    ResetStreamsForTesting();  // closes the stream's own descriptor
    ::close(read_fd_);         // then the writer sees EPIPE if it still writes
    writer_.join();
  }
  const std::string& path() const { return path_; }

 private:
  int read_fd_ = -1;
  std::thread writer_;
  std::string path_;
};

std::string ReadAllOf(ByteSource& source, Status* error = nullptr) {
  std::string out;
  char buf[4096];
  for (;;) {
    Result<std::size_t> got = source.Read(buf, sizeof buf);
    if (!got.ok()) {
      if (error != nullptr) *error = got.status();
      return out;
    }
    if (*got == 0) return out;
    out.append(buf, *got);
  }
}

TEST(StreamSourceTest, Issue24AStreamIsOpenedOnceAndItsBeginningReadAgain) {
  PipeInput pipe("{\"format\": \"fragscope-trace\"}\nrest of it\n");
  Result<std::unique_ptr<ByteSource>> sniff = OpenFileSource(pipe.path());
  ASSERT_TRUE(sniff.ok()) << sniff.status().ToString();
  EXPECT_EQ((*sniff)->size_bytes(), 0u);  // unknown
  char head[9];
  Result<std::size_t> got = (*sniff)->Read(head, sizeof head);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(std::string(head, *got), "{\"format\"");
  // The second open is not a reopen: the same bytes again, from the start.
  Result<std::unique_ptr<ByteSource>> whole = OpenFileSource(pipe.path());
  ASSERT_TRUE(whole.ok());
  EXPECT_EQ(ReadAllOf(**whole), "{\"format\": \"fragscope-trace\"}\nrest of it\n");
  // And a third, after the end: still all of it, from the buffer.
  Result<std::unique_ptr<ByteSource>> again = OpenFileSource(pipe.path());
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(ReadAllOf(**again), "{\"format\": \"fragscope-trace\"}\nrest of it\n");
}

TEST(StreamSourceTest, Issue24AnEndlessStreamStopsAtTheLimit) {
  SetStreamInputLimit(1000);
  PipeInput pipe(std::string(5000, '\0'));
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource(pipe.path());
  ASSERT_TRUE(source.ok());
  Status error;
  const std::string read = ReadAllOf(**source, &error);
  char more[16];
  const bool read_on = (*source)->Read(more, sizeof more).ok();
  SetStreamInputLimit(kDefaultStreamInputBytes);
  EXPECT_FALSE(read_on);  // and stays refused
  EXPECT_LE(read.size(), 1000u);
  EXPECT_EQ(error.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(error.message().find("read more than 1000 B from a stream"), std::string::npos)
      << error.message();
  EXPECT_NE(error.message().find("--max-input-bytes"), std::string::npos);
}

TEST(StreamSourceTest, Issue24ReadingAgainPastTheBufferIsRefused) {
  const std::string bytes(kStreamSpoolBytes + 100000, 'x');
  PipeInput pipe(bytes);
  Result<std::unique_ptr<ByteSource>> first = OpenFileSource(pipe.path());
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(ReadAllOf(**first).size(), bytes.size());
  Result<std::unique_ptr<ByteSource>> second = OpenFileSource(pipe.path());
  ASSERT_TRUE(second.ok());
  Status error;
  EXPECT_EQ(ReadAllOf(**second, &error).size(), kStreamSpoolBytes);
  EXPECT_EQ(error.code(), StatusCode::kUnimplemented);
  EXPECT_NE(error.message().find("save it to a file first"), std::string::npos) << error.message();
}

TEST(StreamSourceTest, ReadWholeInputRefusesMoreThanItsLimit) {
  PipeInput pipe(std::string(100, 'a'));
  Result<std::string> small = ReadWholeInput(pipe.path(), 10, "a sample file");
  ASSERT_FALSE(small.ok());
  EXPECT_EQ(small.status().message(), pipe.path() + ": larger than 10 B (a sample file)");
  Result<std::string> big = ReadWholeInput(pipe.path(), 1000, "a sample file");
  ASSERT_TRUE(big.ok());
  EXPECT_EQ(*big, std::string(100, 'a'));
}

// ---- LineReader -----------------------------------------------------------------------------

// All lines, or the error with the line number it happened on.
struct Lines {
  std::vector<std::string> lines;
  Status status;
  std::uint64_t error_line = 0;
};

Lines ReadLines(std::string bytes, std::size_t max_line_bytes, std::size_t chunk = 0) {
  std::unique_ptr<ByteSource> source =
      chunk == 0 ? MemorySource(std::move(bytes))
                 : std::unique_ptr<ByteSource>(new TrickleSource(std::move(bytes), chunk));
  Lines out;
  Result<std::unique_ptr<InputStream>> in = InputStream::Open(std::move(source));
  if (!in.ok()) {
    out.status = in.status();
    return out;
  }
  LineReader reader(std::move(*in), max_line_bytes);
  for (;;) {
    std::string_view line;
    Result<bool> got = reader.Next(&line);
    if (!got.ok()) {
      out.status = got.status();
      out.error_line = reader.line_number();
      return out;
    }
    if (!*got) return out;
    out.lines.emplace_back(line);
    EXPECT_EQ(reader.line_number(), out.lines.size());
  }
}

using Strings = std::vector<std::string>;

TEST(LineReaderTest, SplitsLines) {
  EXPECT_EQ(ReadLines("a\nbb\nccc\n", 100).lines, (Strings{"a", "bb", "ccc"}));
}

TEST(LineReaderTest, LastLineNeedsNoNewline) {
  EXPECT_EQ(ReadLines("a\nbb", 100).lines, (Strings{"a", "bb"}));
}

TEST(LineReaderTest, EmptyInputHasNoLines) { EXPECT_EQ(ReadLines("", 100).lines, Strings{}); }

TEST(LineReaderTest, EmptyLinesAreReturnedAsEmpty) {
  // Whether they are allowed is the trace reader's decision.
  EXPECT_EQ(ReadLines("a\n\nb\n\n", 100).lines, (Strings{"a", "", "b", ""}));
  EXPECT_EQ(ReadLines("\n", 100).lines, (Strings{""}));
}

TEST(LineReaderTest, StripsCarriageReturnOfCrlf) {
  EXPECT_EQ(ReadLines("a\r\nbb\r\ncc\r", 100).lines, (Strings{"a", "bb", "cc"}));
  // Only the one right before "\n".
  EXPECT_EQ(ReadLines("a\r\r\nb\rc\n", 100).lines, (Strings{"a\r", "b\rc"}));
}

TEST(LineReaderTest, LineOfExactlyTheLimitIsAccepted) {
  std::string line(1000, 'x');
  EXPECT_EQ(ReadLines(line + "\n" + line + "\r\n" + line, 1000).lines, (Strings{line, line, line}));
}

TEST(LineReaderTest, LineOneByteOverTheLimitIsRefused) {
  for (std::string ending : {"\n", "\r\n", ""}) {
    Lines out = ReadLines("ok\n" + std::string(1001, 'x') + ending + "after\n", 1000);
    ASSERT_FALSE(out.status.ok());
    EXPECT_EQ(out.status.code(), StatusCode::kLimitExceeded);
    EXPECT_EQ(out.status.message(), "line is longer than the limit of 1000 bytes (max_line_bytes)");
    EXPECT_EQ(out.error_line, 2u);
  }
}

TEST(LineReaderTest, LinesAcrossBufferBoundaries) {
  // ~5 MiB of lines of varied length, so lines straddle every 1 MiB buffer refill.
  Strings expected;
  std::string text;
  for (int i = 0; text.size() < 5 * (std::size_t{1} << 20); ++i) {
    expected.push_back(std::string(static_cast<std::size_t>(i * 7919 % 3000), 'a' + i % 26));
    text += expected.back() + (i % 3 == 0 ? "\r\n" : "\n");
  }
  EXPECT_EQ(ReadLines(text, 4096).lines, expected);
  EXPECT_EQ(ReadLines(text, 4096, 100000).lines, expected);
}

TEST(LineReaderTest, LongLineBelowLimitGrowsTheBuffer) {
  std::string big(3 * (std::size_t{1} << 20) + 17, 'y');
  Lines out = ReadLines("a\n" + big + "\nb", std::size_t{4} << 20);
  ASSERT_TRUE(out.status.ok()) << out.status.ToString();
  EXPECT_EQ(out.lines, (Strings{"a", big, "b"}));
}

TEST(LineReaderTest, HugeLineFailsFastWithBoundedMemory) {
  // A 64 MiB line against a 1 MiB limit: the error must come after reading about the limit,
  // not the whole line (which would mean buffering it).
  constexpr std::size_t kLimit = std::size_t{1} << 20;
  std::string bytes = "header\n" + std::string(std::size_t{64} << 20, 'z') + "\n";
  Result<std::unique_ptr<InputStream>> in = InputStream::Open(MemorySource(std::move(bytes)));
  ASSERT_TRUE(in.ok());
  LineReader reader(std::move(*in), kLimit);
  std::string_view line;
  ASSERT_TRUE(reader.Next(&line).ok());
  Result<bool> got = reader.Next(&line);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kLimitExceeded);
  EXPECT_EQ(reader.line_number(), 2u);
  EXPECT_LE(reader.input().raw_bytes_consumed(), 3 * kLimit);
}

TEST(LineReaderTest, DecoderErrorsSurfaceFromNext) {
  std::string bytes = Compressed(Compression::kGzip, "a\nb\nc\n");
  Lines out = ReadLines(bytes.substr(0, bytes.size() - 3), 100);
  ASSERT_FALSE(out.status.ok());
  EXPECT_NE(out.status.message().find("truncated gzip stream"), std::string::npos);
}

}  // namespace
}  // namespace fragscope::sources
