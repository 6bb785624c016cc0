#include "sinks/export/perfetto.h"

#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace fragscope::sinks {
namespace {

TEST(PerfettoWriterTest, WritesTraceEventJsonWithCountersAndInstants) {
  std::string out;
  int writes = 0;
  PerfettoWriter writer(
      [&](std::string_view s) {
        out += s;
        ++writes;
        return Status::Ok();
      },
      "in \"quotes\".pickle");
  analysis::CounterSample s;
  s.device = 1;
  s.ts_us = 42;
  s.reserved = 20 << 20;
  s.allocated = 4 << 20;
  s.largest_free_block = 16 << 20;
  s.fragmentation_ratio = 0.8;
  ASSERT_TRUE(writer.Sample(s).ok());
  analysis::Marker m;
  m.device = 1;
  m.ts_us = 50;
  m.event.action = Action::kOom;
  m.event.size = 1 << 30;
  m.event.device_free = 12345;
  ASSERT_TRUE(writer.Mark(m).ok());
  ASSERT_TRUE(writer.Finish().ok());
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["otherData"]["source"], "in \"quotes\".pickle");
  const auto& events = j["traceEvents"];
  ASSERT_EQ(events.size(), 2u + 4u + 1u);  // process name + sort index, 4 counters, 1 instant
  EXPECT_EQ(events[0]["ph"], "M");
  EXPECT_EQ(events[0]["args"]["name"], "GPU 1");
  EXPECT_EQ(events[2]["name"], "reserved");
  EXPECT_EQ(events[2]["ph"], "C");
  EXPECT_EQ(events[2]["ts"], 42);
  EXPECT_EQ(events[2]["pid"], 1);
  EXPECT_EQ(events[2]["args"]["value"], 20 << 20);
  EXPECT_DOUBLE_EQ(events[5]["args"]["value"].get<double>(), 0.8);
  EXPECT_EQ(events[6]["ph"], "i");
  EXPECT_EQ(events[6]["name"], "OOM: 1.00 GiB requested");
  EXPECT_EQ(events[6]["args"]["device_free"], 12345);
  EXPECT_EQ(writer.events_written(), 7u);
  EXPECT_EQ(writes, 1);  // small outputs go out in one write
}

TEST(PerfettoWriterTest, AnEmptyTraceIsStillValidJson) {
  std::string out;
  PerfettoWriter writer(
      [&](std::string_view s) {
        out += s;
        return Status::Ok();
      },
      "x");
  ASSERT_TRUE(writer.Finish().ok());
  EXPECT_TRUE(nlohmann::json::parse(out)["traceEvents"].empty());
}

}  // namespace
}  // namespace fragscope::sinks
