// NvmlCollector: what NVIDIA's management library (libnvidia-ml) knows about each GPU —
// identity, memory totals, BAR1, compute processes and MIG instances — as GpuInfo values.
//
// The library is loaded with dlopen at run time, so fragscope has no link-time dependency on
// the driver and runs on machines without a GPU: there, Open() fails with a clear message and
// CollectNvml() reports it as NodeGpuInfo::nvml_unavailable_reason. Each function is looked
// up newest version first (nvmlDeviceGetMemoryInfo_v2, then nvmlDeviceGetMemoryInfo); the
// functions a driver may lack (BAR1, MIG, processes, version queries) are optional: a missing
// one leaves its fields unknown. docs/gpu-sources.md lists the fallback order and explains how
// the process-info stride is detected (the struct changed size in R535 under the same name).
//
// Thread safety: NVML itself may be called from any thread, but one NvmlCollector must not be
// used from two threads at once (Collect() reuses its buffers). Distinct collectors may be
// used in parallel: NVML counts nvmlInit/nvmlShutdown pairs.
#ifndef FRAGSCOPE_SOURCES_GPU_NVML_COLLECTOR_H_
#define FRAGSCOPE_SOURCES_GPU_NVML_COLLECTOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "fragscope/status.h"
#include "sources/gpu/gpu_info.h"

namespace fragscope::gpu {

struct NvmlOptions {
  /// Tried in order with dlopen; the first that loads is used. Tests pass the path of their
  /// stand-in library here.
  std::vector<std::string> library_paths = {"libnvidia-ml.so.1", "libnvidia-ml.so"};
  /// At most this many compute processes are read per GPU (more are reported as an error).
  std::uint32_t max_processes = 4096;
  /// At most this many GPUs (a count above it is treated as corrupt).
  std::uint32_t max_gpus = 1024;
};

class NvmlLibrary;  // the dlopen'ed functions (nvml_collector.cc)

class NvmlCollector {
 public:
  /// Loads the library and initialises NVML. Fails (kNotFound) when no library loads, and
  /// (kUnimplemented) when a mandatory function is missing or nvmlInit fails; the message
  /// names the library and the function.
  static Result<std::unique_ptr<NvmlCollector>> Open(const NvmlOptions& options = {});
  ~NvmlCollector();  // nvmlShutdown, dlclose
  NvmlCollector(const NvmlCollector&) = delete;
  NvmlCollector& operator=(const NvmlCollector&) = delete;

  /// Reads every GPU. Fails only when the GPU count or a device handle cannot be had; a
  /// refused per-GPU query goes to that GPU's `errors` and leaves its fields unknown.
  Result<NodeGpuInfo> Collect();

  /// The library path that loaded.
  const std::string& library() const { return library_; }
  /// For each function looked up, the name that resolved ("nvmlDeviceGetMemoryInfo" ->
  /// "nvmlDeviceGetMemoryInfo_v2"), or "" when no version of it exists. Diagnostics and tests.
  std::vector<std::pair<std::string, std::string>> ResolvedSymbols() const;
  /// The process-info stride found in the last Collect() (16, 24 or 32 bytes; 0: no process
  /// list was read yet).
  std::size_t process_info_stride() const { return process_info_stride_; }

 private:
  NvmlCollector(NvmlOptions options, std::unique_ptr<NvmlLibrary> lib, std::string library);
  void CollectGpu(std::uint32_t index, void* device, GpuInfo* gpu);
  void CollectProcesses(std::uint32_t index, void* device, GpuInfo* gpu);
  void CollectMig(std::uint32_t index, void* device, GpuInfo* gpu);
  std::string Describe(const char* function, std::uint32_t index, int code) const;

  NvmlOptions options_;
  std::unique_ptr<NvmlLibrary> lib_;
  std::string library_;
  std::size_t process_info_stride_ = 0;
  std::vector<unsigned char> process_buffer_;
};

/// Opens NVML and collects, never failing: when NVML is absent or refuses, the result is empty
/// but for `nvml_unavailable_reason` (the Open()/Collect() message).
NodeGpuInfo CollectNvml(const NvmlOptions& options = {});

/// The process-info record size that a buffer written by nvmlDeviceGetComputeRunningProcesses*
/// shows: `buffer` was filled with `sentinel` before the call, which reported `count` entries.
/// Returns 16, 24 or 32, or 0 when no size fits (see docs/gpu-sources.md for the method).
/// Exposed for tests.
std::size_t InferProcessInfoStride(const unsigned char* buffer, std::size_t buffer_size,
                                   std::uint32_t count, unsigned char sentinel);

}  // namespace fragscope::gpu

#endif  // FRAGSCOPE_SOURCES_GPU_NVML_COLLECTOR_H_
