#include "sinks/report/json_report.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "common/units.h"
#include "sinks/sample_results.h"

namespace fragscope::sinks {
namespace {

using Json = nlohmann::json;

Json Parse(const std::string& text) {
  Json j = Json::parse(text, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << text;
  return j;
}

TEST(RenderJsonTest, TopLevelNamesTheSchema) {
  const std::string text = RenderJson(testing::MakeAllocatorResult());
  ASSERT_FALSE(text.empty());
  EXPECT_EQ(text.back(), '\n');
  const Json j = Parse(text);
  EXPECT_EQ(j["schema"], "fragscope.analyze");
  EXPECT_EQ(j["schema_version"], 1);
  EXPECT_EQ(j["source"], "train.jsonl.gz");
  EXPECT_EQ(j["trace_kind"], "allocator");
  EXPECT_EQ(j["producer"], "unit-test");
  EXPECT_EQ(j["labels"]["model"], "toy");
  EXPECT_EQ(j["total_events"], 40);
  EXPECT_EQ(j["steps"], 3);
  EXPECT_EQ(j["timeline_unit"], "step");
  EXPECT_TRUE(j["every_events"].is_null());
  EXPECT_EQ(j["stranded_quantile"], 0.5);
  EXPECT_TRUE(j["stranded_threshold_bytes"].is_null());
  EXPECT_TRUE(j["notes"].is_array());
  ASSERT_EQ(j["devices"].size(), 1u);
}

TEST(RenderJsonTest, KeyOrderIsStable) {
  const std::string text = RenderJson(testing::MakeAllocatorResult());
  // ordered_json keeps insertion order: the schema name comes first, devices last.
  EXPECT_EQ(text.find("\"schema\""), 4u);
  EXPECT_LT(text.find("\"schema_version\""), text.find("\"devices\""));
}

TEST(RenderJsonTest, ExtremesCarryBytesAndWhen) {
  const Json d = Parse(RenderJson(testing::MakeAllocatorResult()))["devices"][0];
  EXPECT_EQ(d["device"], 0);
  EXPECT_EQ(d["name"], "Fake GPU");
  EXPECT_EQ(d["capacity_bytes"], kGiB);
  EXPECT_EQ(d["peak_reserved"]["bytes"], 42 * kMiB);
  EXPECT_EQ(d["peak_reserved"]["when"]["event_index"], 12);
  EXPECT_EQ(d["peak_reserved"]["when"]["step"], 1);
  EXPECT_EQ(d["peak_reserved"]["when"]["time_us"], 2'500'000);
  EXPECT_TRUE(d["peak_allocated"]["when"]["time_us"].is_null());
  EXPECT_EQ(d["min_largest_free_block"]["when"]["step"], -1);
  EXPECT_DOUBLE_EQ(d["worst_fragmentation"]["ratio"].get<double>(), 20.0 / 42.0);
  EXPECT_EQ(d["worst_fragmentation"]["cached_free_bytes"], 20 * kMiB);
  EXPECT_EQ(d["worst_fragmentation"]["when"]["event_index"], 30);
  for (const char* key : {"peak_allocated", "peak_live_requested", "max_cached_free",
                          "min_largest_free_block", "min_max_allocatable"}) {
    EXPECT_TRUE(d[key].contains("bytes")) << key;
    EXPECT_TRUE(d[key].contains("when")) << key;
  }
}

TEST(RenderJsonTest, UnseenExtremeIsNull) {
  auto r = testing::MakeAllocatorResult();
  r.devices[0].min_max_allocatable.seen = false;
  r.devices[0].worst_fragmentation.seen = false;
  const Json d = Parse(RenderJson(r))["devices"][0];
  EXPECT_TRUE(d["min_max_allocatable"].is_null());
  EXPECT_TRUE(d["worst_fragmentation"].is_null());
}

TEST(RenderJsonTest, FinalMetricsPerPool) {
  const Json f = Parse(RenderJson(testing::MakeAllocatorResult()))["devices"][0]["final"];
  for (const char* pool : {"all", "small_pool", "large_pool"}) {
    for (const char* key :
         {"reserved_bytes", "allocated_bytes", "active_bytes", "requested_bytes",
          "cached_free_bytes", "fragmentation_ratio", "largest_free_block_bytes",
          "external_fragmentation", "internal_waste_bytes", "stranded_bytes",
          "stranded_threshold_bytes", "releasable_bytes", "segment_count", "block_count",
          "allocated_block_count", "pending_free_block_count", "free_block_count"}) {
      EXPECT_TRUE(f[pool].contains(key)) << pool << "." << key;
    }
  }
  EXPECT_EQ(f["all"]["reserved_bytes"], 42 * kMiB);
  EXPECT_TRUE(f["all"]["reserved_bytes"].is_number_unsigned());
  EXPECT_TRUE(f["all"]["fragmentation_ratio"].is_number_float());
  EXPECT_DOUBLE_EQ(f["large_pool"]["external_fragmentation"].get<double>(), 0.25);
  EXPECT_EQ(f["small_pool"]["stranded_threshold_bytes"], 512);
  EXPECT_EQ(f["large_pool"]["stranded_threshold_bytes"], 2 * kMiB);
  EXPECT_EQ(f["max_allocatable_bytes"], 900 * kMiB);
  EXPECT_EQ(f["max_allocatable_cached_bytes"], 12 * kMiB);
  EXPECT_EQ(f["device_free_bytes"], 982 * kMiB);
  EXPECT_EQ(f["ooms"], 0);
}

TEST(RenderJsonTest, UnknownDeviceFreeIsNull) {
  auto r = testing::MakeAllocatorResult();
  r.devices[0].final_metrics.device_free_bytes.reset();
  r.devices[0].capacity_bytes.reset();
  const Json d = Parse(RenderJson(r))["devices"][0];
  EXPECT_TRUE(d["final"]["device_free_bytes"].is_null());
  EXPECT_TRUE(d["capacity_bytes"].is_null());
}

TEST(RenderJsonTest, TimelineHasEveryRow) {
  const Json t = Parse(RenderJson(testing::MakeAllocatorResult()))["devices"][0]["timeline"];
  ASSERT_EQ(t.size(), 4u);
  EXPECT_EQ(t[0]["step_first"], -1);
  EXPECT_EQ(t[0]["first_event"], 0);
  EXPECT_EQ(t[0]["end_event"], 5);
  EXPECT_EQ(t[3]["reserved_bytes"], 42 * kMiB);
  EXPECT_EQ(t[3]["allocated_bytes"], 22 * kMiB);
  EXPECT_EQ(t[3]["cached_free_bytes"], 20 * kMiB);
  EXPECT_EQ(t[3]["peak_reserved_bytes"], 42 * kMiB);
  EXPECT_EQ(t[3]["allocs"], 5);
  EXPECT_TRUE(t[3]["time_us"].is_null());
  for (const char* key :
       {"step_last", "live_requested_bytes", "fragmentation_ratio", "largest_free_block_bytes",
        "max_allocatable_bytes", "stranded_bytes", "peak_allocated_bytes",
        "peak_live_requested_bytes", "largest_request_bytes"}) {
    EXPECT_TRUE(t[3].contains(key)) << key;
  }
}

TEST(RenderJsonTest, LayoutListsSegmentsAndBlocks) {
  const Json layout = Parse(RenderJson(testing::MakeAllocatorResult()))["devices"][0]["layout"];
  ASSERT_EQ(layout.size(), 3u);
  const Json& s = layout[1];  // input order, not the map's order
  EXPECT_EQ(s["addr"], 0x7f0002000000u);
  EXPECT_EQ(s["size_bytes"], 20 * kMiB);
  EXPECT_EQ(s["pool"], "large");
  EXPECT_EQ(s["stream"], 0);
  EXPECT_EQ(s["expandable"], false);
  ASSERT_EQ(s["blocks"].size(), 5u);
  EXPECT_EQ(s["blocks"][0]["state"], "allocated");
  EXPECT_EQ(s["blocks"][0]["requested_bytes"], 2 * kMiB);
  EXPECT_EQ(s["blocks"][1]["state"], "free");
  EXPECT_EQ(s["blocks"][1]["stranded"], true);
  EXPECT_TRUE(s["blocks"][1]["requested_bytes"].is_null());
  EXPECT_EQ(s["blocks"][1]["addr"], 0x7f0002000000u + 2 * kMiB);
  EXPECT_EQ(s["blocks"][2]["state"], "pending_free");
  EXPECT_EQ(s["blocks"][3]["stranded"], false);
  EXPECT_EQ(layout[2]["pool"], "small");
}

TEST(RenderJsonTest, LayoutCanBeLeftOut) {
  JsonOptions options;
  options.include_layout = false;
  const Json d = Parse(RenderJson(testing::MakeAllocatorResult(), options))["devices"][0];
  EXPECT_TRUE(d.contains("layout"));
  EXPECT_TRUE(d["layout"].is_null());
}

TEST(RenderJsonTest, CompactIsOneLine) {
  JsonOptions options;
  options.indent = -1;
  const std::string text = RenderJson(testing::MakeAllocatorResult(), options);
  EXPECT_EQ(text.find('\n'), text.size() - 1);
}

TEST(RenderJsonTest, RequestTraceHasNullAllocatorNumbers) {
  const Json j = Parse(RenderJson(testing::MakeRequestResult()));
  EXPECT_EQ(j["trace_kind"], "request");
  const Json& d = j["devices"][0];
  EXPECT_TRUE(d["final"].is_null());
  EXPECT_TRUE(d["layout"].is_null());
  EXPECT_TRUE(d["peak_reserved"].is_null());
  EXPECT_TRUE(d["worst_fragmentation"].is_null());
  EXPECT_EQ(d["peak_live_requested"]["bytes"], 3 * kMiB + 2048);
  EXPECT_EQ(d["live_requested_bytes"], 1536);
  EXPECT_EQ(d["live_requests"], 2);
  const Json& t = d["timeline"];
  ASSERT_EQ(t.size(), 2u);
  EXPECT_TRUE(t[0]["reserved_bytes"].is_null());
  EXPECT_TRUE(t[0]["fragmentation_ratio"].is_null());
  EXPECT_EQ(t[1]["peak_live_requested_bytes"], 3 * kMiB + 2048);
  EXPECT_EQ(t[0]["largest_request_bytes"], 3 * kMiB);
}

TEST(RenderJsonTest, RequestProfile) {
  const Json p = Parse(RenderJson(testing::MakeRequestResult()))["devices"][0]["requests"];
  EXPECT_EQ(p["count"], 4);
  EXPECT_EQ(p["total_bytes"], 3 * kMiB + 1536);
  EXPECT_EQ(p["min_bytes"], 512);
  EXPECT_EQ(p["p50_bytes"], 1024);
  EXPECT_EQ(p["p90_bytes"], 3 * kMiB);
  EXPECT_EQ(p["p99_bytes"], 3 * kMiB);
  EXPECT_EQ(p["max_bytes"], 3 * kMiB);
  EXPECT_EQ(p["exact_quantiles"], true);
  EXPECT_EQ(p["distinct_sizes"], 3);
  ASSERT_EQ(p["top_sizes"].size(), 3u);
  EXPECT_EQ(p["top_sizes"][0]["size_bytes"], 3 * kMiB);
  EXPECT_EQ(p["top_sizes"][2]["count"], 2);
  // Only non-empty buckets; bounds inclusive.
  ASSERT_EQ(p["histogram"].size(), 3u);
  EXPECT_EQ(p["histogram"][0]["min_bytes"], 512);
  EXPECT_EQ(p["histogram"][0]["max_bytes"], 1023);
  EXPECT_EQ(p["histogram"][0]["count"], 2);
  EXPECT_EQ(p["histogram"][2]["min_bytes"], 2 * kMiB);
  EXPECT_EQ(p["histogram"][2]["total_bytes"], 3 * kMiB);
}

TEST(RenderJsonTest, TopHistogramBucketFitsIn64Bits) {
  auto r = testing::MakeRequestResult();
  r.devices[0].requests.histogram.count[63] = 1;
  const Json h = Parse(RenderJson(r))["devices"][0]["requests"]["histogram"];
  EXPECT_EQ(h.back()["max_bytes"].get<std::uint64_t>(), ~std::uint64_t{0});
}

TEST(RenderJsonTest, EventsTimelineSaysHowMany) {
  auto r = testing::MakeRequestResult();
  r.timeline_unit = "events";
  r.every_events = 1000;
  r.stranded_threshold = 4 * kMiB;
  const Json j = Parse(RenderJson(r));
  EXPECT_EQ(j["timeline_unit"], "events");
  EXPECT_EQ(j["every_events"], 1000);
  EXPECT_EQ(j["stranded_threshold_bytes"], 4 * kMiB);
}

TEST(RenderJsonTest, InvalidUtf8InTraceStringsDoesNotThrow) {
  auto r = testing::MakeAllocatorResult();
  r.labels.push_back({"run", std::string("bad \xff\xfe bytes")});
  r.devices[0].name = "\xc3";
  const Json j = Parse(RenderJson(r));
  EXPECT_TRUE(j["labels"]["run"].is_string());
  EXPECT_TRUE(j["devices"][0]["name"].is_string());
}

}  // namespace
}  // namespace fragscope::sinks
