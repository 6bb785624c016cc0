#include "sources/bfc_text/bfc_log.h"

#include <string>

#include <gtest/gtest.h>

namespace fragscope::sources {
namespace {

TEST(BfcLogTest, BinsFollowTheAllocatorsRule) {
  EXPECT_EQ(BfcBinForSize(1), 0);
  EXPECT_EQ(BfcBinForSize(511), 0);
  EXPECT_EQ(BfcBinForSize(512), 1);
  EXPECT_EQ(BfcBinForSize(std::uint64_t{256} << 20), 20);
  EXPECT_EQ(BfcBinForSize(std::uint64_t{1} << 40), 20);
  EXPECT_EQ(BfcRoundedBytes(1), 256u);
  EXPECT_EQ(BfcRoundedBytes(512), 512u);
}

// TensorFlow 1.x: the dump first, "Ran out of memory ... See logs" after it; 0x addresses,
// "Chunk at" for chunks in use, no "next".
TEST(BfcLogTest, Tf1DumpBeforeItsFirstLine) {
  const BfcLogScan scan = ScanBfcLog(
      "I tensorflow/core/common_runtime/bfc_allocator.cc:643] Bin (256): \tTotal Chunks: 1, "
      "Chunks in use: 1 256B allocated for chunks. 256B client-requested for chunks. 256B in use "
      "in bin. 4B client-requested in use in bin.\n"
      "I tensorflow/core/common_runtime/bfc_allocator.cc:678] Next region of size 2048\n"
      "I tensorflow/core/common_runtime/bfc_allocator.cc:687] Chunk at 0x1000 of size 256\n"
      "I tensorflow/core/common_runtime/bfc_allocator.cc:687] Free at 0x1100 of size 1792\n"
      "I tensorflow/core/common_runtime/bfc_allocator.cc:700] Sum Total of in-use chunks: 256B\n"
      "W tensorflow/core/common_runtime/bfc_allocator.cc:275] Ran out of memory trying to "
      "allocate 4.0KiB.  See logs for memory state.\n");
  ASSERT_EQ(scan.reports.size(), 1u);
  const BfcReport& r = scan.reports[0];
  EXPECT_EQ(r.request, 4096u);
  EXPECT_FALSE(r.request_exact);
  ASSERT_EQ(r.bins.size(), 1u);
  EXPECT_EQ(r.bins[0].chunks, 1u);
  EXPECT_TRUE(r.map_complete);
  EXPECT_EQ(r.map_in_use, 256u);
  EXPECT_EQ(r.map_largest_free, 1792u);
  EXPECT_EQ(r.sum_in_use, 256u);
  EXPECT_TRUE(r.notes.empty()) << r.notes.front();
}

// TF 2.x with timestamps and other writers' lines between the dump's; the Stats block's lines
// carry no prefix; Windows prints "next" before "of size".
TEST(BfcLogTest, Tf2InterleavedWithOtherOutput) {
  const BfcLogScan scan = ScanBfcLog(
      "2024-01-01 12:00:00.000001: W external/local_tsl/tsl/framework/bfc_allocator.cc:485] "
      "Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.00KiB (rounded to "
      "1024)requested by op MatMul\n"
      "Current allocation summary follows.\n"
      " 12/500 [>.....] - ETA: 1:02\n"
      "2024-01-01 12:00:00.000002: I tsl/framework/bfc_allocator.cc:1075] Next region of size "
      "1536\n"
      "2024-01-01 12:00:00.000003: I tsl/framework/bfc_allocator.cc:1095] InUse at "
      "00000006000F0000 next 1 of size 512\n"
      "[rank0]: unrelated\n"
      "2024-01-01 12:00:00.000004: I tsl/framework/bfc_allocator.cc:1095] Free  at "
      "00000006000F0200 next 18446744073709551615 of size 1024\n"
      "2024-01-01 12:00:00.000005: I tsl/framework/bfc_allocator.cc:1109] "
      "total_region_allocated_bytes_: 1536 memory_limit_: 1536 available bytes: 0 "
      "curr_region_allocation_bytes_: 3072\n"
      "2024-01-01 12:00:00.000006: I tsl/framework/bfc_allocator.cc:1115] Stats: \n"
      "Limit:                      1536\n"
      "InUse:                       512\n"
      "\n");
  ASSERT_EQ(scan.reports.size(), 1u);
  const BfcReport& r = scan.reports[0];
  EXPECT_EQ(r.allocator, "GPU_0_bfc");
  EXPECT_EQ(r.op, "MatMul");
  EXPECT_EQ(r.rounded, 1024u);
  EXPECT_EQ(r.region_bytes, 1536u);
  EXPECT_EQ(r.memory_limit, 1536u);
  EXPECT_EQ(r.Stat("InUse"), 512u);
  ASSERT_EQ(r.regions.size(), 1u);
  EXPECT_EQ(r.regions[0].chunks[0].addr, 0x6000F0000u);
  EXPECT_TRUE(r.map_complete);
  EXPECT_EQ(r.map_largest_free, 1024u);
}

// XLA: chunk tags, human-readable Stats (TF 2.21), the memory summary, then XLA's exact error.
TEST(BfcLogTest, XlaTagsSummaryAndExactRequest) {
  const BfcLogScan scan = ScanBfcLog(
      "W external/xla/xla/tsl/framework/bfc_allocator.cc:501] Allocator (GPU_0_bfc) ran out of "
      "memory trying to allocate 1.00KiB (rounded to 1024) from the lower end requested by op \n"
      "I bfc_allocator.cc:1085] Next region of size 768\n"
      "I bfc_allocator.cc:1090] InUse at 7a0000000000 of size 512 tag lower next 1\n"
      "I bfc_allocator.cc:1090] Free  at 7a0000000200 of size 256 tag lower next "
      "18446744073709551615\n"
      "I bfc_allocator.cc:1125] Allocator memory summary: rounded request 1.0KiB, total free in "
      "pool 256B, largest free chunk usable by lower end 256B, unallocated bytes 0B, pool size "
      "768B, pool limit 768B\n"
      "I bfc_allocator.cc:1147] Stats: \n"
      "Limit:                  768B\n"
      "\n"
      "jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
      "allocate 1000 bytes.\n");
  ASSERT_EQ(scan.reports.size(), 1u);
  const BfcReport& r = scan.reports[0];
  EXPECT_EQ(r.request, 1000u);
  EXPECT_TRUE(r.request_exact);
  EXPECT_EQ(r.summary_largest, 256u);
  EXPECT_EQ(r.memory_limit, 768u);
  EXPECT_EQ(r.Stat("Limit"), 768u);
  EXPECT_EQ(r.regions[0].chunks[0].tag, "lower");
  EXPECT_EQ(scan.context.framework, "jax");
}

TEST(BfcLogTest, SoftFailuresStartNoReport) {
  const BfcLogScan scan = ScanBfcLog(
      "W bfc_allocator.cc:245] Allocator (GPU_0_bfc) ran out of memory trying to allocate "
      "272.00MiB with freed_by_count=0. The caller indicates that this is not a failure, but may "
      "mean that there could be performance gains if more memory were available.\n");
  EXPECT_TRUE(scan.reports.empty());
  EXPECT_EQ(scan.context.soft_failures, 1u);
}

TEST(BfcLogTest, CudaMallocAsyncAndItsPool) {
  const BfcLogScan scan = ScanBfcLog(
      "E0101 gpu_cudamallocasync_allocator.cc:361] gpu_async_0 cuMemAllocAsync failed to "
      "allocate 4096 bytes: CUDA error: out of memory (CUDA_ERROR_OUT_OF_MEMORY)\n"
      " Reported by CUDA: Free memory/Total memory: 1024/8192\n"
      "E0101 gpu_cudamallocasync_allocator.cc:366] Stats: Limit:       0\n"
      "InUse:                     2048\n"
      "E0101 gpu_cudamallocasync_allocator.cc:102] CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: 3072\n"
      "E0101 gpu_cudamallocasync_allocator.cc:103] CU_MEMPOOL_ATTR_USED_MEM_CURRENT: 2048\n");
  ASSERT_EQ(scan.reports.size(), 1u);
  const BfcReport& r = scan.reports[0];
  EXPECT_EQ(r.kind, BfcReportKind::kCudaMallocAsync);
  EXPECT_EQ(r.allocator, "gpu_async_0");
  EXPECT_EQ(r.request, 4096u);
  EXPECT_EQ(r.device_free, 1024u);
  EXPECT_EQ(r.device_total, 8192u);
  EXPECT_EQ(r.pool_reserved, 3072u);
  EXPECT_EQ(r.pool_used, 2048u);
  EXPECT_EQ(r.Stat("Limit"), 0u);
  EXPECT_EQ(r.Stat("InUse"), 2048u);
}

// Cut in the middle of the map: the report stays, its map is marked incomplete.
TEST(BfcLogTest, TruncatedMapIsIncomplete) {
  const BfcLogScan scan = ScanBfcLog(
      "Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.0KiB (rounded to 1024)\n"
      "Next region of size 4096\n"
      "InUse at 1000 of size 512 next 1\n"
      "Free  at 1200 of siz");
  ASSERT_EQ(scan.reports.size(), 1u);
  EXPECT_FALSE(scan.reports[0].map_complete);
  EXPECT_EQ(scan.reports[0].map_in_use, 512u);
}

// Two dumps: both kept, only the last with its chunk map.
TEST(BfcLogTest, SeveralDumpsKeepTheLastMap) {
  const std::string dump =
      "Allocator (GPU_0_bfc) ran out of memory trying to allocate 1.0KiB (rounded to 1024)\n"
      "Next region of size 768\n"
      "InUse at 1000 of size 512 next 1\n"
      "Free  at 1200 of size 256 next 18446744073709551615\n";
  const BfcLogScan scan = ScanBfcLog(dump + "other output\n" + dump);
  ASSERT_EQ(scan.reports.size(), 2u);
  EXPECT_TRUE(scan.reports[0].regions.empty());
  EXPECT_EQ(scan.reports[0].map_largest_free, 256u);
  EXPECT_EQ(scan.reports[1].regions.size(), 1u);
  EXPECT_EQ(scan.reports[1].line, 6u);
}

// Hostile: sizes beyond 2^60, a chunk map beyond the limit, chunks that overlap.
TEST(BfcLogTest, HostileInputIsBoundedAndNamedByLine) {
  BfcLogLimits limits;
  limits.max_chunks = 2;
  const BfcLogScan scan = ScanBfcLog(
      "Allocator (X) ran out of memory trying to allocate 1.0KiB (rounded to 1024)\n"
      "Next region of size 99999999999999999999999\n"
      "InUse at 1000 of size 9999999999999999999 next 1\n"
      "InUse at 1000 of size 512 next 1\n"
      "InUse at 1100 of size 512 next 1\n"
      "InUse at 1300 of size 512 next 1\n",
      limits);
  ASSERT_EQ(scan.reports.size(), 1u);
  const BfcReport& r = scan.reports[0];
  EXPECT_EQ(r.chunks, 4u);
  EXPECT_TRUE(r.chunks_dropped);
  ASSERT_FALSE(r.notes.empty());
  EXPECT_EQ(r.notes[0].rfind("line 3: a chunk line without a readable", 0), 0u) << r.notes[0];
  std::size_t kept = 0;
  for (const BfcRegion& g : r.regions) kept += g.chunks.size();
  EXPECT_EQ(kept, 2u);
  EXPECT_FALSE(r.map_complete);
}

}  // namespace
}  // namespace fragscope::sources
