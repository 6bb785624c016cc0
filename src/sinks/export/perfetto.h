// PerfettoWriter: Chrome/Perfetto trace-event JSON ({"traceEvents": [...]}) for ui.perfetto.dev
// or chrome://tracing. One process per device ("GPU N"); counter tracks "reserved",
// "allocated", "largest free block" (bytes) and "fragmentation ratio"; instant events for OOMs
// and segment_alloc/free/map/unmap with their sizes. Written as it comes, through `write`.
// docs/formats.md shows an excerpt.
//
// Thread safety: none.
#ifndef FRAGSCOPE_SINKS_EXPORT_PERFETTO_H_
#define FRAGSCOPE_SINKS_EXPORT_PERFETTO_H_

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "analysis/counter_track.h"
#include "fragscope/status.h"

namespace fragscope::sinks {

class PerfettoWriter {
 public:
  using WriteFn = std::function<Status(std::string_view)>;
  /// `source` is recorded in the trace's metadata.
  PerfettoWriter(WriteFn write, std::string source);

  Status Sample(const analysis::CounterSample& sample);
  Status Mark(const analysis::Marker& marker);
  /// Closes the JSON document. Must be called once, last.
  Status Finish();

  std::uint64_t events_written() const { return written_; }

 private:
  Status Begin();
  Status Append(std::string_view json_object);
  Status NameDevice(std::int32_t device);

  WriteFn write_;
  std::string source_;
  bool begun_ = false;
  std::uint64_t written_ = 0;
  std::vector<bool> named_;
  std::string buffer_;
};

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_EXPORT_PERFETTO_H_
