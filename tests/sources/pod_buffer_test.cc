// PodBuffer with a Prefaulter warming ahead (WarmAhead): the contents and sizes are exactly
// those of a plain buffer, however the writes cross the warm window; and a pickle big enough
// for the reader to start warming decodes to the same Document as one read from memory.
#include "sources/document/pod_buffer.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sources/document/json_document.h"
#include "sources/pickle/pickle_reader.h"

namespace fragscope::sources {
namespace {

using internal::PodBuffer;

TEST(PodBufferTest, WarmedBufferHoldsWhatWasWritten) {
  Prefaulter prefaulter;
  PodBuffer<std::uint64_t> warm;
  PodBuffer<std::uint64_t> plain;
  // A small window (8 KiB = 1,024 elements) so that the writes cross it thousands of times;
  // the buffer grows through the mmap threshold, where realloc moves pages.
  warm.WarmAhead(&prefaulter, 8192);
  std::mt19937_64 rng(5);
  std::uint64_t next = 0;
  while (plain.size() < 3'000'000) {
    if (rng() % 3 == 0) {
      const std::size_t n = 1 + rng() % 5000;
      std::uint64_t* a = warm.Extend(n);
      std::uint64_t* b = plain.Extend(n);
      for (std::size_t i = 0; i < n; ++i) a[i] = b[i] = next++;
    } else {
      warm.push_back(next);
      plain.push_back(next++);
    }
    if (rng() % 1000 == 0) {  // Truncate moves the end back inside the warm region
      const std::size_t keep = plain.size() - plain.size() / 10;
      warm.Truncate(keep);
      plain.Truncate(keep);
    }
    ASSERT_EQ(warm.size(), plain.size());
  }
  prefaulter.Drain();
  warm.WarmAhead(nullptr, 0);
  warm.ShrinkToFit();
  plain.ShrinkToFit();
  ASSERT_EQ(warm.size(), plain.size());
  EXPECT_EQ(warm.capacity(), warm.size());
  for (std::size_t i = 0; i < plain.size(); ++i) ASSERT_EQ(warm[i], plain[i]) << i;
  // Moving carries the contents and leaves no prefaulter behind.
  PodBuffer<std::uint64_t> moved = std::move(warm);
  EXPECT_EQ(moved.size(), plain.size());
  EXPECT_EQ(warm.size(), 0u);  // NOLINT(bugprone-use-after-move): checked on purpose
  warm.push_back(7);
  EXPECT_EQ(warm[0], 7u);
}

TEST(PodBufferTest, WindowSmallerThanAnElementMeansNoWarming) {
  Prefaulter prefaulter;
  PodBuffer<std::uint64_t> b;
  b.WarmAhead(&prefaulter, 4);
  for (std::uint64_t i = 0; i < 10'000; ++i) b.push_back(i);
  EXPECT_EQ(b.size(), 10'000u);
  EXPECT_EQ(b[9'999], 9'999u);
}

// A protocol-4 pickle of one list of `n` ints (BININT, so 5 bytes each), in APPENDS batches of
// 1,000 as Python writes them.
std::string IntListPickle(std::size_t n) {
  std::string out = "\x80\x04]\x94";
  std::mt19937 rng(9);
  for (std::size_t done = 0; done < n;) {
    out += '(';
    for (std::size_t i = 0; i < 1000 && done < n; ++i, ++done) {
      const std::uint32_t v = rng() >> 1;
      out += 'J';
      for (int k = 0; k < 4; ++k) out += static_cast<char>((v >> (8 * k)) & 0xff);
    }
    out += 'e';
  }
  out += '.';
  return out;
}

TEST(PodBufferTest, BigPickleReadFromAFileEqualsTheSameReadFromMemory) {
  // 7 M ints = 35 MB: past the 32 MiB after which the streaming reader warms its arenas.
  const std::string bytes = IntListPickle(7'000'000);
  ASSERT_GT(bytes.size(), std::size_t{33} << 20);
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() /
      ("fragscope_pod_buffer_test_" + std::to_string(::getpid()) + ".pickle");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  Result<Document> streamed = ReadDocumentFile(path.string());
  std::filesystem::remove(path);
  ASSERT_TRUE(streamed.ok()) << streamed.status().ToString();
  Result<Document> in_memory = ReadPickleBytes(bytes);
  ASSERT_TRUE(in_memory.ok()) << in_memory.status().ToString();
  const auto a = streamed->Items(streamed->root());
  const auto b = in_memory->Items(in_memory->root());
  ASSERT_EQ(a.size(), 7'000'000u);
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(streamed->AsInt(a[i]), in_memory->AsInt(b[i])) << i;
  }
}

}  // namespace
}  // namespace fragscope::sources
