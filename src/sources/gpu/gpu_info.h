// GpuInfo: what the node knows about one GPU from outside any process: NVML (memory totals,
// BAR1, compute processes, MIG) joined with /proc/driver/nvidia (driver, device minor,
// firmware) by UUID. Plain data: the collectors fill it; the exporter and the daemon read it.
// Neither interface exposes the caching allocator's layout (docs/gpu-sources.md says why).
//
// Thread safety: plain values.
#ifndef FRAGSCOPE_SOURCES_GPU_GPU_INFO_H_
#define FRAGSCOPE_SOURCES_GPU_GPU_INFO_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace fragscope::gpu {

struct GpuProcess {
  std::uint32_t pid = 0;
  std::optional<std::uint64_t> used_memory_bytes;  // nullopt: NVML reported "not available"
  std::optional<std::uint32_t> gpu_instance_id;    // MIG only
  std::optional<std::uint32_t> compute_instance_id;
};

struct MigInstance {
  std::uint32_t index = 0;  // MIG device index under its parent
  std::string uuid;         // "MIG-…"
  std::optional<std::uint32_t> gpu_instance_id;
  std::optional<std::uint32_t> compute_instance_id;
  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<std::uint64_t> memory_used_bytes;
  std::optional<std::uint64_t> memory_free_bytes;
};

struct GpuInfo {
  // Identity. `uuid` is the key ("GPU-…"); the rest may be empty/unknown.
  std::string uuid;
  std::optional<std::uint32_t> index;  // NVML index
  std::string pci_bus_id;              // "00000000:3B:00.0"
  std::string name;                    // "NVIDIA A100-SXM4-80GB"
  // Memory (NVML). `memory_reserved_bytes` only from the v2 struct.
  std::optional<std::uint64_t> memory_total_bytes;
  std::optional<std::uint64_t> memory_used_bytes;
  std::optional<std::uint64_t> memory_free_bytes;
  std::optional<std::uint64_t> memory_reserved_bytes;
  std::optional<std::uint64_t> bar1_total_bytes;
  std::optional<std::uint64_t> bar1_used_bytes;
  std::optional<std::uint64_t> bar1_free_bytes;
  std::vector<GpuProcess> processes;  // compute processes
  bool mig_enabled = false;
  std::vector<MigInstance> mig_instances;
  // /proc/driver/nvidia/gpus/<bus>/information.
  std::string model;  // "Model:" line
  std::optional<std::uint32_t> device_minor;
  std::string firmware;  // "GPU Firmware:" line
  std::optional<bool> excluded;
  // More of the information file (added by the procfs reader; empty/unknown when absent).
  std::string bus_location;  // "0000:3b:00.0" as the file writes it
  std::string video_bios;
  std::string bus_type;  // "PCIe"
  std::optional<std::uint32_t> irq;
  std::string dma_size;  // "47 bits"
  std::string dma_mask;  // "0x7fffffffffff"
  // What a source refused or could not parse for this GPU ("nvmlDeviceGetMemoryInfo_v2(GPU 1):
  // Insufficient Permissions (code 4)", "<root>/gpus/…/information:3: …"). Fields it concerns
  // stay unknown; the rest of the GPU is still reported.
  std::vector<std::string> errors;
  // Where each part came from: both false means only the key is known.
  bool from_nvml = false;
  bool from_procfs = false;
};

/// The node-level facts that are not per GPU.
struct NodeGpuInfo {
  std::string driver_version;  // NVML or /proc/driver/nvidia/version
  std::string nvml_version;
  std::optional<int> cuda_driver_version;  // e.g. 12040
  std::vector<GpuInfo> gpus;
  /// Why NVML is not available ("libnvidia-ml.so.1: cannot open shared object file"), empty
  /// when it is. Absence of NVML is a state to report, never a fatal error.
  std::string nvml_unavailable_reason;
  /// The library that was loaded ("libnvidia-ml.so.1"), empty when none was.
  std::string nvml_library;
  /// Why /proc/driver/nvidia could not be read (no such directory: no NVIDIA kernel module),
  /// empty when it was.
  std::string procfs_unavailable_reason;
  /// Node-level problems that did not stop the collection (an unreadable version file).
  std::vector<std::string> errors;
};

}  // namespace fragscope::gpu

#endif  // FRAGSCOPE_SOURCES_GPU_GPU_INFO_H_
