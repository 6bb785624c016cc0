#include "analysis/trace_analyzer.h"

#include <algorithm>
#include <map>
#include <unordered_set>

#include <fmt/format.h>

#include "analysis/metrics.h"
#include "analysis/size_profile.h"
#include "analysis/timeline.h"
#include "common/units.h"
#include "model/u64_map.h"

namespace fragscope::analysis {

namespace {

// Without step markers and without --every, windows start at this many events; the timeline's
// downsampling widens them as the run grows.
constexpr std::uint64_t kAutoEveryEvents = 1000;

// Peaks and counts inside the open timeline window.
struct Window {
  std::uint64_t first_event = 0;
  std::uint64_t events = 0;
  std::uint64_t peak_reserved = 0;
  std::uint64_t peak_allocated = 0;
  std::uint64_t peak_requested = 0;
  std::uint64_t allocs = 0;
  std::uint64_t largest_request = 0;
  std::uint64_t segment_frees = 0;
};

// The candidates for the worst fragmentation ratio (docs/metrics.md, "Extremes"): the moments
// with something allocated and at least half the peak reserved, which is known only at the
// end. Per reserved value the moment with the most cached free bytes (the first on ties) is
// enough, and values below half the peak so far can never qualify again: they are dropped.
class RatioMoments {
  __extension__ using Wide = unsigned __int128;  // ratios compared exactly

 public:
  struct Moment {
    std::uint64_t reserved = 0;
    std::uint64_t cached_free = 0;
    When when;
  };
  // A moment; `peak` is the peak reserved so far (this moment's included).
  void Offer(std::uint64_t reserved, std::uint64_t cached_free, const When& when,
             std::uint64_t peak) {
    if (open_ && open_->reserved != reserved) Flush(peak);
    if (!open_) {
      open_ = Moment{reserved, cached_free, when};
    } else if (cached_free > open_->cached_free) {
      open_->cached_free = cached_free;
      open_->when = when;
    }
  }
  // The moment with the highest ratio among those with reserved >= half `peak` (the earliest
  // on ties), if any.
  std::optional<Moment> Worst(std::uint64_t peak) {
    Flush(peak);
    std::optional<Moment> worst;
    for (const auto& [reserved, m] : by_reserved_) {
      if (!Qualifies(reserved, peak)) continue;
      if (!worst) {
        worst = m;
        continue;
      }
      // cached / reserved compared exactly.
      const auto lhs = static_cast<Wide>(m.cached_free) * worst->reserved;
      const auto rhs = static_cast<Wide>(worst->cached_free) * m.reserved;
      if (lhs > rhs || (lhs == rhs && m.when.event_index < worst->when.event_index)) worst = m;
    }
    return worst;
  }
  static bool Qualifies(std::uint64_t reserved, std::uint64_t peak) {
    return reserved >= peak / 2 + peak % 2;  // reserved >= ceil(peak / 2)
  }

 private:
  void Flush(std::uint64_t peak) {
    if (open_ && Qualifies(open_->reserved, peak)) {
      auto [it, inserted] = by_reserved_.try_emplace(open_->reserved, *open_);
      if (!inserted && open_->cached_free > it->second.cached_free) it->second = *open_;
    }
    open_.reset();
    while (!by_reserved_.empty() && !Qualifies(by_reserved_.begin()->first, peak)) {
      by_reserved_.erase(by_reserved_.begin());
    }
  }
  std::optional<Moment> open_;  // the moment of the current reserved value, not yet in the map
  std::map<std::uint64_t, Moment> by_reserved_;
};

struct DeviceState {
  DeviceState(std::int32_t dev, const AnalysisOptions& options)
      : device(dev),
        small_window(options.request_window),
        large_window(options.request_window),
        timeline(options.max_timeline_samples) {}

  std::int32_t device;
  std::string name;
  std::optional<std::uint64_t> capacity;
  bool capacity_from_oom = false;  // capacity learnt from a recorded OOM (DiagnoseAt)
  std::uint64_t used_by_others = 0;
  model::DeviceMemory* memory = nullptr;  // allocator traces
  model::U64Map live;                     // request traces: id -> requested bytes
  std::unordered_set<std::uint64_t> awaiting_completion;
  std::uint64_t live_requested = 0;
  SizeProfile profile;
  RequestWindow small_window;
  RequestWindow large_window;
  Window window;
  Timeline timeline;
  std::optional<ForecastTrack> forecast;
  DeviceReport report;
  std::uint64_t retries_at_close = 0;  // the retry source's count when the last window closed
  bool start_pending = false;      // rebuilt start-state events were applied and not yet counted
  std::int64_t last_time_us = -1;  // the latest time among this device's events
  RatioMoments ratio_moments;
};

void Raise(Extreme& e, std::uint64_t value, const When& when) {
  if (!e.seen || value > e.bytes) e = Extreme{value, when, true};
}
void Lower(Extreme& e, std::uint64_t value, const When& when) {
  if (!e.seen || value < e.bytes) e = Extreme{value, when, true};
}

}  // namespace

struct TraceAnalyzer::Impl {
  TraceHeader header;
  AnalysisOptions options;
  model::AllocatorRules rules;
  model::MemoryModel model;
  TraceKind kind = TraceKind::kUnknown;
  std::vector<std::unique_ptr<DeviceState>> devices;  // by device index
  std::uint64_t events = 0;
  std::uint64_t steps = 0;
  std::int64_t current_step = -1;
  std::int64_t last_time_us = -1;
  std::int64_t first_time_us = -1;  // the earliest event time
  bool step_mode = false;           // the timeline follows step markers
  std::uint64_t every = 0;
  std::function<std::optional<std::uint64_t>(std::int32_t)> retry_source;

  explicit Impl(model::AllocatorRules r) : rules(r), model(r) {}

  DeviceState& Device(std::int32_t device) {
    const auto index = static_cast<std::size_t>(device);
    if (index >= devices.size()) devices.resize(index + 1);
    if (!devices[index]) {
      auto state = std::make_unique<DeviceState>(device, options);
      if (const DeviceInfo* info = header.FindDevice(device)) {
        state->name = info->name;
        state->capacity = info->capacity_bytes;
        state->used_by_others = info->used_by_others_bytes.value_or(0);
      }
      if (options.capacity_bytes) state->capacity = options.capacity_bytes;
      if (options.forecast) {
        std::optional<std::uint64_t> usable;
        if (state->capacity) {
          usable = *state->capacity > state->used_by_others
                       ? *state->capacity - state->used_by_others
                       : std::uint64_t{0};
        }
        state->forecast.emplace(*options.forecast, usable, step_mode);
      }
      state->window.first_event = events;
      devices[index] = std::move(state);
    }
    return *devices[index];
  }

  When Now() const { return When{events, current_step, last_time_us}; }

  // An oom event of an allocator trace: why it failed, and who stranded the gaps then.
  void DiagnoseAt(DeviceState& d, const Event& e) {
    DeviceReport& r = d.report;
    // A device without a known size tells it when it runs out of memory with the driver's free
    // bytes recorded: as the allocator saw it, reserved + free (memory used by others is part
    // of neither).
    if (!d.capacity && e.device_free) {
      d.capacity = d.memory->reserved() + *e.device_free;
      d.capacity_from_oom = true;
    }
    if (r.oom_diagnoses.size() < kMaxOomDiagnoses) {
      OomDiagnosis diagnosis = DiagnoseOom(*d.memory, rules, e);
      diagnosis.event_index = events;
      diagnosis.step = current_step;
      r.oom_diagnoses.push_back(diagnosis);
    }
    if (r.stranding_sites_at.empty()) {
      r.stranding_sites = AttributeStranding(*d.memory, kTopStrandingSites);
      r.stranding_sites_at = "first oom";
    }
  }

  MetricsInputs Inputs(const DeviceState& d) const {
    MetricsInputs in;
    if (options.stranded_threshold) {
      in.small_threshold = *options.stranded_threshold;
      in.large_threshold = LargePoolThreshold(*options.stranded_threshold);
    } else {
      in.small_threshold = d.small_window.Quantile(options.stranded_quantile);
      in.large_threshold = LargePoolThreshold(d.large_window.Quantile(options.stranded_quantile));
    }
    in.capacity_bytes = d.capacity;
    in.used_by_others_bytes = d.used_by_others;
    return in;
  }

  std::uint64_t LiveRequested(const DeviceState& d) const {
    if (d.memory == nullptr) return d.live_requested;
    return d.memory->pool(Pool::kSmall).requested + d.memory->pool(Pool::kLarge).requested;
  }

  // Closes the open window of `d` into a timeline sample.
  void CloseWindow(DeviceState& d, std::int64_t step) {
    TimelineSample s;
    s.step_first = s.step_last = step;
    s.first_event = d.window.first_event;
    s.end_event = events;
    // Never earlier than the device's own last event (devices of a snapshot come one after
    // the other, each with its own clock span).
    s.time_us = std::max(last_time_us, d.last_time_us);
    s.live_requested_bytes = LiveRequested(d);
    s.peak_live_requested_bytes = std::max(d.window.peak_requested, s.live_requested_bytes);
    s.allocs = d.window.allocs;
    s.largest_request = d.window.largest_request;
    s.segment_frees = d.window.segment_frees;
    if (retry_source) {
      if (const std::optional<std::uint64_t> retries = retry_source(d.device)) {
        s.alloc_retries = *retries >= d.retries_at_close ? *retries - d.retries_at_close : 0;
        s.alloc_retries_known = true;
        d.retries_at_close = *retries;
      }
    }
    if (d.memory != nullptr) {
      const DeviceMetrics m = ComputeMetrics(*d.memory, Inputs(d));
      s.reserved_bytes = m.all.reserved_bytes;
      s.allocated_bytes = m.all.allocated_bytes;
      s.cached_free_bytes = m.all.cached_free_bytes;
      s.fragmentation_ratio = m.all.fragmentation_ratio;
      s.largest_free_block = m.all.largest_free_block;
      s.max_allocatable = m.max_allocatable;
      s.stranded_bytes = m.all.stranded_bytes;
      s.peak_reserved_bytes = std::max(d.window.peak_reserved, s.reserved_bytes);
      s.peak_allocated_bytes = std::max(d.window.peak_allocated, s.allocated_bytes);
    }
    d.timeline.Add(s);
    if (d.forecast) d.forecast->Add(s, step);
    d.window = Window{};
    d.window.first_event = events;
  }

  Status OnStep(const Event& e) {
    ++steps;
    if (options.every_events == 0 && !step_mode) {
      // First step marker: the timeline follows steps from now on. Everything before it is one
      // "setup" window (step -1) whose peaks are the run's peaks so far.
      step_mode = true;
      for (auto& d : devices) {
        if (!d) continue;
        // A rebuilt start state not yet counted (a device whose events all came before) is
        // part of the setup.
        if (d->start_pending) CountStartState(*d);
        d->timeline.Clear();
        if (d->forecast) d->forecast->Reset(true);
        d->window.first_event = 0;
        d->window.peak_reserved = d->report.peak_reserved.bytes;
        d->window.peak_allocated = d->report.peak_allocated.bytes;
        d->window.peak_requested = d->report.peak_live_requested.bytes;
        d->window.allocs = d->report.allocs;
        d->window.largest_request = d->profile.max();
        CloseWindow(*d, current_step);
      }
    } else if (step_mode) {
      for (auto& d : devices) {
        if (d) CloseWindow(*d, current_step);
      }
    }
    current_step = e.step;
    return Status::Ok();
  }

  Status ApplyRequestEvent(DeviceState& d, const Event& e) {
    switch (e.action) {
      case Action::kAlloc:
        if (e.size == 0) return Status::Corruption("alloc of 0 bytes");
        if (e.addr == ~std::uint64_t{0}) {
          return Status::Corruption("alloc of id 18446744073709551615 (reserved)");
        }
        if (d.live.Contains(e.addr)) {
          return Status::Corruption(fmt::format(
              "alloc of id {} which is still live (ids must be unique among live allocations)",
              e.addr));
        }
        d.live.Insert(e.addr, e.size);
        d.live_requested += e.size;
        d.awaiting_completion.erase(e.addr);
        return Status::Ok();
      case Action::kFreeRequested:
      case Action::kFreeCompleted: {
        if (e.action == Action::kFreeCompleted && d.awaiting_completion.erase(e.addr) > 0) {
          return Status::Ok();  // the free_requested of this id already released it
        }
        auto size = d.live.Erase(e.addr);
        if (!size) {
          return Status::Corruption(
              fmt::format("{} of id {} which is not live (never allocated, "
                          "or freed twice)",
                          ActionName(e.action), e.addr));
        }
        if (e.size != 0 && e.size != *size) {
          return Status::Corruption(
              fmt::format("{} of id {}: size {} but it was allocated with {} bytes",
                          ActionName(e.action), e.addr, e.size, *size));
        }
        d.live_requested -= *size;
        if (e.action == Action::kFreeRequested) d.awaiting_completion.insert(e.addr);
        return Status::Ok();
      }
      case Action::kSegmentAlloc:
      case Action::kSegmentFree:
      case Action::kSegmentMap:
      case Action::kSegmentUnmap:
      case Action::kBlock:
        return Status::Corruption(fmt::format(
            "{} in a request trace (segment events belong to allocator traces; a trace's first "
            "alloc or segment event decides its kind, or the header's \"kind\")",
            ActionName(e.action)));
      case Action::kOom:
        ++d.report.num_ooms;
        return Status::Ok();
      default:
        return Status::Ok();
    }
  }

  // The state the rebuilt start events of `d` left is the recorded history's first: its peaks
  // count, at the event index where the history starts, and the first window starts there.
  void CountStartState(DeviceState& d) {
    d.start_pending = false;
    // The state after the last event that rebuilt it.
    const When when{events == 0 ? 0 : events - 1, current_step, last_time_us};
    const std::uint64_t requested = LiveRequested(d);
    Raise(d.report.peak_live_requested, requested, when);
    d.window.peak_requested = std::max(d.window.peak_requested, requested);
    if (d.memory != nullptr) {
      const std::uint64_t reserved = d.memory->reserved();
      const std::uint64_t allocated = d.memory->allocated();
      Raise(d.report.peak_reserved, reserved, when);
      Raise(d.report.peak_allocated, allocated, when);
      Raise(d.report.max_cached_free, reserved - allocated, when);
      d.window.peak_reserved = std::max(d.window.peak_reserved, reserved);
      d.window.peak_allocated = std::max(d.window.peak_allocated, allocated);
      TakeMoment(d, when, /*segment_grew=*/false);
    }
    d.window.first_event = events;
  }

  // The state after an event (or the start state) as a candidate for the worst moments: every
  // event counts (docs/metrics.md, "Extremes"), not only the timeline's samples. A state right
  // after a segment_alloc / segment_map is not one for the ratio: the segment was reserved for
  // a block that the next event carves, so its ratio is near 1 by construction.
  void TakeMoment(DeviceState& d, const When& when, bool segment_grew) {
    DeviceReport& r = d.report;
    const std::uint64_t reserved = d.memory->reserved();
    if (reserved == 0) return;
    const std::uint64_t allocated = d.memory->allocated();
    const Allocatable a = ComputeAllocatable(*d.memory, d.capacity, d.used_by_others);
    Lower(r.min_largest_free_block, a.largest_free_block, when);
    Lower(r.min_max_allocatable, a.max_allocatable, when);
    if (allocated > 0 && !segment_grew &&
        RatioMoments::Qualifies(reserved, r.peak_reserved.bytes)) {
      d.ratio_moments.Offer(reserved, reserved - allocated, when, r.peak_reserved.bytes);
    }
  }

  Status Consume(const Event& e, bool start_state = false) {
    if (e.action == Action::kStep) {
      FRAGSCOPE_RETURN_IF_ERROR(OnStep(e));
      ++events;
      return Status::Ok();
    }
    if (e.time_us >= 0) {
      last_time_us = e.time_us;
      if (first_time_us < 0 || e.time_us < first_time_us) first_time_us = e.time_us;
    }
    if (options.device && e.device != *options.device) {
      ++events;
      return Status::Ok();
    }
    if (e.device < 0 || e.device >= model::MemoryModel::kMaxDevices) {
      return Status::Corruption(
          fmt::format("device {} is outside [0, {})", e.device, model::MemoryModel::kMaxDevices));
    }
    if (kind == TraceKind::kUnknown) {
      switch (e.action) {
        case Action::kAlloc:
          kind = TraceKind::kRequest;
          break;
        case Action::kSegmentAlloc:
        case Action::kSegmentMap:
        case Action::kBlock:
          kind = TraceKind::kAllocator;
          break;
        default:
          break;
      }
    }
    DeviceState& d = Device(e.device);
    // The first recorded event after a rebuilt start state: that state counts first.
    if (d.start_pending && !start_state) CountStartState(d);
    if (e.time_us >= 0) d.last_time_us = std::max(d.last_time_us, e.time_us);
    if (kind == TraceKind::kAllocator) {
      if (d.memory == nullptr) d.memory = &model.Device(e.device);
      if (e.action == Action::kOom) DiagnoseAt(d, e);
      FRAGSCOPE_RETURN_IF_ERROR(d.memory->Apply(e));
      if (options.check_invariants) FRAGSCOPE_RETURN_IF_ERROR(d.memory->CheckInvariants());
    } else {
      FRAGSCOPE_RETURN_IF_ERROR(ApplyRequestEvent(d, e));
    }
    if (start_state) {
      d.start_pending = true;
      ++events;
      return Status::Ok();
    }

    DeviceReport& r = d.report;
    ++r.events;
    const When when = Now();
    if (e.action == Action::kAlloc) {
      ++r.allocs;
      ++d.window.allocs;
      d.profile.Add(e.size);
      d.window.largest_request = std::max(d.window.largest_request, e.size);
      const std::uint64_t rounded = rules.RoundSize(e.size);
      if (model::AllocatorRules::PoolFor(rounded) == Pool::kSmall) {
        d.small_window.Add(e.size);
      } else {
        d.large_window.Add(e.size);
      }
    } else if (e.action == Action::kSegmentFree || e.action == Action::kSegmentUnmap) {
      ++d.window.segment_frees;
    } else if (e.action == Action::kFreeRequested ||
               (e.action == Action::kFreeCompleted && kind == TraceKind::kRequest)) {
      ++r.frees;
    }
    const std::uint64_t requested = LiveRequested(d);
    Raise(r.peak_live_requested, requested, when);
    d.window.peak_requested = std::max(d.window.peak_requested, requested);
    if (d.memory != nullptr) {
      const std::uint64_t reserved = d.memory->reserved();
      const std::uint64_t allocated = d.memory->allocated();
      Raise(r.peak_reserved, reserved, when);
      Raise(r.peak_allocated, allocated, when);
      Raise(r.max_cached_free, reserved - allocated, when);
      d.window.peak_reserved = std::max(d.window.peak_reserved, reserved);
      d.window.peak_allocated = std::max(d.window.peak_allocated, allocated);
      TakeMoment(d, when, e.action == Action::kSegmentAlloc || e.action == Action::kSegmentMap);
    }
    ++events;
    ++d.window.events;
    if (!step_mode && d.window.events >= every) CloseWindow(d, current_step);
    return Status::Ok();
  }

  AnalysisResult Finish(const std::string& source) {
    AnalysisResult result;
    result.source = source;
    result.kind = kind;
    result.labels = header.labels;
    result.producer = header.producer;
    result.total_events = events;
    result.first_time_us = first_time_us;
    result.steps = steps;
    result.stranded_quantile = options.stranded_quantile;
    result.stranded_threshold = options.stranded_threshold;
    result.timeline_unit = step_mode ? "step" : "events";
    result.every_events = step_mode ? 0 : every;
    if (!step_mode && options.every_events == 0) {
      result.notes.push_back(
          fmt::format("no step markers in the trace: the timeline samples every {} events instead",
                      FormatCount(every)));
    }
    for (auto& dp : devices) {
      if (!dp) continue;
      DeviceState& d = *dp;
      if (d.start_pending) CountStartState(d);
      if (d.window.events > 0 || d.timeline.Samples().empty()) CloseWindow(d, current_step);
      DeviceReport r = d.report;
      if (std::optional<RatioMoments::Moment> worst =
              d.ratio_moments.Worst(r.peak_reserved.bytes)) {
        r.worst_fragmentation = Extreme{worst->cached_free, worst->when, true};
        r.worst_fragmentation_ratio =
            static_cast<double>(worst->cached_free) / static_cast<double>(worst->reserved);
        r.worst_fragmentation_reserved = worst->reserved;
      }
      r.worst_fragmentation_min_reserved = r.peak_reserved.bytes / 2 + r.peak_reserved.bytes % 2;
      if (d.capacity_from_oom) {
        result.notes.push_back(fmt::format(
            "device {}: capacity {} taken from its first recorded OOM (reserved + the driver's "
            "free bytes then)",
            d.device, FormatBytes(*d.capacity)));
      }
      r.device = d.device;
      r.name = d.name;
      r.capacity_bytes = d.capacity;
      r.live_requested_bytes = LiveRequested(d);
      r.live_requests = d.memory != nullptr ? d.memory->pool(Pool::kSmall).allocated_count +
                                                  d.memory->pool(Pool::kLarge).allocated_count
                                            : d.live.size();
      r.timeline = d.timeline.Samples();
      if (d.forecast) r.forecast = d.forecast->Finish();
      result.steps_per_sample = std::max(result.steps_per_sample, d.timeline.windows_per_sample());
      RequestProfile& p = r.requests;
      p.count = d.profile.count();
      p.bytes = d.profile.bytes();
      p.min = d.profile.min();
      p.max = d.profile.max();
      p.p50 = d.profile.Quantile(0.5);
      p.p90 = d.profile.Quantile(0.9);
      p.p99 = d.profile.Quantile(0.99);
      p.exact = d.profile.exact();
      p.distinct_sizes = d.profile.distinct_sizes();
      for (const SizeCount& sc : d.profile.TopSizes(10))
        p.top_sizes.emplace_back(sc.size, sc.count);
      p.histogram = d.profile.histogram();
      if (d.memory != nullptr) {
        const MetricsInputs in = Inputs(d);
        r.final_metrics = ComputeMetrics(*d.memory, in);
        for (Pool pool : {Pool::kSmall, Pool::kLarge}) {
          const model::SizeHistogram& h = d.memory->pool(pool).free.histogram();
          for (int b = 0; b < model::kHistogramBuckets; ++b) {
            r.free_block_histogram.count[static_cast<std::size_t>(b)] +=
                h.count[static_cast<std::size_t>(b)];
            r.free_block_histogram.bytes[static_cast<std::size_t>(b)] +=
                h.bytes[static_cast<std::size_t>(b)];
          }
        }
        r.num_ooms = d.memory->num_ooms();
        if (r.stranding_sites_at.empty()) {
          r.stranding_sites = AttributeStranding(*d.memory, kTopStrandingSites);
          r.stranding_sites_at = "end";
        }
        if (options.keep_layout) {
          d.memory->ForEachSegment([&](const model::Segment& seg) {
            LayoutSegment ls;
            ls.addr = seg.addr;
            ls.size = seg.size;
            ls.stream = seg.stream;
            ls.pool = seg.pool;
            ls.expandable = seg.expandable;
            const std::uint64_t threshold =
                seg.pool == Pool::kSmall ? in.small_threshold : in.large_threshold;
            d.memory->ForEachBlock(seg, [&](const model::Block& b) {
              ls.blocks.push_back(LayoutBlock{
                  b.addr, b.size, b.requested, b.state,
                  b.state == model::BlockState::kFree && b.size < threshold, b.frame, -1});
            });
            r.layout.push_back(std::move(ls));
          });
        }
      }
      result.devices.push_back(std::move(r));
    }
    if (options.forecast && result.devices.empty()) {
      result.notes.push_back(
          "not enough data for a forecast: no device had an event (it needs at least 2 steps)");
    }
    if (result.steps_per_sample > 1) {
      result.notes.push_back(
          fmt::format("long run: each timeline row covers {} {} (at most {} rows are kept)",
                      result.steps_per_sample * (step_mode ? 1 : every),
                      step_mode ? "steps" : "events", options.max_timeline_samples));
    }
    return result;
  }
};

std::string RatioCondition(std::uint64_t min_reserved_bytes) {
  return fmt::format("over moments with at least {} reserved, half the peak",
                     FormatBytes(min_reserved_bytes));
}

Result<std::unique_ptr<TraceAnalyzer>> TraceAnalyzer::Create(const TraceHeader& header,
                                                             const AnalysisOptions& options) {
  auto rules = model::AllocatorRules::FromSettings(header.allocator_settings);
  if (!rules.ok()) return rules.status().WithPrefix("trace header");
  if (options.forecast) {
    if (Status s = ValidateForecastOptions(*options.forecast); !s.ok()) return s;
  }
  if (!(options.stranded_quantile >= 0.0 && options.stranded_quantile <= 1.0)) {
    return Status::InvalidArgument(
        fmt::format("stranded quantile {} is outside [0, 1]", options.stranded_quantile));
  }
  auto impl = std::make_unique<Impl>(*rules);
  impl->header = header;
  impl->options = options;
  impl->kind = header.kind;
  impl->every = options.every_events != 0 ? options.every_events : kAutoEveryEvents;
  return std::unique_ptr<TraceAnalyzer>(new TraceAnalyzer(std::move(impl)));
}

TraceAnalyzer::TraceAnalyzer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceAnalyzer::~TraceAnalyzer() = default;

Status TraceAnalyzer::Consume(const Event& event) { return impl_->Consume(event); }
Status TraceAnalyzer::ConsumeStartState(const Event& event) {
  return impl_->Consume(event, /*start_state=*/true);
}
void TraceAnalyzer::Prefetch(const Event& event) const {
  const auto index = static_cast<std::size_t>(event.device);
  if (event.action == Action::kAlloc && event.device >= 0 && index < impl_->devices.size() &&
      impl_->devices[index] != nullptr) {
    impl_->devices[index]->profile.Prefetch(event.size);
  }
  if (impl_->kind != TraceKind::kAllocator) return;
  if (const model::DeviceMemory* d = impl_->model.FindDevice(event.device)) d->Prefetch(event.addr);
}
std::uint64_t TraceAnalyzer::events() const { return impl_->events; }
void TraceAnalyzer::SetAllocRetrySource(
    std::function<std::optional<std::uint64_t>(std::int32_t)> cumulative) {
  impl_->retry_source = std::move(cumulative);
}
AnalysisResult TraceAnalyzer::Finish(const std::string& source) { return impl_->Finish(source); }

}  // namespace fragscope::analysis
