// OomMessage: the figures of one out-of-memory error message of PyTorch's caching allocator
// ("CUDA out of memory. Tried to allocate ...") as found in a log, in any wording PyTorch has
// used (docs/explain.md lists them with their versions). The text parser
// (src/sources/oom_text) fills it; the explain analysis (src/analysis/explain.h) reads it.
//
// Thread safety: plain values.
#ifndef FRAGSCOPE_OOM_MESSAGE_H_
#define FRAGSCOPE_OOM_MESSAGE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fragscope {

/// Which of PyTorch's message texts the figures came from.
enum class OomWording : std::uint8_t {
  kUnknown = 0,  // "out of memory" without a recognised figure list
  kClassic,      // "(GPU 0; 7.93 GiB total capacity; ... reserved in total by PyTorch)", 1.x-2.0
  kCapacityOf,   // "GPU 0 has a total capacity of ... of which ... is free. ...", 2.1 onward
};

/// "unknown", "classic", "capacity_of".
constexpr std::string_view OomWordingName(OomWording wording) {
  switch (wording) {
    case OomWording::kClassic:
      return "classic";
    case OomWording::kCapacityOf:
      return "capacity_of";
    case OomWording::kUnknown:
      break;
  }
  return "unknown";
}

/// "Process 1234 has 3.00 GiB memory in use." (from NVML, 2.1 onward).
struct OomProcess {
  std::uint64_t pid = 0;
  std::uint64_t bytes = 0;
};

/// One out-of-memory message. Sizes are bytes as printed: PyTorch prints two decimals of the
/// unit, so a figure is exact only to half a hundredth of its unit (e.g. +-5 KiB for MiB).
/// A figure the message does not give is nullopt.
struct OomMessage {
  std::uint64_t line = 0;       // 1-based line of the input where the message starts
  std::uint64_t last_line = 0;  // last line it spans (wrapped messages)
  std::string backend;          // "CUDA", "HIP" (ROCm builds) or "XPU"
  /// Quoted without its first sentence (from "Tried to allocate" on): `backend` is inferred
  /// from the hint's variable or wording ("CUDA" when nothing says otherwise).
  bool quoted = false;
  std::string exception;             // "torch.OutOfMemoryError", "RuntimeError", ... ("" if none)
  std::optional<std::int64_t> rank;  // "[rank3]:" or "rank=3" on the message's line
  std::optional<std::int64_t> gpu;   // "GPU 3" of the message
  OomWording wording = OomWording::kUnknown;

  std::optional<std::uint64_t> tried;          // "Tried to allocate": the segment size (see docs)
  std::optional<std::uint64_t> total;          // total capacity
  std::optional<std::uint64_t> free;           // free on the device (driver), after release
  std::optional<std::uint64_t> allocated;      // allocated by PyTorch (+ private-pool cache, 2.4+)
  std::optional<std::uint64_t> reserved;       // reserved in total by PyTorch (classic wording)
  std::optional<std::uint64_t> unallocated;    // reserved but unallocated (2.1+; 1.0-1.3 "cached")
  std::optional<std::uint64_t> private_pools;  // "with X allocated in private pools" (2.4+)
  std::optional<std::uint64_t> allowed;        // "X allowed;" (per-process memory fraction)
  std::optional<std::uint64_t> this_process;   // "this process has X memory in use" (2.1+)
  std::vector<OomProcess> processes;           // "Process P has X memory in use" lines
  bool hint_max_split = false;                 // "... try setting max_split_size_mb ..."
  bool hint_expandable = false;  // "... PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ..."

  std::string text;             // the message, whitespace and line wraps joined (capped)
  bool text_truncated = false;  // the message went on beyond the cap or the input ended in it
  std::uint32_t repeats = 1;    // identical messages (same text and rank) folded into this one
  std::vector<std::uint64_t> repeat_lines;  // lines of the folded repeats (first 20)

  /// reserved, from whichever wording gave it: classic "reserved in total"; newer
  /// allocated + unallocated (allocated includes the private-pool cache).
  std::optional<std::uint64_t> Reserved() const {
    if (reserved) return reserved;
    if (allocated && unallocated) return *allocated + *unallocated;
    return std::nullopt;
  }
  /// reserved - allocated: cached by PyTorch, not handed to any tensor.
  std::optional<std::uint64_t> Unallocated() const {
    if (unallocated) return unallocated;
    if (reserved && allocated) return *reserved >= *allocated ? *reserved - *allocated : 0;
    return std::nullopt;
  }
};

}  // namespace fragscope

#endif  // FRAGSCOPE_OOM_MESSAGE_H_
