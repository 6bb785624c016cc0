#include "sources/bfc_text/bfc_trace.h"

#include <fmt/format.h>

namespace fragscope::sources {

Result<std::unique_ptr<BfcTraceReader>> BfcTraceReader::Create(BfcLogScan scan, std::string name) {
  std::size_t index = scan.reports.size();
  while (index > 0 && scan.reports[index - 1].regions.empty()) --index;
  if (index == 0) {
    return Status::InvalidArgument(fmt::format(
        "{}: no BFC allocator dump with a chunk map (\"Next region of size\", \"InUse at\") in {} "
        "lines",
        name, scan.lines));
  }
  std::unique_ptr<BfcTraceReader> r(new BfcTraceReader());
  r->report_ = index - 1;
  r->name_ = std::move(name);
  r->scan_ = std::move(scan);
  const BfcReport& report = r->scan_.reports[r->report_];
  r->header_.kind = TraceKind::kAllocator;
  r->header_.producer = "fragscope bfc log reader";
  DeviceInfo device;
  device.device = 0;
  device.name = report.allocator;
  const std::uint64_t limit = report.memory_limit.value_or(report.Stat("Limit").value_or(0));
  if (limit > 0) device.capacity_bytes = limit;
  r->header_.devices.push_back(device);
  r->header_.allocator_settings.emplace_back("allocator", "bfc");
  std::uint64_t pool = 0;
  for (const BfcRegion& g : report.regions) {
    if (g.chunks.empty()) continue;
    Event seg;
    seg.action = Action::kSegmentAlloc;
    seg.addr = g.chunks.front().addr;
    // The region as listed: its chunks, which tile it when the map is whole.
    seg.size = g.ChunkBytes();
    seg.pool = Pool::kLarge;  // BFC has one pool; "large" keeps PyTorch's small-pool rules away
    pool += seg.size;
    r->events_.emplace_back(seg, g.line != 0 ? g.line : g.chunks.front().line);
    for (const BfcChunk& c : g.chunks) {
      if (!c.in_use) continue;
      Event b;
      b.action = Action::kBlock;
      b.addr = c.addr;
      b.size = c.size;  // the dump gives no requested size per chunk
      b.block_size = c.size;
      r->events_.emplace_back(b, c.line);
    }
  }
  const std::optional<std::uint64_t> request =
      report.rounded
          ? report.rounded
          : (report.request ? std::optional(BfcRoundedBytes(*report.request)) : std::nullopt);
  if (request) {
    Event oom;
    oom.action = Action::kOom;
    oom.size = *request;
    if (limit > 0) oom.device_free = limit > pool ? limit - pool : 0;
    r->events_.emplace_back(oom, report.line);
  }
  return r;
}

Result<bool> BfcTraceReader::Next(Event* event) {
  if (next_ >= events_.size()) return false;
  *event = events_[next_].first;
  line_ = events_[next_].second;
  ++next_;
  return true;
}

std::string BfcTraceReader::Where() const { return fmt::format("{}:{}", name_, line_); }

}  // namespace fragscope::sources
