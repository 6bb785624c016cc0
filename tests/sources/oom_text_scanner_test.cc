#include "sources/oom_text/oom_text_scanner.h"

#include <cmath>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace fragscope::sources {
namespace {

// A figure as PyTorch prints it: `value` units of 2^shift bytes.
std::uint64_t Sz(double value, int shift) {
  return static_cast<std::uint64_t>(std::llround(std::ldexp(value, shift)));
}
std::uint64_t KiB(double v) { return Sz(v, 10); }
std::uint64_t MiB(double v) { return Sz(v, 20); }
std::uint64_t GiB(double v) { return Sz(v, 30); }

OomTextScan ScanFixture(const std::string& name) {
  Result<OomTextScan> scan =
      ReadOomText(testing::SourcePath("tests/data/oom_text/" + name), OomTextLimits{});
  EXPECT_TRUE(scan.ok()) << scan.status().ToString();
  return scan.ok() ? *scan : OomTextScan{};
}

TEST(ParsePrintedSizeTest, UnitsAndBytes) {
  std::size_t used = 0;
  EXPECT_EQ(ParsePrintedSize("20.00 MiB", &used), MiB(20));
  EXPECT_EQ(used, 9u);
  EXPECT_EQ(ParsePrintedSize("0 bytes is free", &used), 0u);
  EXPECT_EQ(used, 7u);
  EXPECT_EQ(ParsePrintedSize("1024 bytes", &used), 1024u);
  EXPECT_EQ(ParsePrintedSize("512 B", &used), 512u);
  EXPECT_EQ(ParsePrintedSize("1023.50 KiB", &used), KiB(1023.5));
  EXPECT_EQ(ParsePrintedSize("1.00 TiB", &used), GiB(1024));
  EXPECT_EQ(ParsePrintedSize("7.93 GiB;", &used), GiB(7.93));
  EXPECT_EQ(ParsePrintedSize("3 GiBs", &used), std::nullopt);  // a longer word
  EXPECT_EQ(ParsePrintedSize("MiB", &used), std::nullopt);
  EXPECT_EQ(ParsePrintedSize("12", &used), std::nullopt);               // no unit
  EXPECT_EQ(ParsePrintedSize("99999999999 GiB", &used), std::nullopt);  // beyond 1 EiB
  EXPECT_EQ(ParsePrintedSize("1024.00 PiB", &used), std::nullopt);
  EXPECT_EQ(ParsePrintedSize("1023.00 PiB", &used), Sz(1023, 50));
  EXPECT_EQ(ParsePrintedSize("123456789012345678901 bytes", &used), std::nullopt);
}

TEST(OomTextScannerTest, ClassicWithoutHint) {
  const OomTextScan scan = ScanFixture("classic_pre110.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.line, 9u);
  EXPECT_EQ(m.backend, "CUDA");
  EXPECT_EQ(m.exception, "RuntimeError");
  EXPECT_EQ(m.wording, OomWording::kClassic);
  EXPECT_EQ(m.gpu, 2);
  EXPECT_EQ(m.rank, std::nullopt);
  EXPECT_EQ(m.tried, MiB(20));
  EXPECT_EQ(m.total, GiB(10.76));
  EXPECT_EQ(m.allocated, GiB(9.81));
  EXPECT_EQ(m.free, MiB(17.44));
  EXPECT_EQ(m.reserved, GiB(9.88));
  EXPECT_EQ(m.Unallocated(), GiB(9.88) - GiB(9.81));
  EXPECT_FALSE(m.hint_max_split);
  EXPECT_FALSE(m.hint_expandable);
  EXPECT_FALSE(m.text_truncated);
  EXPECT_EQ(scan.lines, 9u);
}

TEST(OomTextScannerTest, ClassicWithHintWrappedOverLines) {
  const OomTextScan scan = ScanFixture("classic_hint.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.line, 4u);
  EXPECT_EQ(m.last_line, 7u);
  EXPECT_EQ(m.exception, "torch.cuda.OutOfMemoryError");
  EXPECT_EQ(m.wording, OomWording::kClassic);
  EXPECT_EQ(m.tried, MiB(512));
  EXPECT_EQ(m.total, GiB(15.78));
  EXPECT_EQ(m.allocated, GiB(12.10));
  EXPECT_EQ(m.free, MiB(310.75));
  EXPECT_EQ(m.reserved, GiB(14.90));
  EXPECT_TRUE(m.hint_max_split);
  EXPECT_FALSE(m.text_truncated);
  const std::string tail = "Memory Management and PYTORCH_CUDA_ALLOC_CONF";
  ASSERT_GE(m.text.size(), tail.size());
  EXPECT_EQ(m.text.substr(m.text.size() - tail.size()), tail);
}

TEST(OomTextScannerTest, CapacityOfWith21Typo) {
  const OomTextScan scan = ScanFixture("capacity_of_21.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.wording, OomWording::kCapacityOf);
  EXPECT_EQ(m.gpu, 1);
  EXPECT_EQ(m.tried, GiB(3.91));
  EXPECT_EQ(m.total, GiB(23.65));
  EXPECT_EQ(m.free, GiB(2.06));
  ASSERT_EQ(m.processes.size(), 1u);
  EXPECT_EQ(m.processes[0].pid, 51322u);
  EXPECT_EQ(m.processes[0].bytes, GiB(1.20));
  EXPECT_EQ(m.this_process, GiB(20.37));
  EXPECT_EQ(m.allocated, GiB(15.02));
  EXPECT_EQ(m.unallocated, GiB(4.88));
  EXPECT_EQ(m.Reserved(), GiB(15.02) + GiB(4.88));
  EXPECT_EQ(m.reserved, std::nullopt);
  EXPECT_TRUE(m.hint_max_split);
  EXPECT_FALSE(m.hint_expandable);
}

TEST(OomTextScannerTest, CapacityOfWithExpandableHint) {
  const OomTextScan scan = ScanFixture("capacity_of_22.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.exception, "torch.OutOfMemoryError");
  EXPECT_EQ(m.tried, GiB(8));
  EXPECT_EQ(m.total, GiB(79.15));
  EXPECT_EQ(m.free, GiB(3.52));
  EXPECT_EQ(m.this_process, GiB(75.62));
  EXPECT_TRUE(m.processes.empty());
  EXPECT_EQ(m.allocated, GiB(70.40));
  EXPECT_EQ(m.unallocated, GiB(4.61));
  EXPECT_TRUE(m.hint_expandable);
  EXPECT_FALSE(m.hint_max_split);
  EXPECT_FALSE(m.text_truncated);
}

TEST(OomTextScannerTest, PrivatePools) {
  const OomTextScan scan = ScanFixture("private_pools.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.allocated, GiB(36.90));
  EXPECT_EQ(m.private_pools, GiB(1.20));
  EXPECT_EQ(m.unallocated, MiB(420));
}

TEST(OomTextScannerTest, SeveralOtherProcesses) {
  const OomTextScan scan = ScanFixture("other_processes.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  ASSERT_EQ(m.processes.size(), 2u);
  EXPECT_EQ(m.processes[0].pid, 70021u);
  EXPECT_EQ(m.processes[0].bytes, GiB(9));
  EXPECT_EQ(m.processes[1].pid, 70544u);
  EXPECT_EQ(m.processes[1].bytes, GiB(6.5));
  EXPECT_EQ(m.gpu, 3);
}

TEST(OomTextScannerTest, RocmHip) {
  const OomTextScan scan = ScanFixture("rocm_hip.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.backend, "HIP");
  EXPECT_EQ(m.line, 2u);
  EXPECT_EQ(m.tried, GiB(2));
  EXPECT_EQ(m.total, GiB(191.98));
  EXPECT_EQ(m.unallocated, GiB(3.95));
  EXPECT_FALSE(m.text_truncated);
}

// ROCm builds of 1.10-2.0: the classic wording, "HIP out of memory", and a hint that ends in
// PYTORCH_HIP_ALLOC_CONF. The message ends there: the log line after it is not part of it.
TEST(OomTextScannerTest, RocmHipClassicWrappedOverLines) {
  const OomTextScan scan = ScanFixture("rocm_hip_classic.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.backend, "HIP");
  EXPECT_EQ(m.wording, OomWording::kClassic);
  EXPECT_EQ(m.line, 5u);
  EXPECT_EQ(m.last_line, 8u);
  EXPECT_EQ(m.exception, "torch.cuda.OutOfMemoryError");
  EXPECT_EQ(m.gpu, 1);
  EXPECT_EQ(m.tried, GiB(1.50));
  EXPECT_EQ(m.total, GiB(63.98));
  EXPECT_EQ(m.allocated, GiB(55.20));
  EXPECT_EQ(m.free, GiB(1.02));
  EXPECT_EQ(m.reserved, GiB(61.75));
  EXPECT_TRUE(m.hint_max_split);
  EXPECT_FALSE(m.text_truncated);
  const std::string tail = "Memory Management and PYTORCH_HIP_ALLOC_CONF";
  ASSERT_GE(m.text.size(), tail.size());
  EXPECT_EQ(m.text.substr(m.text.size() - tail.size()), tail);

  // On one line of a JSON log the message ends at PYTORCH_HIP_ALLOC_CONF, not with the line.
  const OomTextScan json = ScanOomText(
      "{\"level\": \"error\", \"msg\": \"HIP out of memory. Tried to allocate 1.50 GiB (GPU 1; "
      "63.98 GiB total capacity; 55.20 GiB already allocated; 1.02 GiB free; 61.75 GiB reserved "
      "in total by PyTorch) If reserved memory is >> allocated memory try setting "
      "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
      "PYTORCH_HIP_ALLOC_CONF\", \"rank\": 1}\n");
  ASSERT_EQ(json.messages.size(), 1u);
  EXPECT_EQ(json.messages[0].backend, "HIP");
  EXPECT_EQ(json.messages[0].reserved, GiB(61.75));
  const std::string& text = json.messages[0].text;
  ASSERT_GE(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail) << text;
}

TEST(OomTextScannerTest, AllowedLimit) {
  const OomTextScan scan = ScanFixture("limit_allowed.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  EXPECT_EQ(scan.messages[0].allowed, GiB(11.10));
  EXPECT_EQ(scan.messages[0].reserved, GiB(10.50));
  EXPECT_EQ(scan.messages[0].free, GiB(11.60));
}

TEST(OomTextScannerTest, BytesAndTiB) {
  const OomTextScan scan = ScanFixture("bytes_units.txt");
  ASSERT_EQ(scan.messages.size(), 2u);
  EXPECT_EQ(scan.messages[0].total, GiB(1024));
  EXPECT_EQ(scan.messages[0].free, 0u);
  EXPECT_EQ(scan.messages[0].allocated, GiB(1023.5));
  EXPECT_EQ(scan.messages[1].tried, KiB(512));
  EXPECT_EQ(scan.messages[1].free, 1000u);
  EXPECT_EQ(scan.messages[1].unallocated, 0u);
  EXPECT_EQ(scan.messages[1].line, 2u);
}

TEST(OomTextScannerTest, CudaRuntimeErrorHasNoFigures) {
  const OomTextScan scan = ScanFixture("cuda_error.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.text, "CUDA error: out of memory");
  EXPECT_EQ(m.wording, OomWording::kUnknown);
  EXPECT_EQ(m.tried, std::nullopt);
  EXPECT_EQ(m.line, 4u);
  EXPECT_EQ(m.last_line, 4u);
}

TEST(OomTextScannerTest, TruncatedMessage) {
  const OomTextScan scan = ScanFixture("truncated.txt");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.rank, 1);
  EXPECT_EQ(m.tried, MiB(768));
  EXPECT_EQ(m.total, GiB(79.10));
  EXPECT_EQ(m.free, std::nullopt);
  EXPECT_EQ(m.allocated, std::nullopt);
  EXPECT_TRUE(m.text_truncated);
}

TEST(OomTextScannerTest, GarbageHasNoMessage) {
  const OomTextScan scan = ScanFixture("garbage.txt");
  EXPECT_TRUE(scan.messages.empty());
  EXPECT_EQ(scan.lines, 5u);
}

TEST(OomTextScannerTest, JsonLogLine) {
  const OomTextScan scan = ScanFixture("json_log.jsonl");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.line, 2u);
  EXPECT_EQ(m.rank, 5);
  EXPECT_EQ(m.gpu, 5);
  EXPECT_EQ(m.exception, "torch.OutOfMemoryError");
  EXPECT_EQ(m.tried, MiB(640));
  EXPECT_EQ(m.unallocated, GiB(7.94));
  EXPECT_FALSE(m.text_truncated);
  // The message ends at the documentation link, not at the end of the JSON line.
  EXPECT_EQ(m.text.back(), ')');
}

TEST(OomTextScannerTest, MultiGpuLogWithRankPrefixesAndRepeats) {
  const OomTextScan scan = ScanFixture("multi_gpu.log");
  ASSERT_EQ(scan.messages.size(), 2u);
  const OomMessage& a = scan.messages[0];
  EXPECT_EQ(a.rank, 2);
  EXPECT_EQ(a.gpu, 2);
  EXPECT_EQ(a.line, 6u);
  EXPECT_EQ(a.repeats, 2u);
  ASSERT_EQ(a.repeat_lines.size(), 1u);
  EXPECT_EQ(a.repeat_lines[0], 16u);
  EXPECT_EQ(a.unallocated, GiB(4.81));
  const OomMessage& b = scan.messages[1];
  EXPECT_EQ(b.rank, 3);
  EXPECT_EQ(b.gpu, 3);
  EXPECT_EQ(b.line, 10u);
  EXPECT_EQ(b.last_line, 14u);
  EXPECT_EQ(b.free, GiB(1.40));
  EXPECT_EQ(b.this_process, GiB(77.68));
  EXPECT_EQ(b.allocated, GiB(76.90));
  EXPECT_EQ(b.unallocated, MiB(210));
  EXPECT_TRUE(b.hint_expandable);
  EXPECT_FALSE(b.text_truncated);
  EXPECT_EQ(b.text.find("[rank"), std::string::npos);  // prefixes stripped
}

TEST(OomTextScannerTest, TimestampAndLevelPrefixesOnContinuationLines) {
  const OomTextScan scan = ScanOomText(
      "2024-01-02 03:04:05,678 ERROR RuntimeError: CUDA out of memory. Tried to allocate 2.00 "
      "MiB (GPU 0; 4.00 GiB total\n"
      "2024-01-02 03:04:05,679 ERROR capacity; 3.00 GiB already allocated; 1.00 MiB free; 3.50 "
      "GiB reserved in total by PyTorch)\n"
      "2024-01-02 03:04:05,680 ERROR If reserved memory is >> allocated memory try setting "
      "max_split_size_mb to avoid fragmentation.  See documentation for Memory Management and "
      "PYTORCH_CUDA_ALLOC_CONF\n"
      "2024-01-02 03:04:06,000 INFO next epoch\n");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.total, GiB(4));
  EXPECT_EQ(m.reserved, GiB(3.5));
  EXPECT_TRUE(m.hint_max_split);
  EXPECT_EQ(m.last_line, 3u);
}

TEST(OomTextScannerTest, ClassicPre110EndsAtParenthesisUnlessTheHintFollows) {
  const std::string head =
      "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 4.00 GiB total capacity; 3.00 GiB "
      "already allocated; 1.00 MiB free; 3.50 GiB reserved in total by PyTorch)\n";
  OomTextScan scan = ScanOomText(head + "Epoch 2 starts now\n");
  ASSERT_EQ(scan.messages.size(), 1u);
  EXPECT_EQ(scan.messages[0].last_line, 1u);
  EXPECT_FALSE(scan.messages[0].text_truncated);
  scan = ScanOomText(head +
                     "If reserved memory is >> allocated memory try setting max_split_size_mb to "
                     "avoid fragmentation.\n");
  ASSERT_EQ(scan.messages.size(), 1u);
  EXPECT_EQ(scan.messages[0].last_line, 2u);
  EXPECT_TRUE(scan.messages[0].hint_max_split);
}

TEST(OomTextScannerTest, TwoMessagesOnOneLine) {
  const std::string one =
      "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 4.00 GiB total capacity; 3.00 GiB "
      "already allocated; 1.00 MiB free; 3.50 GiB reserved in total by PyTorch) ";
  const OomTextScan scan = ScanOomText(one + " | " + one.substr(0, 50) + "(GPU 1; ...)");
  ASSERT_EQ(scan.messages.size(), 2u);
  EXPECT_EQ(scan.messages[0].gpu, 0);
  EXPECT_EQ(scan.messages[1].gpu, 1);
}

TEST(OomTextScannerTest, HugeInputIsScannedInBoundedMemory) {
  // 200 000 noise lines, a message, more noise: found at its line, nothing else kept.
  std::string text;
  for (int i = 0; i < 200000; ++i) text += "step " + std::to_string(i) + " loss 0.5 GiB free\n";
  text +=
      "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 4.00 GiB total capacity; 3.00 GiB "
      "already allocated; 1.00 MiB free; 3.50 GiB reserved in total by PyTorch)\n";
  for (int i = 0; i < 1000; ++i) text += "noise\n";
  const OomTextScan scan = ScanOomText(text);
  ASSERT_EQ(scan.messages.size(), 1u);
  EXPECT_EQ(scan.messages[0].line, 200001u);
  EXPECT_EQ(scan.lines, 201001u);
}

TEST(OomTextScannerTest, LongLinesAreCut) {
  OomTextLimits limits;
  limits.max_line_bytes = 1000;
  std::string line(5000, 'x');
  line += " CUDA out of memory. Tried to allocate 2.00 MiB";  // beyond the cut: not seen
  const OomTextScan scan = ScanOomText(line + "\nnext\n", limits);
  EXPECT_TRUE(scan.messages.empty());
  EXPECT_EQ(scan.cut_lines, 1u);
}

TEST(OomTextScannerTest, MessageCapMarksTruncated) {
  OomTextLimits limits;
  limits.max_message_bytes = 200;
  const std::string text =
      "CUDA out of memory. Tried to allocate 2.00 MiB " + std::string(1000, 'y') + "\n";
  const OomTextScan scan = ScanOomText(text, limits);
  ASSERT_EQ(scan.messages.size(), 1u);
  EXPECT_TRUE(scan.messages[0].text_truncated);
  EXPECT_LE(scan.messages[0].text.size(), 200u);
  EXPECT_EQ(scan.messages[0].tried, MiB(2));
}

TEST(OomTextScannerTest, ContinuationStopsAtMaxLines) {
  std::string text = "CUDA out of memory. Tried to allocate 2.00 MiB\n";
  for (int i = 0; i < 100; ++i) text += "more text\n";
  const OomTextScan scan = ScanOomText(text);
  ASSERT_EQ(scan.messages.size(), 1u);
  EXPECT_EQ(scan.messages[0].last_line, OomTextLimits{}.max_message_lines);
  EXPECT_TRUE(scan.messages[0].text_truncated);
}

TEST(OomTextScannerTest, DistinctMessagesBeyondTheLimitAreCounted) {
  OomTextLimits limits;
  limits.max_messages = 10;
  std::string text;
  for (int i = 0; i < 25; ++i) {
    text += "CUDA out of memory. Tried to allocate " + std::to_string(i + 1) + ".00 MiB\n\n";
  }
  text += "CUDA out of memory. Tried to allocate 1.00 MiB\n";  // a repeat of the first
  const OomTextScan scan = ScanOomText(text, limits);
  EXPECT_EQ(scan.messages.size(), 10u);
  EXPECT_EQ(scan.dropped_messages, 15u);
  EXPECT_EQ(scan.messages[0].repeats, 2u);
}

TEST(OomTextScannerTest, ReadsFilesInChunksWithLongLinesAndNoFinalNewline) {
  // A 3 MiB line (cut at the 1 MiB limit, across many 64 KiB read chunks), then a message on
  // the last line, which has no '\n'.
  const std::string path = testing::MakeTempDir() + "/long.log";
  {
    std::ofstream out(path, std::ios::binary);
    out << std::string(3 << 20, 'z') << "\n";
    out << "[rank7]: CUDA out of memory. Tried to allocate 2.00 MiB (GPU 7; 4.00 GiB total "
           "capacity; 3.00 GiB already allocated; 1.00 MiB free; 3.50 GiB reserved in total by "
           "PyTorch)";
  }
  Result<OomTextScan> scan = ReadOomText(path);
  ASSERT_TRUE(scan.ok()) << scan.status().ToString();
  EXPECT_EQ(scan->lines, 2u);
  EXPECT_EQ(scan->cut_lines, 1u);
  ASSERT_EQ(scan->messages.size(), 1u);
  EXPECT_EQ(scan->messages[0].line, 2u);
  EXPECT_EQ(scan->messages[0].rank, 7);
  EXPECT_EQ(scan->messages[0].reserved, GiB(3.5));
  EXPECT_FALSE(scan->messages[0].text_truncated);
}

TEST(OomTextScannerTest, ReadErrorsNameThePath) {
  Result<OomTextScan> scan = ReadOomText("/nonexistent/oom.log");
  ASSERT_FALSE(scan.ok());
  EXPECT_NE(scan.status().message().find("/nonexistent/oom.log"), std::string::npos);
}

TEST(OomTextScannerTest, CachedWordingOf10To13) {
  // "M cached)" is reserved but unallocated; the message ends at its parenthesis.
  const OomTextScan scan = ScanOomText(
      "RuntimeError: CUDA out of memory. Tried to allocate 1.72 GiB (GPU 0; 10.76 GiB total "
      "capacity; 4.01 GiB already allocated; 356.00 MiB free; 5.54 GiB cached)   | 1/9 [00:00]\n"
      "next line of the log\n");
  ASSERT_EQ(scan.messages.size(), 1u);
  const OomMessage& m = scan.messages[0];
  EXPECT_EQ(m.wording, OomWording::kClassic);
  EXPECT_FALSE(m.reserved);
  ASSERT_TRUE(m.unallocated);
  EXPECT_EQ(*m.unallocated, static_cast<std::uint64_t>(5.54 * 1024 * 1024 * 1024 + 0.5));
  EXPECT_EQ(*m.Reserved(), *m.allocated + *m.unallocated);
  EXPECT_EQ(m.last_line, 1u);
  EXPECT_FALSE(m.text_truncated);
}

TEST(OomTextScannerTest, MessageQuotedFromTriedToAllocate) {
  const OomTextScan scan = ScanOomText(
      "it says:\n"
      "> Tried to allocate 20.00 MiB (GPU 1; 3.95 GiB total capacity; 3.02 GiB already "
      "allocated;\n"
      "> 12.44 MiB free; 3.10 GiB reserved in total by PyTorch)\n"
      "Tried to allocate memory, the buffer was too small\n"
      "Tried to allocate 1.00 GiB. GPU 0 has a total capacity of 63.98 GiB of which 600.00 MiB "
      "is free. Of the allocated memory 58.10 GiB is allocated by PyTorch, and 2.40 GiB is "
      "reserved by PyTorch but unallocated. If reserved but unallocated memory is large try "
      "setting PYTORCH_HIP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.\n");
  ASSERT_EQ(scan.messages.size(), 2u);
  EXPECT_TRUE(scan.messages[0].quoted);
  EXPECT_EQ(scan.messages[0].backend, "CUDA");
  EXPECT_EQ(scan.messages[0].line, 2u);
  EXPECT_EQ(scan.messages[0].last_line, 3u);
  EXPECT_TRUE(scan.messages[0].reserved);
  // "12.44 MiB free" wrapped to the start of a line is a figure, not a timestamp prefix.
  ASSERT_TRUE(scan.messages[0].free);
  EXPECT_EQ(*scan.messages[0].free, static_cast<std::uint64_t>(12.44 * 1024 * 1024 + 0.5));
  EXPECT_EQ(scan.messages[1].backend, "HIP");
  EXPECT_TRUE(scan.messages[1].unallocated);
}

TEST(OomTextScannerTest, TriedToAllocateInsideAFullMessageStartsNothing) {
  // On the trigger's line, and on the line after a first sentence wrapped on its own.
  const OomTextScan scan = ScanOomText(
      "CUDA out of memory. Tried to allocate 2.00 MiB (GPU 0; 1.00 GiB total capacity; 0 bytes "
      "already allocated; 0 bytes free; 0 bytes reserved in total by PyTorch)\n"
      "\n"
      "RuntimeError: CUDA out of memory.\n"
      "Tried to allocate 4.00 MiB (GPU 0; 1.00 GiB total capacity; 0 bytes already allocated; "
      "0 bytes free; 0 bytes reserved in total by PyTorch)\n");
  ASSERT_EQ(scan.messages.size(), 2u);
  EXPECT_FALSE(scan.messages[0].quoted);
  EXPECT_FALSE(scan.messages[1].quoted);
  EXPECT_EQ(*scan.messages[1].tried, 4 * 1024 * 1024u);
}

}  // namespace
}  // namespace fragscope::sources
