#include "sinks/export/perfetto.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/units.h"

namespace fragscope::sinks {
namespace {
constexpr std::size_t kFlushBytes = std::size_t{1} << 20;
}  // namespace

PerfettoWriter::PerfettoWriter(WriteFn write, std::string source)
    : write_(std::move(write)), source_(std::move(source)) {}

Status PerfettoWriter::Begin() {
  if (begun_) return Status::Ok();
  begun_ = true;
  buffer_ = R"({"displayTimeUnit":"ms","otherData":{"producer":"fragscope","source":)";
  buffer_ += nlohmann::json(source_).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  buffer_ += R"(},"traceEvents":[)";
  return Status::Ok();
}

Status PerfettoWriter::Append(std::string_view json_object) {
  FRAGSCOPE_RETURN_IF_ERROR(Begin());
  if (written_ > 0) buffer_ += ",\n";
  buffer_ += json_object;
  ++written_;
  if (buffer_.size() >= kFlushBytes) {
    FRAGSCOPE_RETURN_IF_ERROR(write_(buffer_));
    buffer_.clear();
  }
  return Status::Ok();
}

Status PerfettoWriter::NameDevice(std::int32_t device) {
  const auto d = static_cast<std::size_t>(device);
  if (d < named_.size() && named_[d]) return Status::Ok();
  if (d >= named_.size()) named_.resize(d + 1, false);
  named_[d] = true;
  FRAGSCOPE_RETURN_IF_ERROR(Append(fmt::format(
      R"({{"name":"process_name","ph":"M","pid":{0},"tid":0,"args":{{"name":"GPU {0}"}}}})",
      device)));
  return Append(fmt::format(
      R"({{"name":"process_sort_index","ph":"M","pid":{0},"tid":0,"args":{{"sort_index":{0}}}}})",
      device));
}

Status PerfettoWriter::Sample(const analysis::CounterSample& s) {
  FRAGSCOPE_RETURN_IF_ERROR(NameDevice(s.device));
  const auto counter = [&](std::string_view name, std::string value) {
    return Append(fmt::format(R"({{"name":"{}","ph":"C","ts":{},"pid":{},"args":{{"value":{}}}}})",
                              name, s.ts_us, s.device, value));
  };
  FRAGSCOPE_RETURN_IF_ERROR(counter("reserved", std::to_string(s.reserved)));
  FRAGSCOPE_RETURN_IF_ERROR(counter("allocated", std::to_string(s.allocated)));
  FRAGSCOPE_RETURN_IF_ERROR(counter("largest free block", std::to_string(s.largest_free_block)));
  return counter("fragmentation ratio", fmt::format("{:.6f}", s.fragmentation_ratio));
}

Status PerfettoWriter::Mark(const analysis::Marker& m) {
  FRAGSCOPE_RETURN_IF_ERROR(NameDevice(m.device));
  const Event& e = m.event;
  std::string name;
  std::string args = fmt::format(R"("event_index":{},"addr":"{}","size":{})", m.event_index,
                                 FormatAddress(e.addr), e.size);
  if (e.action == Action::kOom) {
    name = fmt::format("OOM: {} requested", FormatBytes(e.size));
    if (e.device_free) args += fmt::format(R"(,"device_free":{})", *e.device_free);
  } else {
    name = fmt::format("{} {}", ActionName(e.action), FormatBytes(e.size));
  }
  return Append(fmt::format(
      R"({{"name":"{}","cat":"{}","ph":"i","s":"p","ts":{},"pid":{},"tid":0,"args":{{{}}}}})", name,
      ActionName(e.action), m.ts_us, m.device, args));
}

Status PerfettoWriter::Finish() {
  FRAGSCOPE_RETURN_IF_ERROR(Begin());
  buffer_ += "]}\n";
  FRAGSCOPE_RETURN_IF_ERROR(write_(buffer_));
  buffer_.clear();
  return Status::Ok();
}

}  // namespace fragscope::sinks
