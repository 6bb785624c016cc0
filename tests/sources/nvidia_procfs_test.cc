// The /proc/driver/nvidia reader over the fixture folders in tests/data/procfs, and the join
// with NVML's view.
#include "sources/gpu/nvidia_procfs.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "testing/test_util.h"

namespace fragscope::gpu {
namespace {

using ::fragscope::testing::MakeTempDir;
using ::fragscope::testing::SourcePath;

ProcfsOptions Root(const std::string& name) {
  ProcfsOptions options;
  options.root = SourcePath("tests/data/procfs/" + name);
  return options;
}

TEST(NvidiaProcfsTest, TwoGpuNode) {
  Result<NodeGpuInfo> node = ReadNvidiaProcfs(Root("node2"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->driver_version, "535.104.05");
  EXPECT_TRUE(node->errors.empty());
  ASSERT_EQ(node->gpus.size(), 2u);
  const GpuInfo& g = node->gpus[0];
  EXPECT_TRUE(g.from_procfs);
  EXPECT_FALSE(g.from_nvml);
  EXPECT_EQ(g.model, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(g.irq, 142u);
  EXPECT_EQ(g.uuid, "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0");
  EXPECT_EQ(g.video_bios, "92.00.45.00.06");
  EXPECT_EQ(g.bus_type, "PCIe");
  EXPECT_EQ(g.dma_size, "47 bits");
  EXPECT_EQ(g.dma_mask, "0x7fffffffffff");
  EXPECT_EQ(g.bus_location, "0000:3b:00.0");
  EXPECT_EQ(g.pci_bus_id, "00000000:3B:00.0");  // NVML's spelling, to compare with it
  EXPECT_EQ(g.device_minor, 0u);
  EXPECT_EQ(g.firmware, "535.104.05");
  EXPECT_EQ(g.excluded, false);
  EXPECT_TRUE(g.errors.empty());
  EXPECT_FALSE(g.memory_total_bytes.has_value());  // /proc says nothing about memory
  EXPECT_EQ(node->gpus[1].uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(node->gpus[1].device_minor, 1u);
}

TEST(NvidiaProcfsTest, ExcludedGpuAndOpenKernelModuleVersion) {
  Result<NodeGpuInfo> node = ReadNvidiaProcfs(Root("excluded"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->driver_version, "550.54.15");
  ASSERT_EQ(node->gpus.size(), 2u);
  EXPECT_EQ(node->gpus[0].excluded, false);
  EXPECT_EQ(node->gpus[1].excluded, true);
  EXPECT_EQ(node->gpus[1].uuid, "GPU-deadbeef-0000-1111-2222-333333333333");
}

TEST(NvidiaProcfsTest, GarbageLinesAreIgnoredAndBadValuesNamed) {
  const std::string root = SourcePath("tests/data/procfs/garbage");
  Result<NodeGpuInfo> node = ReadNvidiaProcfs(Root("garbage"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ(node->driver_version, "");
  ASSERT_EQ(node->errors.size(), 1u);
  EXPECT_EQ(node->errors[0], root + "/version: no driver version on an 'NVRM version:' line");
  ASSERT_EQ(node->gpus.size(), 1u);
  const GpuInfo& g = node->gpus[0];
  const std::string path = root + "/gpus/0000:3b:00.0/information";
  ASSERT_EQ(g.errors.size(), 4u);
  EXPECT_EQ(g.errors[0], path + ":3: IRQ: 'lots' is not a number");
  EXPECT_EQ(g.errors[1], path + ":6: Device Minor: '-1' is not a number");
  EXPECT_EQ(g.errors[2], path + ":7: GPU Excluded: 'Maybe' is neither Yes nor No");
  EXPECT_EQ(g.errors[3], path + ":8: Video BIOS: value has control characters");
  // The good lines around them are read (CRLF endings included).
  EXPECT_EQ(g.model, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(g.uuid, "GPU-0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0");
  EXPECT_EQ(g.bus_location, "0000:3b:00.0");
  EXPECT_EQ(g.firmware, "N/A");
  EXPECT_FALSE(g.irq.has_value());
  EXPECT_FALSE(g.device_minor.has_value());
  EXPECT_FALSE(g.excluded.has_value());
  EXPECT_EQ(g.video_bios, "");
}

TEST(NvidiaProcfsTest, MissingFilesAreNamedAndTheRestIsRead) {
  const std::string root = SourcePath("tests/data/procfs/missing");
  Result<NodeGpuInfo> node = ReadNvidiaProcfs(Root("missing"));
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  ASSERT_EQ(node->errors.size(), 1u);
  EXPECT_EQ(node->errors[0], root + "/version: cannot open: No such file or directory");
  ASSERT_EQ(node->gpus.size(), 2u);
  const GpuInfo& broken = node->gpus[0];
  ASSERT_EQ(broken.errors.size(), 1u);
  EXPECT_EQ(broken.errors[0],
            root + "/gpus/0000:3b:00.0/information: cannot open: No such file or directory");
  EXPECT_TRUE(broken.from_procfs);
  EXPECT_EQ(broken.bus_location, "0000:3b:00.0");  // from the folder's name
  EXPECT_EQ(broken.uuid, "");
  EXPECT_EQ(node->gpus[1].uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_TRUE(node->gpus[1].errors.empty());
}

TEST(NvidiaProcfsTest, MissingRootIsNotFound) {
  ProcfsOptions options;
  options.root = "/nonexistent/proc/driver/nvidia";
  Result<NodeGpuInfo> node = ReadNvidiaProcfs(options);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(node.status().message(),
            "/nonexistent/proc/driver/nvidia: no such directory (is the NVIDIA kernel "
            "module loaded?)");
  // A file where the folder should be.
  options.root = SourcePath("tests/data/procfs/node2/version");
  node = ReadNvidiaProcfs(options);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().message(), options.root + ": not a directory");
}

TEST(NvidiaProcfsTest, RootWithoutGpusFolderHasNoGpus) {
  const std::string dir = MakeTempDir();
  std::ofstream(dir + "/version") << "NVRM version: NVIDIA UNIX x86_64 Kernel Module  470.1  x\n";
  ProcfsOptions options;
  options.root = dir;
  Result<NodeGpuInfo> node = ReadNvidiaProcfs(options);
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->driver_version, "470.1");
  EXPECT_TRUE(node->gpus.empty());
  EXPECT_TRUE(node->errors.empty());
}

TEST(NvidiaProcfsTest, ReadsAreBounded) {
  ProcfsOptions options = Root("node2");
  options.max_file_bytes = 100;  // the information files are bigger than this
  Result<NodeGpuInfo> node = ReadNvidiaProcfs(options);
  ASSERT_TRUE(node.ok());
  ASSERT_EQ(node->gpus.size(), 2u);
  ASSERT_EQ(node->gpus[0].errors.size(), 1u);
  EXPECT_EQ(node->gpus[0].errors[0],
            options.root + "/gpus/0000:3b:00.0/information: larger than the limit of 100 bytes");
  EXPECT_EQ(node->gpus[0].uuid, "");

  options.max_file_bytes = 64 * 1024;
  options.max_gpus = 1;
  node = ReadNvidiaProcfs(options);
  ASSERT_TRUE(node.ok());
  EXPECT_EQ(node->gpus.size(), 1u);
  ASSERT_EQ(node->errors.size(), 1u);
  EXPECT_EQ(node->errors[0], options.root + "/gpus: more than 1 entries; the rest are not read");
}

TEST(NvidiaProcfsTest, ParseDriverVersion) {
  EXPECT_EQ(ParseDriverVersion("NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  "
                               "Sat Aug 19 01:15:15 UTC 2023\n"),
            "535.104.05");
  EXPECT_EQ(ParseDriverVersion("GCC version: 12.2\nNVRM version: NVIDIA UNIX Open Kernel "
                               "Module for aarch64  560.35.03  Release Build"),
            "560.35.03");
  EXPECT_EQ(ParseDriverVersion("NVRM version: no number here"), "");
  EXPECT_EQ(ParseDriverVersion(""), "");
  EXPECT_EQ(ParseDriverVersion("NVRM version:"), "");
}

TEST(NvidiaProcfsTest, ParseInformationToleratesEveryByte) {
  // Every single byte value as a whole file, and a line cut in the middle: never a crash,
  // nothing but errors and unknown fields.
  for (int b = 0; b < 256; ++b) {
    const std::string text(1, static_cast<char>(b));
    GpuInfo g = ParseGpuInformation(text, "x");
    EXPECT_TRUE(g.uuid.empty());
  }
  GpuInfo g = ParseGpuInformation("GPU UUID: \t GPU-12", "x");
  EXPECT_EQ(g.uuid, "GPU-12");
  g = ParseGpuInformation("GPU UUID: \t not-a-uuid\nIRQ: 4294967296\n", "f");
  ASSERT_EQ(g.errors.size(), 2u);
  EXPECT_EQ(g.errors[0], "f:1: GPU UUID: 'not-a-uuid' is not a GPU UUID (GPU-…)");
  EXPECT_EQ(g.errors[1], "f:2: IRQ: '4294967296' is not a number");
}

NodeGpuInfo NvmlNode() {
  NodeGpuInfo node;
  node.driver_version = "535.104.05";
  GpuInfo a;
  a.from_nvml = true;
  a.index = 0;
  a.uuid = "GPU-0B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0";  // case differs from /proc's
  a.pci_bus_id = "00000000:3B:00.0";
  a.memory_total_bytes = 1;
  GpuInfo b;
  b.from_nvml = true;
  b.index = 1;
  b.uuid = "GPU-not-in-proc";
  node.gpus = {a, b};
  return node;
}

TEST(JoinGpuInfoTest, JoinsByUuidAndKeepsOneSidedGpus) {
  Result<NodeGpuInfo> procfs = ReadNvidiaProcfs(Root("node2"));
  ASSERT_TRUE(procfs.ok());
  NodeGpuInfo node = JoinGpuInfo(NvmlNode(), std::move(*procfs));
  ASSERT_EQ(node.gpus.size(), 3u);
  const GpuInfo& joined = node.gpus[0];
  EXPECT_TRUE(joined.from_nvml);
  EXPECT_TRUE(joined.from_procfs);
  EXPECT_EQ(joined.memory_total_bytes, 1u);
  EXPECT_EQ(joined.model, "NVIDIA A100-SXM4-80GB");
  EXPECT_EQ(joined.device_minor, 0u);
  EXPECT_EQ(joined.firmware, "535.104.05");
  EXPECT_EQ(joined.uuid, "GPU-0B1C2D3E-4F50-6172-8394-A5B6C7D8E9F0");  // NVML's spelling kept
  const GpuInfo& nvml_only = node.gpus[1];
  EXPECT_TRUE(nvml_only.from_nvml);
  EXPECT_FALSE(nvml_only.from_procfs);
  EXPECT_EQ(nvml_only.model, "");
  const GpuInfo& procfs_only = node.gpus[2];
  EXPECT_FALSE(procfs_only.from_nvml);
  EXPECT_TRUE(procfs_only.from_procfs);
  EXPECT_EQ(procfs_only.uuid, "GPU-11111111-2222-3333-4444-555555555555");
  EXPECT_EQ(procfs_only.pci_bus_id, "00000000:86:00.0");
}

TEST(JoinGpuInfoTest, WithoutNvmlEveryGpuComesFromProc) {
  NodeGpuInfo nvml;
  nvml.nvml_unavailable_reason = "libnvidia-ml.so.1: cannot open shared object file";
  Result<NodeGpuInfo> procfs = ReadNvidiaProcfs(Root("excluded"));
  ASSERT_TRUE(procfs.ok());
  NodeGpuInfo node = JoinGpuInfo(std::move(nvml), std::move(*procfs));
  EXPECT_EQ(node.nvml_unavailable_reason, "libnvidia-ml.so.1: cannot open shared object file");
  EXPECT_EQ(node.driver_version, "550.54.15");  // /proc's, as NVML has none
  ASSERT_EQ(node.gpus.size(), 2u);
  EXPECT_EQ(node.gpus[1].excluded, true);
}

TEST(JoinGpuInfoTest, GpusWithoutUuidAreNeverJoined) {
  NodeGpuInfo nvml;
  GpuInfo a;
  a.from_nvml = true;
  nvml.gpus.push_back(a);
  NodeGpuInfo procfs;
  procfs.procfs_unavailable_reason = "gone";
  procfs.errors.push_back("version: bad");
  GpuInfo b;
  b.from_procfs = true;
  procfs.gpus.push_back(b);
  NodeGpuInfo node = JoinGpuInfo(std::move(nvml), std::move(procfs));
  ASSERT_EQ(node.gpus.size(), 2u);
  EXPECT_FALSE(node.gpus[0].from_procfs);
  EXPECT_FALSE(node.gpus[1].from_nvml);
  EXPECT_EQ(node.procfs_unavailable_reason, "gone");
  ASSERT_EQ(node.errors.size(), 1u);
}

}  // namespace
}  // namespace fragscope::gpu
