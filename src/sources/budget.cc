#include "sources/budget.h"

#include <unistd.h>

#include <algorithm>

#include <fmt/format.h>

#include "common/units.h"
#include "sources/trace/input_stream.h"

namespace fragscope::sources {
namespace {

constexpr std::uint64_t kMinMemoryBytes = std::uint64_t{1} << 30;  // 1 GiB
constexpr std::uint64_t kMemoryPerInputByte = 64;
constexpr std::uint64_t kMinDecodedBytes = std::uint64_t{4} << 30;  // 4 GiB
constexpr std::uint64_t kDecodedPerInputByte = 1024;
constexpr std::uint64_t kMinEvents = 1'000'000;
constexpr std::uint64_t kDecodedBytesPerEvent = 4;
constexpr std::uint64_t kTraceEventsPerInputByte = 64;
constexpr std::uint64_t kMinOutputBytes = std::uint64_t{256} << 20;  // 256 MiB
// Real snapshots write out 25-55x their pickle as JSON (frames shared in the pickle are written at
// every reference): 1024x leaves room for deeper stacks.
constexpr std::uint64_t kOutputPerInputByte = 1024;

std::uint64_t Times(std::uint64_t a, std::uint64_t b) {
  return b != 0 && a > UINT64_MAX / b ? UINT64_MAX : a * b;
}

}  // namespace

InputBudget& ProcessBudget() {
  static InputBudget budget;
  return budget;
}

std::uint64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return Times(static_cast<std::uint64_t>(pages), static_cast<std::uint64_t>(page_size));
}

namespace {

// An input whose size is not known before it is read (0: a pipe, FIFO or standard input) is
// budgeted as the largest a stream may be (--max-input-bytes), so a long legitimate pipe is
// bounded by that one limit rather than refused at the floors.
std::uint64_t SizeOrStreamLimit(std::uint64_t input_bytes) {
  return input_bytes != 0 ? input_bytes : StreamInputLimit();
}

}  // namespace

std::uint64_t BudgetInputBytes(std::string_view head, const InputStream* rest) {
  if (rest == nullptr) return head.size();
  return rest->raw_bytes_total() == 0 ? 0 : head.size() + rest->raw_bytes_total();
}

std::uint64_t MemoryBudgetFor(std::uint64_t input_bytes) {
  if (ProcessBudget().max_memory_bytes != 0) return ProcessBudget().max_memory_bytes;
  input_bytes = SizeOrStreamLimit(input_bytes);
  std::uint64_t budget = std::max(kMinMemoryBytes, Times(input_bytes, kMemoryPerInputByte));
  if (const std::uint64_t machine = PhysicalMemoryBytes(); machine != 0) {
    budget = std::min(budget, machine / 2);
  }
  return budget;
}

std::uint64_t DecodedBudgetFor(std::uint64_t input_bytes) {
  if (ProcessBudget().max_decoded_bytes != 0) return ProcessBudget().max_decoded_bytes;
  return std::max(kMinDecodedBytes, Times(SizeOrStreamLimit(input_bytes), kDecodedPerInputByte));
}

std::uint64_t EventBudgetFor(std::uint64_t decoded_bytes) {
  if (ProcessBudget().max_events != 0) return ProcessBudget().max_events;
  return std::max(kMinEvents, decoded_bytes / kDecodedBytesPerEvent);
}

std::uint64_t TraceEventBudgetFor(std::uint64_t input_bytes) {
  if (ProcessBudget().max_events != 0) return ProcessBudget().max_events;
  return std::max(kMinEvents, Times(SizeOrStreamLimit(input_bytes), kTraceEventsPerInputByte));
}

std::uint64_t OutputBudgetFor(std::uint64_t decoded_bytes) {
  if (ProcessBudget().max_output_bytes != 0) return ProcessBudget().max_output_bytes;
  return std::max(kMinOutputBytes, Times(decoded_bytes, kOutputPerInputByte));
}

std::string BudgetMessage(std::string_view what, std::string_view name, std::uint64_t limit,
                          std::uint64_t reached, bool user_set, std::string_view flag, bool bytes) {
  auto figure = [bytes](std::uint64_t n) {
    return bytes ? fmt::format("{} bytes ({})", n, FormatBytes(n)) : fmt::format("{}", n);
  };
  return fmt::format("{}: reached {}, more than the {} budget of {} ({}); raise it with {}", what,
                     figure(reached), name, figure(limit),
                     user_set ? fmt::format("set by {}", flag)
                              : std::string("derived from the input's size and this machine's "
                                            "memory"),
                     flag);
}

}  // namespace fragscope::sources
