#include "sinks/report/json_report.h"

#include <cmath>
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "common/keyed_hash.h"
#include "fragscope/event.h"
#include "model/device_memory.h"

namespace fragscope::sinks {
namespace {

using analysis::AnalysisResult;
using analysis::DeviceReport;
using analysis::Extreme;
using analysis::LayoutBlock;
using analysis::LayoutSegment;
using analysis::RequestProfile;
using analysis::TimelineSample;
using analysis::When;
using Json = nlohmann::ordered_json;

// Keep every key name here in step with docs/json-schema.md.

std::string_view KindName(TraceKind kind) {
  switch (kind) {
    case TraceKind::kAllocator:
      return "allocator";
    case TraceKind::kRequest:
      return "request";
    case TraceKind::kUnknown:
      break;
  }
  return "unknown";
}

Json TimeOrNull(std::int64_t time_us) { return time_us < 0 ? Json(nullptr) : Json(time_us); }

Json WhenJson(const When& when) {
  Json j = Json::object();
  j["event_index"] = when.event_index;
  j["step"] = when.step;
  j["time_us"] = TimeOrNull(when.time_us);
  return j;
}

Json ExtremeJson(const Extreme& e) {
  if (!e.seen) return nullptr;
  Json j = Json::object();
  j["bytes"] = e.bytes;
  j["when"] = WhenJson(e.when);
  return j;
}

Json PoolJson(const PoolMetrics& p) {
  Json j = Json::object();
  j["reserved_bytes"] = p.reserved_bytes;
  j["allocated_bytes"] = p.allocated_bytes;
  j["active_bytes"] = p.active_bytes;
  j["requested_bytes"] = p.requested_bytes;
  j["cached_free_bytes"] = p.cached_free_bytes;
  j["fragmentation_ratio"] = p.fragmentation_ratio;
  j["largest_free_block_bytes"] = p.largest_free_block;
  j["external_fragmentation"] = p.external_fragmentation;
  j["internal_waste_bytes"] = p.internal_waste_bytes;
  j["stranded_bytes"] = p.stranded_bytes;
  j["stranded_threshold_bytes"] = p.stranded_threshold;
  j["releasable_bytes"] = p.releasable_bytes;
  j["segment_count"] = p.segment_count;
  j["block_count"] = p.block_count;
  j["allocated_block_count"] = p.allocated_block_count;
  j["pending_free_block_count"] = p.pending_free_block_count;
  j["free_block_count"] = p.free_block_count;
  return j;
}

Json FinalJson(const DeviceMetrics& m) {
  Json j = Json::object();
  j["all"] = PoolJson(m.all);
  j["small_pool"] = PoolJson(m.small_pool);
  j["large_pool"] = PoolJson(m.large_pool);
  j["max_allocatable_bytes"] = m.max_allocatable;
  j["max_allocatable_cached_bytes"] = m.max_allocatable_cached;
  j["device_free_bytes"] = m.device_free_bytes ? Json(*m.device_free_bytes) : Json(nullptr);
  j["ooms"] = m.num_ooms;
  return j;
}

// Power-of-two buckets, only the non-empty ones, smallest first.
Json HistogramJson(const model::SizeHistogram& histogram) {
  Json out = Json::array();
  for (int b = 0; b < model::kHistogramBuckets; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (histogram.count[i] == 0) continue;
    Json h = Json::object();
    h["min_bytes"] = std::uint64_t{1} << b;
    // Inclusive, so that bucket 63 still fits in 64 bits.
    h["max_bytes"] = (std::uint64_t{1} << b) + ((std::uint64_t{1} << b) - 1);
    h["count"] = histogram.count[i];
    h["total_bytes"] = histogram.bytes[i];
    out.push_back(std::move(h));
  }
  return out;
}

Json RequestsJson(const RequestProfile& p) {
  Json j = Json::object();
  j["count"] = p.count;
  j["total_bytes"] = p.bytes;
  j["min_bytes"] = p.min;
  j["p50_bytes"] = p.p50;
  j["p90_bytes"] = p.p90;
  j["p99_bytes"] = p.p99;
  j["max_bytes"] = p.max;
  j["exact_quantiles"] = p.exact;
  j["distinct_sizes"] = p.distinct_sizes;
  Json top = Json::array();
  for (const auto& [size, count] : p.top_sizes) {
    Json t = Json::object();
    t["size_bytes"] = size;
    t["count"] = count;
    top.push_back(std::move(t));
  }
  j["top_sizes"] = std::move(top);
  j["histogram"] = HistogramJson(p.histogram);
  return j;
}

Json SampleJson(const TimelineSample& s, bool allocator) {
  auto alloc_only = [allocator](auto value) { return allocator ? Json(value) : Json(nullptr); };
  Json j = Json::object();
  j["step_first"] = s.step_first;
  j["step_last"] = s.step_last;
  j["first_event"] = s.first_event;
  j["end_event"] = s.end_event;
  j["time_us"] = TimeOrNull(s.time_us);
  j["reserved_bytes"] = alloc_only(s.reserved_bytes);
  j["allocated_bytes"] = alloc_only(s.allocated_bytes);
  j["live_requested_bytes"] = s.live_requested_bytes;
  j["cached_free_bytes"] = alloc_only(s.cached_free_bytes);
  j["fragmentation_ratio"] = alloc_only(s.fragmentation_ratio);
  j["largest_free_block_bytes"] = alloc_only(s.largest_free_block);
  j["max_allocatable_bytes"] = alloc_only(s.max_allocatable);
  j["stranded_bytes"] = alloc_only(s.stranded_bytes);
  j["peak_reserved_bytes"] = alloc_only(s.peak_reserved_bytes);
  j["peak_allocated_bytes"] = alloc_only(s.peak_allocated_bytes);
  j["peak_live_requested_bytes"] = s.peak_live_requested_bytes;
  j["allocs"] = s.allocs;
  j["largest_request_bytes"] = s.largest_request;
  j["alloc_retries"] = s.alloc_retries_known ? Json(s.alloc_retries) : Json(nullptr);
  return j;
}

Json BlockJson(const LayoutBlock& b) {
  Json j = Json::object();
  j["addr"] = b.addr;
  j["size_bytes"] = b.size;
  j["state"] = model::BlockStateName(b.state);
  j["requested_bytes"] = b.state == model::BlockState::kFree ? Json(nullptr) : Json(b.requested);
  j["stranded"] = b.stranded;
  return j;
}

Json SegmentJson(const LayoutSegment& s) {
  Json j = Json::object();
  j["addr"] = s.addr;
  j["size_bytes"] = s.size;
  j["pool"] = PoolName(s.pool);
  j["stream"] = s.stream;
  j["expandable"] = s.expandable;
  Json blocks = Json::array();
  for (const LayoutBlock& b : s.blocks) blocks.push_back(BlockJson(b));
  j["blocks"] = std::move(blocks);
  return j;
}

Json OomJson(const analysis::OomDiagnosis& o) {
  Json j = Json::object();
  When when;
  when.event_index = o.event_index;
  when.step = o.step;
  when.time_us = o.time_us;
  j["when"] = WhenJson(when);
  j["requested_bytes"] = o.requested;
  j["rounded_bytes"] = o.rounded;
  j["segment_bytes"] = o.needed;
  j["pool"] = PoolName(o.pool);
  j["reserved_bytes"] = o.reserved;
  j["allocated_bytes"] = o.allocated;
  j["free_unusable_bytes"] = o.free_unusable;
  j["largest_free_block"] = o.largest_free_block;
  j["device_free_bytes"] = o.device_free ? Json(*o.device_free) : Json(nullptr);
  j["cause"] = analysis::OomCauseName(o.cause);
  j["margin_bytes"] = o.margin;
  return j;
}

Json SiteJson(const analysis::SiteStranding& s) {
  Json j = Json::object();
  j["frame"] = s.frame;
  j["site"] = s.site;
  j["stranded_bytes"] = s.stranded_bytes;
  j["live_bytes"] = s.live_bytes;
  j["blocks"] = s.blocks;
  j["segments"] = s.segments;
  return j;
}

// The calibrated OOM risk of one verdict (docs/json-schema.md, "risk").
Json OomRiskJson(const analysis::OomRisk& r) {
  Json j = Json::object();
  Json horizons = Json::array();
  for (const analysis::OomRisk::Horizon& h : r.horizons) {
    Json x = Json::object();
    x["steps"] = h.steps;
    x["probability"] = h.probability;
    horizons.push_back(std::move(x));
  }
  const auto bytes = [](double b) { return static_cast<std::int64_t>(std::llround(b)); };
  j["horizons"] = std::move(horizons);
  j["limit_low_bytes"] = bytes(r.limit_low_bytes);
  j["limit_high_bytes"] = bytes(r.limit_high_bytes);
  j["mean_demand_bytes"] = bytes(r.mean_demand_bytes);
  j["largest_demand_bytes"] = bytes(r.largest_demand_bytes);
  j["spread_bytes"] = bytes(r.spread_bytes);
  j["headroom_bytes"] = bytes(r.headroom_bytes);
  j["headroom_spreads"] = r.headroom_spreads ? Json(*r.headroom_spreads) : Json(nullptr);
  j["steps_to_oom"] = r.steps_to_oom ? Json(*r.steps_to_oom) : Json(nullptr);
  j["cost_bytes"] = bytes(r.cost_bytes);
  j["slope_bytes_per_step"] = r.slope_bytes_per_step;
  j["tail_only"] = r.tail_only;
  j["young_tail"] = r.young_tail;
  j["advice"] = r.advice;
  j["explanation"] = r.explanation;
  j["shape_cap_bytes"] = r.shape_cap_bytes ? Json(*r.shape_cap_bytes) : Json(nullptr);
  // The cache's measured overhead the limit (and signals 1 and 2) use, and where it comes from.
  Json overhead(nullptr);
  if (r.overhead) {
    overhead = Json::object();
    overhead["ratio"] = r.overhead->ratio;
    overhead["measured_ratio"] = r.overhead->measured_ratio;
    overhead["reserved_bytes"] = bytes(r.overhead->reserved_bytes);
    overhead["demand_bytes"] = bytes(r.overhead->demand_bytes);
    overhead["step"] = r.overhead->step;
  }
  j["overhead"] = std::move(overhead);
  return j;
}

Json ForecastPointJson(const analysis::ForecastPoint& p) {
  Json j = Json::object();
  j["step"] = p.step;
  j["level"] = std::string(RiskLevelName(p.level));
  j["steps_to_oom"] = p.steps_to_oom ? Json(*p.steps_to_oom) : Json(nullptr);
  j["reason"] = p.reason;
  j["risk"] = p.risk ? OomRiskJson(*p.risk) : Json(nullptr);
  return j;
}

Json ForecastJson(const analysis::DeviceForecast& f) {
  Json j = Json::object();
  j["unit"] = f.unit;
  j["every"] = f.every;
  j["samples"] = f.samples;
  j["steps_covered"] = f.steps_covered;
  j["enough_data"] = f.enough_data;
  j["first_warning_step"] = f.first_warning_step ? Json(*f.first_warning_step) : Json(nullptr);
  j["first_critical_step"] = f.first_critical_step ? Json(*f.first_critical_step) : Json(nullptr);
  j["worst_level"] = std::string(RiskLevelName(f.worst));
  j["last"] = f.enough_data ? ForecastPointJson(f.last) : Json(nullptr);
  j["risk_horizon"] = f.risk_horizon;
  j["riskiest"] = f.riskiest ? ForecastPointJson(*f.riskiest) : Json(nullptr);
  Json changes = Json::array();
  for (const analysis::ForecastPoint& p : f.changes) changes.push_back(ForecastPointJson(p));
  j["changes"] = std::move(changes);
  j["changes_dropped"] = f.changes_dropped;
  j["notes"] = f.notes;
  if (f.baseline) {
    const analysis::ForecastBaseline& b = *f.baseline;
    Json base = Json::object();
    base["architecture"] = b.architecture;
    base["baseline_runs"] = b.runs;
    base["has_baseline"] = b.has_baseline;
    base["growth_ratio"] = b.growth_ratio ? Json(*b.growth_ratio) : Json(nullptr);
    base["sentence"] = b.sentence;
    j["baseline"] = std::move(base);
  } else {
    j["baseline"] = nullptr;
  }
  return j;
}

Json DeviceJson(const DeviceReport& d, bool allocator, const JsonOptions& options) {
  auto alloc_extreme = [allocator](const Extreme& e) {
    return allocator ? ExtremeJson(e) : Json(nullptr);
  };
  Json j = Json::object();
  j["device"] = d.device;
  j["name"] = d.name;
  j["capacity_bytes"] = d.capacity_bytes ? Json(*d.capacity_bytes) : Json(nullptr);
  j["events"] = d.events;
  j["allocs"] = d.allocs;
  j["frees"] = d.frees;
  j["ooms"] = d.num_ooms;
  j["peak_reserved"] = alloc_extreme(d.peak_reserved);
  j["peak_allocated"] = alloc_extreme(d.peak_allocated);
  j["peak_live_requested"] = ExtremeJson(d.peak_live_requested);
  j["max_cached_free"] = alloc_extreme(d.max_cached_free);
  if (allocator && d.worst_fragmentation.seen) {
    Json w = Json::object();
    w["ratio"] = d.worst_fragmentation_ratio;
    w["cached_free_bytes"] = d.worst_fragmentation.bytes;
    w["reserved_bytes"] = d.worst_fragmentation_reserved;
    w["min_reserved_bytes"] = d.worst_fragmentation_min_reserved;
    w["when"] = WhenJson(d.worst_fragmentation.when);
    j["worst_fragmentation"] = std::move(w);
  } else {
    j["worst_fragmentation"] = nullptr;
  }
  j["min_largest_free_block"] = alloc_extreme(d.min_largest_free_block);
  j["min_max_allocatable"] = alloc_extreme(d.min_max_allocatable);
  j["live_requested_bytes"] = d.live_requested_bytes;
  j["live_requests"] = d.live_requests;
  j["final"] = allocator ? FinalJson(d.final_metrics) : Json(nullptr);
  j["free_block_histogram"] = allocator ? HistogramJson(d.free_block_histogram) : Json(nullptr);
  j["requests"] = RequestsJson(d.requests);
  Json ooms = Json::array();
  for (const analysis::OomDiagnosis& o : d.oom_diagnoses) ooms.push_back(OomJson(o));
  j["oom_diagnoses"] = std::move(ooms);
  Json sites = Json::array();
  for (const analysis::SiteStranding& s : d.stranding_sites) sites.push_back(SiteJson(s));
  j["stranding_sites"] = allocator ? std::move(sites) : Json(nullptr);
  j["stranding_sites_at"] =
      allocator && !d.stranding_sites_at.empty() ? Json(d.stranding_sites_at) : Json(nullptr);
  Json timeline = Json::array();
  for (const TimelineSample& s : d.timeline) timeline.push_back(SampleJson(s, allocator));
  j["timeline"] = std::move(timeline);
  j["forecast"] = d.forecast ? ForecastJson(*d.forecast) : Json(nullptr);
  if (allocator && options.include_layout) {
    Json layout = Json::array();
    for (const LayoutSegment& s : d.layout) layout.push_back(SegmentJson(s));
    j["layout"] = std::move(layout);
  } else {
    j["layout"] = nullptr;
  }
  return j;
}

}  // namespace

std::string RenderJson(const AnalysisResult& result, const JsonOptions& options) {
  // Request traces have no allocator state; unknown-kind traces (no alloc ever seen) are
  // treated as allocator traces with empty numbers, matching the text report.
  const bool allocator = result.kind != TraceKind::kRequest;
  Json j = Json::object();
  j["schema"] = kJsonSchemaName;
  j["schema_version"] = kJsonSchemaVersion;
  j["source"] = result.source;
  j["trace_kind"] = KindName(result.kind);
  j["producer"] = result.producer;
  Json labels = Json::object();
  // ordered_json finds a key by a linear search: labels[key] for each of n labels was O(n^2)
  // (300k labels took 47.7 s; issue 30 item 8). Each key is looked up in a hash map instead and
  // appended once; a repeated key keeps its first place and takes its last value, as before.
  {
    KeyedStringMap<std::size_t> index;
    index.reserve(result.labels.size());
    auto& entries = labels.get_ref<Json::object_t&>();
    for (const auto& [key, value] : result.labels) {
      const auto [it, inserted] = index.try_emplace(key, entries.size());
      if (inserted) {
        entries.emplace_back(key, value);
      } else {
        (entries.begin() + static_cast<std::ptrdiff_t>(it->second))->second = value;
      }
    }
  }
  j["labels"] = std::move(labels);
  j["total_events"] = result.total_events;
  j["steps"] = result.steps;
  j["timeline_unit"] = result.timeline_unit;
  // What a chart of the timeline puts on its x axis (issue 33 item 4): the steps when the
  // samples follow step markers, else the time when events carry times, else the event index.
  j["timeline_axis"] = result.timeline_unit == "step" ? "step"
                       : result.first_time_us >= 0    ? "time"
                                                      : "event";
  j["every_events"] = result.timeline_unit == "step" ? Json(nullptr) : Json(result.every_events);
  j["steps_per_sample"] = result.steps_per_sample;
  j["stranded_quantile"] = result.stranded_quantile;
  j["stranded_threshold_bytes"] =
      result.stranded_threshold ? Json(*result.stranded_threshold) : Json(nullptr);
  j["notes"] = result.notes;
  Json devices = Json::array();
  for (const DeviceReport& d : result.devices) devices.push_back(DeviceJson(d, allocator, options));
  j["devices"] = std::move(devices);
  // Strings come from the trace (labels, names): replace invalid UTF-8 rather than throw.
  std::string out = j.dump(options.indent, ' ', false, Json::error_handler_t::replace);
  out += '\n';
  return out;
}

}  // namespace fragscope::sinks
