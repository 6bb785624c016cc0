// Hand-made AnalysisResult values for the sink tests: the sinks only format, so their tests
// build the values to format directly instead of running the analyzer.
#ifndef FRAGSCOPE_TESTS_SINKS_SAMPLE_RESULTS_H_
#define FRAGSCOPE_TESTS_SINKS_SAMPLE_RESULTS_H_

#include <cstdint>
#include <initializer_list>
#include <utility>

#include "analysis/analysis_result.h"
#include "common/units.h"

namespace fragscope::testing {

/// A block of a hand-made segment: its size and how it is drawn.
struct BlockSpec {
  std::uint64_t size;
  char kind;  // '#' allocated, '+' pending free, '.' free, '!' stranded
};

/// A segment at `addr` tiled by `blocks` in order; its size is their sum.
inline analysis::LayoutSegment MakeSegment(std::uint64_t addr,
                                           std::initializer_list<BlockSpec> blocks,
                                           Pool pool = Pool::kLarge) {
  analysis::LayoutSegment s;
  s.addr = addr;
  s.pool = pool;
  std::uint64_t at = addr;
  for (const BlockSpec& spec : blocks) {
    analysis::LayoutBlock b;
    b.addr = at;
    b.size = spec.size;
    switch (spec.kind) {
      case '#':
        b.state = model::BlockState::kAllocated;
        b.requested = spec.size;
        break;
      case '+':
        b.state = model::BlockState::kPendingFree;
        b.requested = spec.size;
        break;
      case '!':
        b.state = model::BlockState::kFree;
        b.stranded = true;
        break;
      default:
        b.state = model::BlockState::kFree;
        break;
    }
    s.blocks.push_back(b);
    at += spec.size;
  }
  s.size = at - addr;
  return s;
}

inline analysis::Extreme MakeExtreme(std::uint64_t bytes, std::uint64_t event, std::int64_t step,
                                     std::int64_t time_us = -1) {
  analysis::Extreme e;
  e.bytes = bytes;
  e.when = {event, step, time_us};
  e.seen = true;
  return e;
}

/// An allocator-trace result: one device, three steps (setup + 0..2), two segments.
inline analysis::AnalysisResult MakeAllocatorResult() {
  analysis::AnalysisResult r;
  r.source = "train.jsonl.gz";
  r.kind = TraceKind::kAllocator;
  r.producer = "unit-test";
  r.labels = {{"model", "toy"}};
  r.timeline_unit = "step";
  r.total_events = 40;
  r.steps = 3;
  r.stranded_quantile = 0.5;

  analysis::DeviceReport d;
  d.device = 0;
  d.name = "Fake GPU";
  d.capacity_bytes = 1 * kGiB;
  d.events = 40;
  d.allocs = 18;
  d.frees = 15;
  d.peak_reserved = MakeExtreme(42 * kMiB, 12, 1, 2'500'000);
  d.peak_allocated = MakeExtreme(30 * kMiB, 11, 1);
  d.peak_live_requested = MakeExtreme(29 * kMiB, 11, 1);
  d.max_cached_free = MakeExtreme(20 * kMiB, 30, 2);
  d.worst_fragmentation = MakeExtreme(20 * kMiB, 30, 2);
  d.worst_fragmentation_ratio = 20.0 / 42.0;
  d.worst_fragmentation_reserved = 42 * kMiB;
  d.worst_fragmentation_min_reserved = 21 * kMiB;
  d.min_largest_free_block = MakeExtreme(512 * kKiB, 3, -1);
  d.min_max_allocatable = MakeExtreme(10 * kMiB, 30, 2);
  d.live_requested_bytes = 21 * kMiB;
  d.live_requests = 3;

  DeviceMetrics& m = d.final_metrics;
  m.device = 0;
  m.large_pool.reserved_bytes = 40 * kMiB;
  m.large_pool.allocated_bytes = 22 * kMiB;
  m.large_pool.active_bytes = 24 * kMiB;
  m.large_pool.requested_bytes = 21 * kMiB;
  m.large_pool.cached_free_bytes = 18 * kMiB;
  m.large_pool.fragmentation_ratio = 18.0 / 40.0;
  m.large_pool.largest_free_block = 12 * kMiB;
  m.large_pool.external_fragmentation = 1.0 - 12.0 / 16.0;
  m.large_pool.internal_waste_bytes = 1 * kMiB;
  m.large_pool.stranded_bytes = 1 * kMiB;
  m.large_pool.stranded_threshold = 2 * kMiB;
  m.large_pool.segment_count = 2;
  m.large_pool.block_count = 6;
  m.large_pool.allocated_block_count = 3;
  m.large_pool.pending_free_block_count = 1;
  m.large_pool.free_block_count = 2;
  m.small_pool.reserved_bytes = 2 * kMiB;
  m.small_pool.stranded_threshold = 512;
  m.small_pool.cached_free_bytes = 2 * kMiB;
  m.small_pool.fragmentation_ratio = 1.0;
  m.small_pool.largest_free_block = 2 * kMiB;
  m.small_pool.releasable_bytes = 2 * kMiB;
  m.small_pool.segment_count = 1;
  m.small_pool.block_count = 1;
  m.small_pool.free_block_count = 1;
  m.all = m.large_pool;
  m.all.reserved_bytes = 42 * kMiB;
  m.all.cached_free_bytes = 20 * kMiB;
  m.all.fragmentation_ratio = 20.0 / 42.0;
  m.all.releasable_bytes = 2 * kMiB;
  m.all.stranded_threshold = 0;
  m.max_allocatable = 900 * kMiB;
  m.max_allocatable_cached = 12 * kMiB;
  m.device_free_bytes = 982 * kMiB;

  d.requests.count = 18;
  d.requests.bytes = 100 * kMiB;
  d.requests.min = 512;
  d.requests.p50 = 2 * kMiB;
  d.requests.p90 = 10 * kMiB;
  d.requests.p99 = 12 * kMiB;
  d.requests.max = 12 * kMiB;
  d.requests.distinct_sizes = 4;
  d.requests.top_sizes = {{2 * kMiB, 9}, {10 * kMiB, 5}, {512, 3}, {12 * kMiB, 1}};
  d.requests.histogram.count[9] = 3;
  d.requests.histogram.bytes[9] = 3 * 512;
  d.requests.histogram.count[21] = 9;
  d.requests.histogram.bytes[21] = 18 * kMiB;

  const std::int64_t steps[] = {-1, 0, 1, 2};
  const std::uint64_t ends[] = {5, 10, 20, 40};
  std::uint64_t first = 0;
  for (int i = 0; i < 4; ++i) {
    analysis::TimelineSample s;
    s.step_first = s.step_last = steps[i];
    s.first_event = first;
    s.end_event = ends[i];
    first = ends[i];
    s.reserved_bytes = (i == 0 ? 2 : 42) * kMiB;
    s.allocated_bytes = (i == 0 ? 1 : 22) * kMiB;
    s.cached_free_bytes = s.reserved_bytes - s.allocated_bytes;
    s.fragmentation_ratio =
        static_cast<double>(s.cached_free_bytes) / static_cast<double>(s.reserved_bytes);
    s.largest_free_block = 1 * kMiB;
    s.max_allocatable = 900 * kMiB;
    s.peak_reserved_bytes = 42 * kMiB;
    s.peak_allocated_bytes = 30 * kMiB;
    s.allocs = 5;
    d.timeline.push_back(s);
  }

  d.layout.push_back(MakeSegment(0x7f0000000000, {{20 * kMiB, '#'}}));
  d.layout.push_back(MakeSegment(
      0x7f0002000000,
      {{2 * kMiB, '#'}, {1 * kMiB, '!'}, {2 * kMiB, '+'}, {12 * kMiB, '.'}, {3 * kMiB, '#'}}));
  d.layout.push_back(MakeSegment(0x7f0004000000, {{2 * kMiB, '.'}}, Pool::kSmall));
  r.devices.push_back(std::move(d));
  return r;
}

/// A request-trace result: no allocator numbers, only live requested bytes and sizes.
inline analysis::AnalysisResult MakeRequestResult() {
  analysis::AnalysisResult r;
  r.source = "requests.jsonl";
  r.kind = TraceKind::kRequest;
  r.timeline_unit = "step";
  r.total_events = 8;
  r.steps = 2;
  analysis::DeviceReport d;
  d.events = 8;
  d.allocs = 4;
  d.frees = 2;
  d.peak_live_requested = MakeExtreme(3 * kMiB + 2048, 6, 1);
  d.live_requested_bytes = 1536;
  d.live_requests = 2;
  d.requests.count = 4;
  d.requests.bytes = 3 * kMiB + 1536;
  d.requests.min = 512;
  d.requests.p50 = 1024;
  d.requests.p90 = 3 * kMiB;
  d.requests.p99 = 3 * kMiB;
  d.requests.max = 3 * kMiB;
  d.requests.distinct_sizes = 3;
  d.requests.top_sizes = {{3 * kMiB, 1}, {1024, 1}, {512, 2}};
  d.requests.histogram.count[9] = 2;
  d.requests.histogram.bytes[9] = 1024;
  d.requests.histogram.count[10] = 1;
  d.requests.histogram.bytes[10] = 1024;
  d.requests.histogram.count[21] = 1;
  d.requests.histogram.bytes[21] = 3 * kMiB;
  analysis::TimelineSample a;
  a.step_first = a.step_last = 0;
  a.end_event = 5;
  a.live_requested_bytes = 3 * kMiB + 1536;
  a.peak_live_requested_bytes = 3 * kMiB + 1536;
  a.allocs = 3;
  a.largest_request = 3 * kMiB;
  analysis::TimelineSample b;
  b.step_first = b.step_last = 1;
  b.first_event = 5;
  b.end_event = 8;
  b.live_requested_bytes = 1536;
  b.peak_live_requested_bytes = 3 * kMiB + 2048;
  b.allocs = 1;
  b.largest_request = 512;
  d.timeline = {a, b};
  r.devices.push_back(std::move(d));
  return r;
}

}  // namespace fragscope::testing

#endif  // FRAGSCOPE_TESTS_SINKS_SAMPLE_RESULTS_H_
