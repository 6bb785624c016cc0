// BfcTraceReader: a BFC allocator dump read as an allocator trace (issue 32 item 2). Each region
// becomes a segment, each chunk in use a block (`block` events: state, not allocations), and
// the failed request an `oom` event, so that `analyze` and `report` show the memory map, the
// largest free chunk against the request and the stranded bytes as for a PyTorch snapshot.
//
// Thread safety: one thread at a time, as every TraceReader.
#ifndef FRAGSCOPE_SOURCES_BFC_TEXT_BFC_TRACE_H_
#define FRAGSCOPE_SOURCES_BFC_TEXT_BFC_TRACE_H_

#include <memory>
#include <string>
#include <vector>

#include "fragscope/trace.h"
#include "sources/bfc_text/bfc_log.h"

namespace fragscope::sources {

class BfcTraceReader final : public TraceReader {
 public:
  /// The last report of `scan` with a chunk map, as events; `name` names the log in messages.
  /// Errors: kInvalidArgument when no report of the scan lists chunks.
  static Result<std::unique_ptr<BfcTraceReader>> Create(BfcLogScan scan, std::string name);

  const TraceHeader& header() const override { return header_; }
  Result<bool> Next(Event* event) override;
  const std::vector<Frame>& frames() const override { return frames_; }
  std::string Where() const override;
  std::uint64_t line_number() const override { return line_; }
  std::uint64_t input_bytes_consumed() const override { return 0; }
  std::uint64_t input_bytes_total() const override { return 0; }

  /// The scan and the report the events come from.
  const BfcLogScan& scan() const { return scan_; }
  const BfcReport& report() const { return scan_.reports[report_]; }

 private:
  BfcTraceReader() = default;

  BfcLogScan scan_;
  std::size_t report_ = 0;
  std::string name_;
  TraceHeader header_;
  std::vector<Frame> frames_;
  std::vector<std::pair<Event, std::uint64_t>> events_;  // event, log line
  std::size_t next_ = 0;
  std::uint64_t line_ = 0;
};

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_BFC_TEXT_BFC_TRACE_H_
