#include "analysis/layout_frames.h"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "analysis/metrics.h"
#include "analysis/size_profile.h"
#include "model/memory_model.h"
#include "model/u64_map.h"

namespace fragscope::analysis {

std::string_view FrameReasonName(FrameReason reason) {
  switch (reason) {
    case FrameReason::kPeriodic:
      return "periodic";
    case FrameReason::kBeforeOom:
      return "before_oom";
    case FrameReason::kPeak:
      return "peak";
    case FrameReason::kEnd:
      break;
  }
  return "end";
}

// Optional maps (periodic, peaks) may copy this many blocks for each event consumed.
constexpr std::uint64_t kCaptureCreditPerEvent = 2;
// A peak this much above the last peak map is taken whatever the credit: the peak map is then
// never more than 25% below the high-water mark, and a rise over a range R costs
// log(R) / log(1.25) maps at most.
constexpr double kForcedPeakRise = 1.25;

struct LayoutRecorder::Impl {
  struct Device {
    explicit Device(std::size_t window) : small_window(window), large_window(window) {}
    DeviceFrames frames;
    RequestWindow small_window;
    RequestWindow large_window;
    std::size_t ooms = 0;
    std::optional<LayoutFrame> peak;  // at the high-water mark of allocated bytes (within 1%)
    std::uint64_t peak_bytes = 0;     // allocated bytes when `peak` was taken
    /// Allocated bytes rose 1% above peak_bytes and have not fallen since: the map is taken
    /// at the top of the rise (before the first free), once, not at every 1% of the way up —
    /// a rise over a map of millions of blocks took hundreds of maps (issue 34).
    bool rising = false;
    // The live allocations by address: what a map's block refers to, and whose site loses
    // the bytes when it is freed.
    struct Live {
      LayoutAllocation what;
      std::uint64_t bytes = 0;     // the block's bytes counted for its site
      std::int32_t recorded = -1;  // index in frames.allocations once a map shows it
    };
    // By address: one open-addressing probe per event and per shown block (a node-based map
    // cost the report 10x analyze's time on snapshots of millions of blocks; issue 34).
    model::U64MapOf<Live> live;
  };

  Impl(model::AllocatorRules r, const LayoutFramesOptions& o)
      : rules(r), options(o), model(r), period(std::max<std::uint64_t>(o.first_period, 1)) {
    options.max_frames = std::max<std::size_t>(options.max_frames, 2);
  }

  Device& DeviceFor(std::int32_t device) {
    auto it = devices.find(device);
    if (it == devices.end()) {
      it = devices.emplace(device, Device(options.request_window)).first;
      it->second.frames.device = device;
    }
    return it->second;
  }

  std::pair<std::uint64_t, std::uint64_t> Thresholds(const Device& d) const {
    if (options.stranded_threshold) {
      return {*options.stranded_threshold, LargePoolThreshold(*options.stranded_threshold)};
    }
    return {d.small_window.Quantile(options.stranded_quantile),
            LargePoolThreshold(d.large_window.Quantile(options.stranded_quantile))};
  }

  // After `e` was applied to the model (`before`: the device's allocated bytes before it):
  // the live allocations and the call sites' bytes follow it.
  void Track(Device& d, const Event& e, std::uint64_t before, bool start_state) {
    const std::uint64_t after = model.FindDevice(e.device)->allocated();
    const auto index = static_cast<std::int64_t>(events);
    if (e.action == Action::kAlloc || e.action == Action::kBlock) {
      Device::Live l;
      l.what.alloc_event = start_state ? -1 : index;
      l.what.alloc_step = step;
      l.what.alloc_time_us = time_us;
      l.what.stream = e.stream;
      l.what.site = e.frame;
      l.what.stack = e.stack;
      l.bytes = after > before ? after - before : 0;
      if (l.bytes > 0) {
        d.frames.site_changes.push_back({events, e.frame, static_cast<std::int64_t>(l.bytes)});
      }
      // The index's empty key is no block start: the model refuses a block there.
      if (e.addr == UINT64_MAX) return;
      if (Device::Live* known = d.live.Get(e.addr)) {
        *known = l;
      } else {
        d.live.Insert(e.addr, l);
      }
      return;
    }
    if (e.action != Action::kFreeRequested && e.action != Action::kFreeCompleted) return;
    Device::Live* found = d.live.Get(e.addr);
    if (found == nullptr) return;
    Device::Live& l = *found;
    if (l.what.free_event < 0 && !start_state) {
      l.what.free_event = index;
      l.what.free_step = step;
      l.what.free_time_us = time_us;
      if (l.recorded >= 0) {
        LayoutAllocation& shown = d.frames.allocations[static_cast<std::size_t>(l.recorded)];
        shown.free_event = index;
        shown.free_step = step;
        shown.free_time_us = time_us;
      }
    }
    // The site's bytes are allocated bytes: they leave with the free request (a pending free
    // block is no longer allocated); the block stays described until it is free.
    if (after < before && l.bytes > 0) {
      d.frames.site_changes.push_back({events, l.what.site, -static_cast<std::int64_t>(l.bytes)});
      l.bytes = 0;
    }
    if (e.action == Action::kFreeCompleted) d.live.Erase(e.addr);
  }

  LayoutFrame Capture(Device& d, FrameReason reason) {
    LayoutFrame f;
    f.event_index = events;
    f.step = step;
    f.time_us = time_us;
    f.reason = reason;
    const model::DeviceMemory* memory = model.FindDevice(d.frames.device);
    if (memory == nullptr) return f;
    const auto [small, large] = Thresholds(d);
    memory->ForEachSegment([&](const model::Segment& seg) {
      LayoutSegment ls;
      ls.addr = seg.addr;
      ls.size = seg.size;
      ls.stream = seg.stream;
      ls.pool = seg.pool;
      ls.expandable = seg.expandable;
      ls.blocks.reserve(seg.num_blocks);
      const std::uint64_t threshold = seg.pool == Pool::kSmall ? small : large;
      memory->ForEachBlock(seg, [&](const model::Block& b) {
        ls.blocks.push_back(LayoutBlock{b.addr, b.size, b.requested, b.state,
                                        b.state == model::BlockState::kFree && b.size < threshold,
                                        b.frame, Recorded(d, b)});
      });
      f.blocks += ls.blocks.size();
      f.segments.push_back(std::move(ls));
    });
    return f;
  }

  // The index in d.frames.allocations of the allocation in block `b`, added at its first map;
  // -1 for a free block.
  static std::int32_t Recorded(Device& d, const model::Block& b) {
    if (b.state == model::BlockState::kFree) return -1;
    Device::Live* l = d.live.Get(b.addr);
    if (l == nullptr) return -1;
    if (l->recorded < 0) {
      l->recorded = static_cast<std::int32_t>(d.frames.allocations.size());
      d.frames.allocations.push_back(l->what);
    }
    return l->recorded;
  }

  // Drops every other periodic frame of every device (oldest kept) and doubles the period.
  void Thin() {
    for (auto& [index, d] : devices) {
      std::vector<LayoutFrame> kept;
      std::size_t nth = 0;
      for (LayoutFrame& f : d.frames.frames) {
        if (f.reason == FrameReason::kPeriodic && (nth++ % 2) == 1) {
          held_blocks -= f.blocks;
          --periodic;
          continue;
        }
        kept.push_back(std::move(f));
      }
      d.frames.frames = std::move(kept);
    }
    period *= 2;
  }

  // Drops every periodic frame (when thinning no longer frees anything: each device is down to
  // its first one) and doubles the period.
  void DropPeriodic() {
    for (auto& [index, d] : devices) {
      std::erase_if(d.frames.frames, [&](const LayoutFrame& f) {
        if (f.reason != FrameReason::kPeriodic) return false;
        held_blocks -= f.blocks;
        --periodic;
        return true;
      });
    }
    period *= 2;
  }

  bool TooManyPeriodic() const {
    std::size_t most = 0;
    for (const auto& [index, d] : devices) {
      std::size_t n = 0;
      for (const LayoutFrame& f : d.frames.frames) n += f.reason == FrameReason::kPeriodic;
      most = std::max(most, n);
    }
    return most > options.max_frames;
  }

  // Frees periodic frames until every kept map fits max_blocks, or none is left: thins them
  // while that frees something, then drops them all.
  void MakeRoom() {
    while (held_blocks > options.max_blocks && periodic > 0) {
      const std::uint64_t before = held_blocks;
      const std::size_t before_periodic = periodic;
      Thin();
      if (held_blocks == before && periodic == before_periodic) DropPeriodic();
    }
  }

  // After a map that is never thinned (before an OOM, at a peak, at the end) was kept on
  // `device`: room is made for it, else the recording is refused (status) and every map is
  // released.
  Status Fit(std::int32_t device, FrameReason reason) {
    MakeRoom();
    if (held_blocks <= options.max_blocks) return Status::Ok();
    status = Status::LimitExceeded(fmt::format(
        "the memory maps the report must keep (the layout before each of a device's first {} "
        "OOMs, at its peak and at the end, on {} device{}) reached {} blocks with the map {} "
        "of device {}, more than --max-map-blocks {}; nothing was written. Raise "
        "--max-map-blocks (the page grows with it), or report one device at a time with "
        "--device N",
        kMaxOomDiagnoses, devices.size(), devices.size() == 1 ? "" : "s", held_blocks,
        reason == FrameReason::kBeforeOom ? "before an OOM"
        : reason == FrameReason::kPeak    ? "at its peak"
                                          : "at the end",
        device, options.max_blocks));
    for (auto& [index, d] : devices) {
      d.frames.frames = {};
      d.peak.reset();
    }
    held_blocks = 0;
    periodic = 0;
    return status;
  }

  // The blocks a map of `device` would hold now.
  std::uint64_t MapBlocks(std::int32_t device) const {
    const model::DeviceMemory* memory = model.FindDevice(device);
    if (memory == nullptr) return 0;
    std::uint64_t n = 0;
    for (const Pool pool : {Pool::kSmall, Pool::kLarge}) {
      const model::PoolCounters& c = memory->pool(pool);
      n += c.allocated_count + c.pending_count + c.free.count();
    }
    return n;
  }

  // Whether an optional map (periodic, or a peak less than kForcedPeakRise above the last) of
  // `blocks` blocks is within the capture credit, which it then spends.
  bool Afford(std::uint64_t blocks) {
    if (blocks > credit) return false;
    credit -= blocks;
    return true;
  }

  // The map at the top of a rise (the state before the current event), as the peak. `forced`:
  // at the end of the input, or the rise is large; else only within the capture credit, and
  // the rise stays open for the next free otherwise.
  Status TakePeak(Device& d, std::int32_t device, bool forced) {
    const std::uint64_t allocated = model.FindDevice(device)->allocated();
    forced = forced ||
             static_cast<double>(allocated) >= kForcedPeakRise * static_cast<double>(d.peak_bytes);
    if (!forced && !Afford(MapBlocks(device))) return Status::Ok();
    d.rising = false;
    d.peak_bytes = allocated;
    if (d.peak) held_blocks -= d.peak->blocks;
    d.peak = Capture(d, FrameReason::kPeak);
    held_blocks += d.peak->blocks;
    return Fit(device, FrameReason::kPeak);
  }

  void RecordPeriodic() {
    for (auto& [index, d] : devices) {
      if (d.frames.stopped || !Afford(MapBlocks(index))) continue;
      LayoutFrame f = Capture(d, FrameReason::kPeriodic);
      held_blocks += f.blocks;
      ++periodic;
      d.frames.frames.push_back(std::move(f));
    }
    while (TooManyPeriodic()) {
      const std::uint64_t before = held_blocks;
      const std::size_t before_periodic = periodic;
      Thin();
      if (held_blocks == before && periodic == before_periodic) break;
    }
    MakeRoom();
  }

  Status Consume(const Event& e, bool start_state) {
    if (!status.ok()) return status;
    if (e.action == Action::kStep) step = e.step;
    if (e.time_us >= 0) time_us = e.time_us;
    const bool wanted =
        e.action != Action::kStep && (!options.device || e.device == *options.device);
    if (wanted && e.device >= 0 && e.device < model::MemoryModel::kMaxDevices) {
      Device& d = DeviceFor(e.device);
      const model::DeviceMemory* memory = model.FindDevice(e.device);
      const std::uint64_t before = memory != nullptr ? memory->allocated() : 0;
      if (!d.frames.stopped && start_state) {
        if (!model.Apply(e).ok()) {
          d.frames.stopped = true;
        } else {
          Track(d, e, before, true);
        }
      } else if (!d.frames.stopped) {
        if (d.rising &&
            (e.action == Action::kFreeRequested || e.action == Action::kFreeCompleted)) {
          if (Status s = TakePeak(d, e.device, false); !s.ok()) return s;
        }
        if (e.action == Action::kOom && d.ooms < kMaxOomDiagnoses) {
          ++d.ooms;
          LayoutFrame f = Capture(d, FrameReason::kBeforeOom);
          held_blocks += f.blocks;
          d.frames.frames.push_back(std::move(f));
          if (Status s = Fit(e.device, FrameReason::kBeforeOom); !s.ok()) return s;
        }
        if (e.action == Action::kAlloc) {
          if (model::AllocatorRules::PoolFor(rules.RoundSize(e.size)) == Pool::kSmall) {
            d.small_window.Add(e.size);
          } else {
            d.large_window.Add(e.size);
          }
        }
        const bool applied = model.Apply(e).ok();
        if (applied) Track(d, e, before, false);
        if (!applied) {
          d.frames.stopped = true;
        } else if (e.action == Action::kAlloc) {
          const std::uint64_t allocated = model.FindDevice(e.device)->allocated();
          d.rising = d.rising || allocated > d.peak_bytes + d.peak_bytes / 100;
        }
      }
    }
    ++events;
    credit += kCaptureCreditPerEvent;
    if (start_state) return Status::Ok();  // no moment inside the rebuild is a frame
    if (events % period == 0) RecordPeriodic();
    return Status::Ok();
  }

  model::AllocatorRules rules;
  LayoutFramesOptions options;
  model::MemoryModel model;
  std::map<std::int32_t, Device> devices;
  std::uint64_t events = 0;
  std::int64_t step = -1;
  std::int64_t time_us = -1;
  std::uint64_t period;
  std::uint64_t held_blocks = 0;
  /// Blocks that optional maps may still copy: kCaptureCreditPerEvent a consumed event, so that
  /// periodic and peak maps cost at most that many block copies an event however large the
  /// maps are (a snapshot's maps of millions of blocks made `report` 10x `analyze`; issue 34).
  std::uint64_t credit = 0;
  std::size_t periodic = 0;  // periodic frames of all devices
  Status status;             // the budget's refusal (Fit): nothing more is recorded
};

namespace {

// Leaves in `frames->allocations` only those a kept frame's block names (thinned frames named
// others), renumbered in order.
void KeepShownAllocations(DeviceFrames* frames) {
  std::vector<std::int32_t> renumbered(frames->allocations.size(), -1);
  std::vector<LayoutAllocation> kept;
  for (LayoutFrame& f : frames->frames) {
    for (LayoutSegment& s : f.segments) {
      for (LayoutBlock& b : s.blocks) {
        if (b.allocation < 0) continue;
        std::int32_t& to = renumbered[static_cast<std::size_t>(b.allocation)];
        if (to < 0) {
          to = static_cast<std::int32_t>(kept.size());
          kept.push_back(frames->allocations[static_cast<std::size_t>(b.allocation)]);
        }
        b.allocation = to;
      }
    }
  }
  frames->allocations = std::move(kept);
}

}  // namespace

LayoutRecorder::LayoutRecorder(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LayoutRecorder::~LayoutRecorder() = default;

Result<std::unique_ptr<LayoutRecorder>> LayoutRecorder::Create(const TraceHeader& header,
                                                               const LayoutFramesOptions& options) {
  auto rules = model::AllocatorRules::FromSettings(header.allocator_settings);
  if (!rules.ok()) return rules.status().WithPrefix("trace header");
  return std::unique_ptr<LayoutRecorder>(
      new LayoutRecorder(std::make_unique<Impl>(*rules, options)));
}

Status LayoutRecorder::Consume(const Event& event, bool start_state) {
  return impl_->Consume(event, start_state);
}

Result<std::vector<DeviceFrames>> LayoutRecorder::Finish() {
  if (!impl_->status.ok()) return impl_->status;
  // The final layouts first, each counted against the budget as it is taken.
  std::map<std::int32_t, LayoutFrame> ends;
  for (auto& [index, d] : impl_->devices) {
    if (d.frames.stopped) continue;
    if (d.rising) {  // the input ended on the way up: its end is the top
      if (Status s = impl_->TakePeak(d, index, true); !s.ok()) return s;
    }
    LayoutFrame end = impl_->Capture(d, FrameReason::kEnd);
    impl_->held_blocks += end.blocks;
    ends.emplace(index, std::move(end));
    if (Status s = impl_->Fit(index, FrameReason::kEnd); !s.ok()) return s;
  }
  std::vector<DeviceFrames> out;
  for (auto& [index, d] : impl_->devices) {
    if (d.peak) d.frames.frames.push_back(std::move(*d.peak));
    if (auto end = ends.find(index); end != ends.end()) {
      d.frames.frames.push_back(std::move(end->second));
    }
    std::stable_sort(
        d.frames.frames.begin(), d.frames.frames.end(),
        [](const LayoutFrame& a, const LayoutFrame& b) { return a.event_index < b.event_index; });
    d.frames.period = impl_->period;
    KeepShownAllocations(&d.frames);
    out.push_back(std::move(d.frames));
  }
  return out;
}

}  // namespace fragscope::analysis
