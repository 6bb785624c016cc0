// NvmlCollector against the stand-in libnvidia-ml builds (tests/testing/fake_nvml), loaded
// through the same dlopen path as the real library, with fixtures from tests/data/nvml.
#include "sources/gpu/nvml_collector.h"

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace fragscope::gpu {
namespace {

using ::fragscope::testing::SourcePath;

constexpr std::uint64_t kGiB = 1ULL << 30;

NvmlOptions FakeLibrary(const char* library, const std::string& fixture) {
  setenv("FRAGSCOPE_FAKE_NVML_FIXTURE", SourcePath("tests/data/nvml/" + fixture).c_str(), 1);
  NvmlOptions options;
  options.library_paths = {library};
  return options;
}

std::string Resolved(const NvmlCollector& c, const std::string& family) {
  for (const auto& [name, symbol] : c.ResolvedSymbols()) {
    if (name == family) return symbol;
  }
  return "(not looked up)";
}

Result<NodeGpuInfo> OpenAndCollect(const NvmlOptions& options,
                                   std::unique_ptr<NvmlCollector>* out = nullptr) {
  Result<std::unique_ptr<NvmlCollector>> c = NvmlCollector::Open(options);
  if (!c.ok()) return c.status();
  Result<NodeGpuInfo> node = (*c)->Collect();
  if (out != nullptr) *out = std::move(*c);
  return node;
}

TEST(NvmlCollectorTest, HappyPathReadsEveryFieldWithTheNewestSymbols) {
  std::unique_ptr<NvmlCollector> c;
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_FULL, "node2.txt"), &c);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->driver_version, "535.104.05");
  EXPECT_EQ(node->nvml_version, "12.535.104.05");
  EXPECT_EQ(node->cuda_driver_version, 12020);
  EXPECT_EQ(node->nvml_library, FAKE_NVML_FULL);
  EXPECT_TRUE(node->nvml_unavailable_reason.empty());
  EXPECT_TRUE(node->errors.empty());
  ASSERT_EQ(node->gpus.size(), 2u);

  const GpuInfo& g0 = node->gpus[0];
  EXPECT_TRUE(g0.from_nvml);
  EXPECT_FALSE(g0.from_procfs);
  EXPECT_EQ(g0.index, 0u);
  EXPECT_EQ(g0.uuid, "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0");
  EXPECT_EQ(g0.name, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(g0.pci_bus_id, "00000000:3B:00.0");
  EXPECT_EQ(g0.memory_total_bytes, 80 * kGiB);
  EXPECT_EQ(g0.memory_used_bytes, 20 * kGiB);
  EXPECT_EQ(g0.memory_free_bytes, 63887343616u);
  EXPECT_EQ(g0.memory_reserved_bytes, 537165824u);
  EXPECT_EQ(g0.bar1_total_bytes, 128 * kGiB);
  EXPECT_EQ(g0.bar1_used_bytes, 3145728u);
  EXPECT_EQ(g0.bar1_free_bytes, 137435807744u);
  ASSERT_EQ(g0.processes.size(), 2u);
  EXPECT_EQ(g0.processes[0].pid, 4242u);
  EXPECT_EQ(g0.processes[0].used_memory_bytes, 20401094656u);
  EXPECT_FALSE(g0.processes[0].gpu_instance_id.has_value());  // 0xFFFFFFFF: not MIG
  EXPECT_EQ(g0.processes[1].pid, 4243u);
  EXPECT_FALSE(g0.processes[1].used_memory_bytes.has_value());  // NVML_VALUE_NOT_AVAILABLE
  EXPECT_FALSE(g0.mig_enabled);
  EXPECT_TRUE(g0.errors.empty());

  const GpuInfo& g1 = node->gpus[1];
  EXPECT_EQ(g1.index, 1u);
  EXPECT_EQ(g1.uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(g1.memory_used_bytes, 0u);
  EXPECT_TRUE(g1.processes.empty());

  EXPECT_EQ(Resolved(*c, "nvmlInit"), "nvmlInit_v2");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetCount"), "nvmlDeviceGetCount_v2");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetHandleByIndex"), "nvmlDeviceGetHandleByIndex_v2");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetPciInfo"), "nvmlDeviceGetPciInfo_v3");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetMemoryInfo"), "nvmlDeviceGetMemoryInfo_v2");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetComputeRunningProcesses"),
            "nvmlDeviceGetComputeRunningProcesses_v3");
  EXPECT_EQ(c->process_info_stride(), 24u);
}

TEST(NvmlCollectorTest, OldDriverWithOnlyUnversionedSymbols) {
  std::unique_ptr<NvmlCollector> c;
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_OLD, "node2.txt"), &c);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(Resolved(*c, "nvmlInit"), "nvmlInit");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetCount"), "nvmlDeviceGetCount");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetMemoryInfo"), "");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetMemoryInfo (v1)"), "nvmlDeviceGetMemoryInfo");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetBAR1MemoryInfo"), "");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetMigMode"), "");
  EXPECT_EQ(Resolved(*c, "nvmlDeviceGetComputeRunningProcesses"),
            "nvmlDeviceGetComputeRunningProcesses");
  // No version queries in this library: unknown, not an error.
  EXPECT_EQ(node->driver_version, "");
  EXPECT_FALSE(node->cuda_driver_version.has_value());
  EXPECT_TRUE(node->errors.empty());
  ASSERT_EQ(node->gpus.size(), 2u);
  const GpuInfo& g0 = node->gpus[0];
  EXPECT_TRUE(g0.errors.empty()) << g0.errors[0];
  EXPECT_EQ(g0.uuid, "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0");
  EXPECT_EQ(g0.pci_bus_id, "0000:3B:00.0");  // the old 16-byte field
  EXPECT_EQ(g0.memory_total_bytes, 80 * kGiB);
  // v1's "used" includes what v2 calls reserved; reserved itself is unknown.
  EXPECT_EQ(g0.memory_used_bytes, 20 * kGiB + 537165824u);
  EXPECT_FALSE(g0.memory_reserved_bytes.has_value());
  EXPECT_FALSE(g0.bar1_total_bytes.has_value());
  EXPECT_FALSE(g0.mig_enabled);
  ASSERT_EQ(g0.processes.size(), 2u);
  EXPECT_EQ(c->process_info_stride(), 16u);
  EXPECT_EQ(g0.processes[0].pid, 4242u);
  EXPECT_EQ(g0.processes[0].used_memory_bytes, 20401094656u);
  EXPECT_EQ(g0.processes[1].pid, 4243u);
  EXPECT_FALSE(g0.processes[1].used_memory_bytes.has_value());
}

TEST(NvmlCollectorTest, R535ProcessRecordsAreReadAtTheirRealStride) {
  std::unique_ptr<NvmlCollector> c;
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_R535, "mig.txt"), &c);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(c->process_info_stride(), 32u);
  ASSERT_EQ(node->gpus.size(), 1u);
  const std::vector<GpuProcess>& p = node->gpus[0].processes;
  ASSERT_EQ(p.size(), 2u);
  // Read at 24 bytes, the second record would start inside the first one's
  // usedGpuCcProtectedMemory and read pid 0.
  EXPECT_EQ(p[0].pid, 1001u);
  EXPECT_EQ(p[0].used_memory_bytes, 8388608000u);
  EXPECT_EQ(p[0].gpu_instance_id, 1u);
  EXPECT_EQ(p[0].compute_instance_id, 0u);
  EXPECT_EQ(p[1].pid, 1002u);
  EXPECT_EQ(p[1].used_memory_bytes, 4194304000u);
  EXPECT_EQ(p[1].gpu_instance_id, 5u);
}

TEST(NvmlCollectorTest, R535StrideWithOneProcessAndMemoryNotAvailable) {
  std::unique_ptr<NvmlCollector> c;
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_R535, "node2.txt"), &c);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(c->process_info_stride(), 32u);
  ASSERT_EQ(node->gpus[0].processes.size(), 2u);
  EXPECT_EQ(node->gpus[0].processes[1].pid, 4243u);
  EXPECT_FALSE(node->gpus[0].processes[1].used_memory_bytes.has_value());
}

TEST(NvmlCollectorTest, InferStrideFromWhereTheRecordsLand) {
  // Three records of each size written over a sentinel-filled buffer.
  for (std::size_t stride : {16u, 24u, 32u}) {
    std::vector<unsigned char> buffer(4 * 32, 0xA5);
    for (std::uint32_t i = 0; i < 3; ++i) {
      unsigned char record[32] = {};
      const std::uint32_t pid = 100 + i;
      const std::uint64_t used = (i + 1) * kGiB;
      std::memcpy(record, &pid, 4);
      std::memcpy(record + 8, &used, 8);
      if (stride >= 24) std::memset(record + 16, 0xFF, 8);
      std::memcpy(buffer.data() + i * stride, record, stride);
    }
    EXPECT_EQ(InferProcessInfoStride(buffer.data(), buffer.size(), 3, 0xA5), stride) << stride;
  }
  // Nothing written where 2 records should be: no stride fits.
  std::vector<unsigned char> empty(64, 0xA5);
  EXPECT_EQ(InferProcessInfoStride(empty.data(), empty.size(), 2, 0xA5), 0u);
  // Bytes written but the pids are implausible (0, or above PID_MAX_LIMIT).
  std::vector<unsigned char> zeros(64, 0xA5);
  std::memset(zeros.data(), 0, 48);
  EXPECT_EQ(InferProcessInfoStride(zeros.data(), zeros.size(), 2, 0xA5), 0u);
  EXPECT_EQ(InferProcessInfoStride(zeros.data(), zeros.size(), 0, 0xA5), 0u);
}

TEST(NvmlCollectorTest, MigInstancesWithAnEmptySlot) {
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_FULL, "mig.txt"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  ASSERT_EQ(node->gpus.size(), 1u);
  const GpuInfo& g = node->gpus[0];
  EXPECT_TRUE(g.errors.empty()) << g.errors[0];
  EXPECT_TRUE(g.mig_enabled);
  ASSERT_EQ(g.mig_instances.size(), 2u);
  EXPECT_EQ(g.mig_instances[0].index, 0u);
  EXPECT_EQ(g.mig_instances[0].uuid, "MIG-aaaaaaaa-1111-2222-3333-444444444444");
  EXPECT_EQ(g.mig_instances[0].gpu_instance_id, 1u);
  EXPECT_EQ(g.mig_instances[0].compute_instance_id, 0u);
  EXPECT_EQ(g.mig_instances[0].memory_total_bytes, 40 * kGiB);
  EXPECT_EQ(g.mig_instances[0].memory_used_bytes, 8 * kGiB);
  EXPECT_EQ(g.mig_instances[0].memory_free_bytes, 32 * kGiB);
  EXPECT_EQ(g.mig_instances[1].index, 2u);
  EXPECT_EQ(g.mig_instances[1].gpu_instance_id, 5u);
  EXPECT_EQ(g.mig_instances[1].memory_total_bytes, 20 * kGiB);
  ASSERT_EQ(g.processes.size(), 2u);
  EXPECT_EQ(g.processes[1].gpu_instance_id, 5u);
}

TEST(NvmlCollectorTest, RefusedCallsBecomeMessagesAndLeaveFieldsUnknown) {
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_FULL, "errors.txt"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  ASSERT_EQ(node->gpus.size(), 2u);
  const GpuInfo& g0 = node->gpus[0];
  ASSERT_EQ(g0.errors.size(), 1u);
  EXPECT_EQ(g0.errors[0], "nvmlDeviceGetBAR1MemoryInfo(GPU 0): GPU is lost (code 15)");
  EXPECT_FALSE(g0.bar1_total_bytes.has_value());
  EXPECT_EQ(g0.memory_total_bytes, 80 * kGiB);  // the rest of GPU 0 is still there
  EXPECT_EQ(g0.processes.size(), 1u);
  EXPECT_FALSE(g0.mig_enabled);  // MIG mode "not supported": no error

  const GpuInfo& g1 = node->gpus[1];
  ASSERT_EQ(g1.errors.size(), 1u);
  EXPECT_EQ(g1.errors[0], "nvmlDeviceGetMemoryInfo_v2(GPU 1): Insufficient Permissions (code 4)");
  EXPECT_FALSE(g1.memory_total_bytes.has_value());
  EXPECT_FALSE(g1.memory_used_bytes.has_value());
  EXPECT_TRUE(g1.processes.empty());  // "not supported": unknown, no message
  EXPECT_EQ(g1.uuid, "GPU-11111111-2222-3333-4444-555555555555");
}

TEST(NvmlCollectorTest, ErrorTextWithoutNvmlErrorString) {
  // The old build has no nvmlErrorString: our own table names the code.
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_OLD, "old_errors.txt"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  ASSERT_EQ(node->gpus.size(), 1u);
  ASSERT_EQ(node->gpus[0].errors.size(), 1u);
  EXPECT_EQ(node->gpus[0].errors[0],
            "nvmlDeviceGetMemoryInfo(GPU 0): Insufficient Permissions (code 4)");
}

TEST(NvmlCollectorTest, RefusedGpuCountFailsTheCollection) {
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_FULL, "count_fails.txt"));
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().message(), "nvmlDeviceGetCount_v2: Insufficient Permissions (code 4)");
  NodeGpuInfo state = CollectNvml(FakeLibrary(FAKE_NVML_FULL, "count_fails.txt"));
  EXPECT_EQ(state.nvml_unavailable_reason,
            "nvmlDeviceGetCount_v2: Insufficient Permissions (code 4)");
  EXPECT_TRUE(state.gpus.empty());
}

TEST(NvmlCollectorTest, ZeroGpus) {
  Result<NodeGpuInfo> node = OpenAndCollect(FakeLibrary(FAKE_NVML_FULL, "zero.txt"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_TRUE(node->gpus.empty());
  EXPECT_EQ(node->driver_version, "535.104.05");
  EXPECT_TRUE(node->nvml_unavailable_reason.empty());
}

TEST(NvmlCollectorTest, MissingLibraryIsAClearNonFatalState) {
  NvmlOptions options;
  options.library_paths = {"/nonexistent/libnvidia-ml.so.1", "libfragscope-no-such-nvml.so"};
  Result<std::unique_ptr<NvmlCollector>> c = NvmlCollector::Open(options);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kNotFound);
  EXPECT_NE(c.status().message().find("/nonexistent/libnvidia-ml.so.1"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("libfragscope-no-such-nvml.so"), std::string::npos);

  NodeGpuInfo node = CollectNvml(options);
  EXPECT_TRUE(node.gpus.empty());
  EXPECT_EQ(node.nvml_unavailable_reason, c.status().message());
}

TEST(NvmlCollectorTest, FallsBackToTheNextLibraryPath) {
  NvmlOptions options = FakeLibrary(FAKE_NVML_FULL, "zero.txt");
  options.library_paths.insert(options.library_paths.begin(), "/nonexistent/libnvidia-ml.so.1");
  Result<std::unique_ptr<NvmlCollector>> c = NvmlCollector::Open(options);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ((*c)->library(), FAKE_NVML_FULL);
}

TEST(NvmlCollectorTest, MissingMandatorySymbolIsAClearError) {
  Result<std::unique_ptr<NvmlCollector>> c =
      NvmlCollector::Open(FakeLibrary(FAKE_NVML_NOINIT, "node2.txt"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnimplemented);
  EXPECT_EQ(c.status().message(), std::string(FAKE_NVML_NOINIT) +
                                      ": does not export nvmlInit_v2 or nvmlInit (not a "
                                      "usable NVML library)");
}

TEST(NvmlCollectorTest, NotAnNvmlLibraryAtAll) {
  // A real shared library without any NVML function.
  NvmlOptions options;
  options.library_paths = {"libz.so.1"};
  Result<std::unique_ptr<NvmlCollector>> c = NvmlCollector::Open(options);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("does not export nvmlInit_v2 or nvmlInit"), std::string::npos)
      << c.status().message();
}

TEST(NvmlCollectorTest, InitFailureNamesTheFunctionAndCode) {
  Result<std::unique_ptr<NvmlCollector>> c =
      NvmlCollector::Open(FakeLibrary(FAKE_NVML_FULL, "init_fails.txt"));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(),
            std::string(FAKE_NVML_FULL) + ": nvmlInit_v2: Driver Not Loaded (code 9)");
  // No fixture at all: the stand-in answers "driver not loaded" too.
  unsetenv("FRAGSCOPE_FAKE_NVML_FIXTURE");
  NvmlOptions options;
  options.library_paths = {FAKE_NVML_FULL};
  NodeGpuInfo node = CollectNvml(options);
  EXPECT_NE(node.nvml_unavailable_reason.find("Driver Not Loaded (code 9)"), std::string::npos);
}

TEST(NvmlCollectorTest, CollectsAgainAfterReopening) {
  for (int i = 0; i < 3; ++i) {
    NodeGpuInfo node = CollectNvml(FakeLibrary(FAKE_NVML_FULL, "node2.txt"));
    ASSERT_TRUE(node.nvml_unavailable_reason.empty()) << node.nvml_unavailable_reason;
    EXPECT_EQ(node.gpus.size(), 2u);
  }
}

}  // namespace
}  // namespace fragscope::gpu
