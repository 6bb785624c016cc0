// Diagnosis of a memory state: why an allocation failed (OomDiagnosis), and which call sites'
// live blocks keep free gaps stranded inside segments (SiteStranding). Both read a
// DeviceMemory at one moment; TraceAnalyzer calls them at an oom event and at the end.
// docs/metrics.md defines every figure.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_ANALYSIS_DIAGNOSIS_H_
#define FRAGSCOPE_ANALYSIS_DIAGNOSIS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "fragscope/event.h"
#include "fragscope/trace.h"
#include "model/allocator_rules.h"
#include "model/device_memory.h"

namespace fragscope::analysis {

enum class OomCause : std::uint8_t {
  kFragmentation,  // enough free memory in total (cache + device), none of it contiguous
  kShortage,       // not enough free memory even if every gap were joined
  /// Replay only: the device had memory free, but the simulator's modelled address space had
  /// no room for the segment (model::kModelledAddressSpaceBytes): a limit of the model.
  kAddressSpace,
};
std::string_view OomCauseName(OomCause cause);

struct OomDiagnosis {
  std::uint64_t event_index = 0;
  std::int64_t step = -1;
  std::int64_t time_us = -1;
  std::uint64_t requested = 0;  // as the oom event says
  std::uint64_t rounded = 0;    // the block the allocator wanted (its rounding rules)
  std::uint64_t needed = 0;     // what a new segment would have taken (segment size)
  Pool pool = Pool::kLarge;
  std::uint64_t reserved = 0;
  std::uint64_t allocated = 0;
  /// Cached but free bytes of the device at the failure (reserved - allocated - pending):
  /// PyTorch had already released every free segment, so these sit in gaps between live
  /// blocks and could not serve the request.
  std::uint64_t free_unusable = 0;
  std::uint64_t largest_free_block = 0;  // in the request's pool
  std::optional<std::uint64_t> device_free;
  OomCause cause = OomCause::kShortage;
  /// free_unusable + device_free - needed when positive: how much more memory was free than
  /// the request needed (fragmentation); else how much was missing (shortage).
  std::uint64_t margin = 0;
};

/// The diagnosis of an oom event against the state just before it.
OomDiagnosis DiagnoseOom(const model::DeviceMemory& memory, const model::AllocatorRules& rules,
                         const Event& oom);

/// One call site's share of the free bytes stranded in partly used segments.
struct SiteStranding {
  std::int32_t frame = -1;           // call-site id (TraceReader::frames()), -1 = unknown
  std::string site;                  // "file:line in name", filled by NameSites
  std::uint64_t stranded_bytes = 0;  // free bytes of its segments, shared by live-block size
  std::uint64_t live_bytes = 0;      // its live blocks in those segments
  std::uint64_t blocks = 0;
  std::uint64_t segments = 0;
  /// NameSite: the site names a file ("file:line in name"); false for a bare name (a label
  /// such as "C++ only: at::_ops::mm", sources/call_site.h), whose start says the most.
  bool site_has_file = false;
};

/// Free bytes of every segment that holds both live and free blocks, split among the segment's
/// live blocks in proportion to their sizes and summed by the blocks' call sites; the `top`
/// largest, by stranded bytes (ties: smaller frame id first). Segments that are wholly free
/// (releasable) or wholly used strand nothing.
std::vector<SiteStranding> AttributeStranding(const model::DeviceMemory& memory, std::size_t top);

/// Fills SiteStranding::site from the call-site table: "file:line in name".
void NameSite(const std::vector<Frame>& frames, SiteStranding* site);

}  // namespace fragscope::analysis

#endif  // FRAGSCOPE_ANALYSIS_DIAGNOSIS_H_
