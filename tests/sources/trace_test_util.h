// Helpers shared by the trace reader/writer tests: an Event printer for readable comparisons,
// and reading a whole trace.
#ifndef FRAGSCOPE_TESTS_SOURCES_TRACE_TEST_UTIL_H_
#define FRAGSCOPE_TESTS_SOURCES_TRACE_TEST_UTIL_H_

#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "fragscope/event.h"
#include "fragscope/trace.h"

namespace fragscope::testing {

/// Every field of an event, so EXPECT_EQ on two of these compares all of them and prints a
/// readable difference.
inline std::string DescribeEvent(const Event& e) {
  std::string s = std::string(ActionName(e.action));
  s += " device=" + std::to_string(e.device) + " stream=" + std::to_string(e.stream);
  s += " has_stream=" + std::to_string(e.has_stream) + " addr=" + std::to_string(e.addr);
  s += " size=" + std::to_string(e.size) + " block_size=" + std::to_string(e.block_size);
  s += " time_us=" + std::to_string(e.time_us) + " step=" + std::to_string(e.step);
  s += " device_free=" + (e.device_free ? std::to_string(*e.device_free) : std::string("none"));
  s += " pool=" + std::string(PoolName(e.pool)) + " fraction=" + std::to_string(e.fraction);
  s += " frame=" + std::to_string(e.frame) + " conf=[" + e.conf + "]";
  return s;
}

inline std::vector<std::string> DescribeEvents(const std::vector<Event>& events) {
  std::vector<std::string> out;
  for (const Event& e : events) out.push_back(DescribeEvent(e));
  return out;
}

/// Reads all events; on error returns the status and leaves what was read in *events.
inline Status ReadAll(TraceReader& reader, std::vector<Event>* events) {
  for (;;) {
    Event event;
    Result<bool> got = reader.Next(&event);
    if (!got.ok()) return got.status();
    if (!*got) return Status::Ok();
    events->push_back(event);
  }
}

/// The error a trace in memory produces (an open error or the first Next() error), or OK.
inline Status FirstError(const std::string& bytes, const TraceLimits& limits = {},
                         const std::string& name = "t") {
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::FromBytes(bytes, name, limits);
  if (!reader.ok()) return reader.status();
  std::vector<Event> events;
  return ReadAll(**reader, &events);
}

}  // namespace fragscope::testing

#endif  // FRAGSCOPE_TESTS_SOURCES_TRACE_TEST_UTIL_H_
