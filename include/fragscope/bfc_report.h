// The figures of one out-of-memory failure of TensorFlow's or JAX/XLA's GPU allocators as a
// log reports it: the BFC allocator's dump (bins, regions and their chunks, totals, Stats),
// XLA's "Out of memory while trying to allocate N bytes" and cuda_malloc_async's failure.
// The log scanner (src/sources/bfc_text) fills them; `fragscope explain` (src/analysis/
// bfc_explain.h) and the BFC log reader for `analyze` / `report` read them.
//
// Main types: BfcChunk, BfcRegion, BfcBin, BfcReport, BfcLogContext.
// Thread safety: plain values.
#ifndef FRAGSCOPE_BFC_REPORT_H_
#define FRAGSCOPE_BFC_REPORT_H_

#include <algorithm>
#include <bit>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fragscope {

/// BFC facts (xla/tsl/framework/bfc_allocator.h): sizes round up to 256 bytes, and 21 bins hold
/// free chunks, bin i from 256 << i bytes (the last bin holds everything from 256 MiB on).
inline constexpr std::uint64_t kBfcMinAllocation = 256;
inline constexpr int kBfcNumBins = 21;
/// The bin of a chunk of `bytes`: floor(log2(max(bytes, 256) / 256)), at most 20.
constexpr int BfcBinForSize(std::uint64_t bytes) {
  const std::uint64_t v = std::max<std::uint64_t>(bytes, kBfcMinAllocation) >> 8;
  return std::min(kBfcNumBins - 1, 63 - std::countl_zero(v));
}
/// `bytes` rounded up to a multiple of 256 (saturating below 2^64).
constexpr std::uint64_t BfcRoundedBytes(std::uint64_t bytes) {
  constexpr std::uint64_t kTop = ~std::uint64_t{0} & ~(kBfcMinAllocation - 1);
  return bytes > kTop ? kTop : (bytes + kBfcMinAllocation - 1) & ~(kBfcMinAllocation - 1);
}

/// One line of the chunk map: "InUse at 7f... of size N next H" / "Free  at ..." (1.x:
/// "Chunk at 0x... of size N").
struct BfcChunk {
  std::uint64_t addr = 0;
  std::uint64_t size = 0;
  bool in_use = false;
  bool last_in_region = false;  // "next 18446744073709551615": the region's last chunk
  bool next_printed = false;    // the line has " next H" (not before TensorFlow 1.3)
  std::uint64_t line = 0;
  std::string tag;  // "lower", "upper", "central_gap" (XLA with chunk tags); "" if none
};

/// "Next region of size N" and the chunks listed after it, in address order.
struct BfcRegion {
  std::uint64_t size = 0;  // as printed; 0 when the header line was not seen
  std::uint64_t line = 0;
  std::vector<BfcChunk> chunks;
  /// Sum of the chunks' sizes (what the listed chunks cover; each < 2^60, at most 2^22).
  std::uint64_t ChunkBytes() const {
    std::uint64_t total = 0;
    for (const BfcChunk& c : chunks) total += c.size;
    return total;
  }
};

/// One "Bin (256): Total Chunks: a, Chunks in use: b. X allocated for chunks. ..." line.
struct BfcBin {
  std::uint64_t bin_size = 0;
  std::uint64_t chunks = 0;
  std::uint64_t chunks_in_use = 0;
  std::uint64_t bytes = 0;         // allocated for chunks (printed rounded: ~3 digits)
  std::uint64_t bytes_in_use = 0;  // in use in bin (printed rounded)
};

enum class BfcReportKind : std::uint8_t {
  kBfc,              // the BFC allocator's failure (with or without its dump)
  kJaxOom,           // "Out of memory while trying to allocate N bytes" (XLA), no dump seen
  kCudaMallocAsync,  // "cuMemAllocAsync failed to allocate N bytes"
};
/// "bfc", "jax_oom", "cuda_malloc_async".
constexpr std::string_view BfcReportKindName(BfcReportKind kind) {
  switch (kind) {
    case BfcReportKind::kJaxOom:
      return "jax_oom";
    case BfcReportKind::kCudaMallocAsync:
      return "cuda_malloc_async";
    case BfcReportKind::kBfc:
      break;
  }
  return "bfc";
}

/// One failure as the log reports it. A figure the log does not give is nullopt.
struct BfcReport {
  BfcReportKind kind = BfcReportKind::kBfc;
  std::uint64_t line = 0;                // where it starts
  std::uint64_t last_line = 0;           // its last line recognised
  std::string allocator;                 // "GPU_0_bfc", "gpu_async_0", ... ("" if not printed)
  std::string source_file;               // "tensorflow/core/common_runtime/bfc_allocator.cc", ...
  std::string op;                        // "requested by op X"
  std::optional<std::uint64_t> request;  // bytes asked for (exact, or as printed)
  bool request_exact = false;            // from "(rounded to N)" or "N bytes"
  std::optional<std::uint64_t> rounded;  // "(rounded to N)"

  // The dump.
  std::vector<BfcBin> bins;  // in the order printed
  std::vector<BfcRegion> regions;
  std::uint64_t chunks = 0;                      // chunk lines read (kept or not)
  bool chunks_dropped = false;                   // beyond BfcLogLimits: the map is incomplete
  std::optional<std::uint64_t> sum_in_use;       // "Sum Total of in-use chunks"
  std::optional<std::uint64_t> region_bytes;     // total_region_allocated_bytes_ / pool size
  std::optional<std::uint64_t> memory_limit;     // memory_limit_ / pool limit
  std::optional<std::uint64_t> next_region;      // curr_region_allocation_bytes_ / growth hint
  std::optional<bool> growth;                    // "(growth enabled)" / "(growth disabled ...)"
  std::optional<std::uint64_t> summary_free;     // "total free in pool"
  std::optional<std::uint64_t> summary_largest;  // "largest free chunk usable by ..."
  /// "Stats:" block: Limit, InUse, MaxInUse, NumAllocs, MaxAllocSize, Reserved, PeakReserved,
  /// LargestFreeBlock, ... as printed (first 16).
  std::vector<std::pair<std::string, std::uint64_t>> stats;
  bool occupancy = false;     // the "****xx___" line that ends a dump
  bool dump_started = false;  // a "BFCAllocator dump" or bin line was seen
  std::string tensor_shape;   // "OOM when allocating tensor with shape[...]"

  // cuda_malloc_async.
  std::optional<std::uint64_t> device_free;    // "Free memory/Total memory: F/T"
  std::optional<std::uint64_t> device_total;   // also TF 1.x's "totalMemory: X"
  std::optional<std::uint64_t> pool_reserved;  // CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT
  std::optional<std::uint64_t> pool_used;      // CU_MEMPOOL_ATTR_USED_MEM_CURRENT

  // XLA's compile-time "BufferAssignment stats: total allocation: X".
  std::optional<std::uint64_t> buffer_total;

  std::vector<std::string> notes;  // what was odd, with line numbers (first 20)

  // Figures of the chunk map, set when the report ends (the map itself is dropped from every
  // report but the last): bytes in use, free, the largest free chunk, and whether every region
  // was listed whole (its chunks cover its size and end with the region's last chunk).
  std::uint64_t map_in_use = 0;
  std::uint64_t map_free = 0;
  std::uint64_t map_largest_free = 0;
  std::uint64_t map_regions = 0;
  std::uint64_t map_region_bytes = 0;
  bool map_complete = false;

  /// A Stats value by name ("InUse"), if printed.
  std::optional<std::uint64_t> Stat(std::string_view name) const {
    for (const auto& [k, v] : stats) {
      if (k == name) return v;
    }
    return std::nullopt;
  }
};

/// Settings and device facts seen anywhere in the log (they need not sit in a report).
struct BfcLogContext {
  /// Framework hints: "tensorflow" (tensorflow/ paths, local_xla, local_tsl), "jax"
  /// (jaxlib, XlaRuntimeError, external/xla). Empty when nothing says.
  std::string framework;
  /// Settings named in the log: "XLA_PYTHON_CLIENT_MEM_FRACTION" -> ".95",
  /// "per_process_gpu_memory_fraction" -> "0.5", ... (first 16).
  std::vector<std::pair<std::string, std::string>> settings;
  std::optional<std::uint64_t> device_total;  // TF 1.x "totalMemory: 10.92GiB"
  std::optional<std::uint64_t> tf_device_mb;  // TF 2.x "Created device ... with N MB memory"
  std::uint64_t soft_failures = 0;            // "The caller indicates that this is not a failure"
  std::uint64_t driver_failures =
      0;  // "failed to allocate ... from device: CUDA_ERROR_OUT_OF_MEMORY"
  std::uint64_t garbage_collections = 0;  // "Garbage collection: deallocate free memory regions"

  /// A setting's value as the log names it ("XLA_PYTHON_CLIENT_MEM_FRACTION"), if it does.
  std::optional<std::string> Setting(std::string_view name) const {
    for (const auto& [k, v] : settings) {
      if (k == name) return v;
    }
    return std::nullopt;
  }
};

}  // namespace fragscope

#endif  // FRAGSCOPE_BFC_REPORT_H_
