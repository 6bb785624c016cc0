// The NVIDIA kernel module's /proc/driver/nvidia: the driver version (`version`) and, per GPU,
// `gpus/<bus location>/information` (model, IRQ, UUID, video BIOS, bus type, DMA size and
// mask, bus location, device minor, excluded, firmware). It tells nothing about memory use —
// docs/gpu-sources.md says what each source gives. JoinGpuInfo() merges it with NVML's view.
//
// Every file is read with a size limit; unknown lines are ignored (drivers add lines); a
// known key with a value that does not parse is reported as "<path>:<line>: ..." in that GPU's
// `errors`, leaving the field unknown, and the other GPUs are still read.
//
// Thread safety: free functions over plain values; the file system may change under a read
// (a GPU disappearing is reported as an unreadable file).
#ifndef FRAGSCOPE_SOURCES_GPU_NVIDIA_PROCFS_H_
#define FRAGSCOPE_SOURCES_GPU_NVIDIA_PROCFS_H_

#include <cstddef>
#include <string>
#include <string_view>

#include "fragscope/status.h"
#include "sources/gpu/gpu_info.h"

namespace fragscope::gpu {

struct ProcfsOptions {
  std::string root = "/proc/driver/nvidia";
  std::size_t max_file_bytes = 64 * 1024;  // bigger files are an error (a real one is < 1 KiB)
  std::size_t max_gpus = 1024;             // entries under gpus/ beyond this are an error
};

/// Reads `options.root`. Fails (kNotFound) only when the root is not a readable directory
/// (no NVIDIA kernel module, or a wrong --proc-root); everything else is per-file errors in
/// the result (NodeGpuInfo::errors for `version`, GpuInfo::errors for a GPU's file). The GPUs
/// come sorted by bus location, with from_procfs set.
Result<NodeGpuInfo> ReadNvidiaProcfs(const ProcfsOptions& options = {});

/// Parses one `information` file's text; `path` is only for messages. Never fails: problems go
/// to the returned GpuInfo's `errors`.
GpuInfo ParseGpuInformation(std::string_view text, const std::string& path);

/// The driver version from `version`'s "NVRM version:" line ("535.104.05"), or "" when the
/// text has none.
std::string ParseDriverVersion(std::string_view text);

/// NVML's and /proc's views joined by GPU UUID (case-insensitive). NVML's GPUs come first in
/// their index order, with the /proc fields filled in where a UUID matched; GPUs only /proc
/// knows (excluded GPUs, or NVML absent) follow. A GPU without a UUID is never joined. The
/// node fields come from NVML, the driver version from /proc when NVML has none; errors and
/// unavailable reasons of both are kept.
NodeGpuInfo JoinGpuInfo(NodeGpuInfo nvml, NodeGpuInfo procfs);

}  // namespace fragscope::gpu

#endif  // FRAGSCOPE_SOURCES_GPU_NVIDIA_PROCFS_H_
