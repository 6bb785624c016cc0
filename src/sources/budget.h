// Input budgets (issue 24 item 1): how much a reader may decode from one input before it
// stops with kLimitExceeded. A file from a stranger can be tiny and still describe billions of
// objects (compression, pickle memo references), so every figure is bounded by what the input's
// size justifies and by the machine's memory, and checked while the data is decoded, never
// after. docs/user-guide.md, "Input budgets", lists the defaults and the flags.
//
//   memory  bytes of decoded structures (document, memo, stack, collected payloads):
//           64 x the input's size, at least 1 GiB, at most half the memory this process may
//           use (ProcessUsableMemory: physical memory, the cgroup's limit, RLIMIT_AS/DATA)
//   events  segments, blocks and trace entries a snapshot decoder reaches, each time it
//           reaches one: one per 4 decoded input bytes, at least 1,000,000; events of a
//           trace: 64 per byte of the file as stored, at least 1,000,000
//   decoded bytes a snapshot file may decompress to: 1024 x its size, at least 4 GiB (and
//           never more than PickleLimits::max_input_bytes, 64 GiB)
//   output  bytes `convert --to json` (and --to perfetto) may write: 1024 x the decoded input
//           (perfetto: the input as stored), at least 256 MiB
//
// Thread safety: ProcessBudget() is set once, before any reader runs; reading it is then safe.
#ifndef FRAGSCOPE_SOURCES_BUDGET_H_
#define FRAGSCOPE_SOURCES_BUDGET_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "fragscope/status.h"

namespace fragscope::sources {

/// Limits the user set (0 = derive from the input, as above).
struct InputBudget {
  std::uint64_t max_memory_bytes = 0;   // --max-memory
  std::uint64_t max_events = 0;         // --max-events
  std::uint64_t max_output_bytes = 0;   // --max-output
  std::uint64_t max_decoded_bytes = 0;  // --max-decoded
};

/// The process's budget: the command line sets it (apps/fragscope), readers consult it when
/// their own options leave a limit at 0.
InputBudget& ProcessBudget();

class InputStream;

/// The size the budgets take for an input whose first bytes are `head` and whose rest, if any,
/// comes from `rest`: 0 when `rest` is a stream of unknown size (see below).
std::uint64_t BudgetInputBytes(std::string_view head, const InputStream* rest);

/// Physical memory of this machine in bytes; 0 when unknown.
std::uint64_t PhysicalMemoryBytes();

/// The memory this process may really use (issue 30 item 6): the least of physical memory, the
/// memory cgroup's limit (v2 memory.max or v1 memory.limit_in_bytes, the process's cgroup and
/// its ancestors), RLIMIT_AS less the address space already mapped, and RLIMIT_DATA. `source`
/// names the one that decided ("physical memory", "the cgroup's memory limit", ...); bytes 0
/// when none is known.
struct UsableMemory {
  std::uint64_t bytes = 0;
  const char* source = "";
};
UsableMemory ProcessUsableMemory();

/// The budgets below take the input's size; 0 means not known before reading (a stream: a pipe,
/// FIFO or standard input), budgeted as the largest a stream may be (StreamInputLimit(),
/// --max-input-bytes).
///
/// The memory budget for decoding an input of `input_bytes` (its size on disk or in memory).
std::uint64_t MemoryBudgetFor(std::uint64_t input_bytes);
/// How many bytes a snapshot of `input_bytes` (as stored) may decompress to: even a reader that
/// keeps nothing spends time on every decoded byte.
std::uint64_t DecodedBudgetFor(std::uint64_t input_bytes);
/// The event budget for a snapshot of `decoded_bytes` (pickle or JSON bytes after
/// decompression).
std::uint64_t EventBudgetFor(std::uint64_t decoded_bytes);
/// The event budget for a trace file of `input_bytes` (as stored, maybe compressed): a trace
/// line takes tens of bytes, so only a compression bomb comes near it.
std::uint64_t TraceEventBudgetFor(std::uint64_t input_bytes);
/// The output budget for writing out an input of `decoded_bytes`.
std::uint64_t OutputBudgetFor(std::uint64_t decoded_bytes);

/// The message of a budget error: "<what>: reached <reached>, more than the <name> budget of
/// <limit> (<how it was set>); raise it with <flag>". `bytes` formats the figures as sizes.
std::string BudgetMessage(std::string_view what, std::string_view name, std::uint64_t limit,
                          std::uint64_t reached, bool user_set, std::string_view flag, bool bytes);

/// The memory budget charged copy by copy, for what a stage keeps beyond the structures its
/// reader already measured (issue 30 item 4): the strings the snapshot decoder copies out of the
/// document (call sites, allocator settings, annotations), each copy charged when it is made.
/// Thread safety: none.
class MemoryMeter {
 public:
  /// `limit` 0 = MemoryBudgetFor(input_bytes); `already` bytes are in use before the first
  /// charge (the document the decoder reads).
  MemoryMeter(std::uint64_t limit, std::uint64_t input_bytes, std::uint64_t already = 0);
  /// Adds `bytes`; kLimitExceeded ("<what> outgrew the memory budget: reached ...", as
  /// BudgetMessage) when the total would pass the limit, and nothing is added then.
  Status Charge(std::uint64_t bytes, std::string_view what);
  std::uint64_t used() const { return used_; }
  std::uint64_t limit() const { return limit_; }

 private:
  std::uint64_t limit_;
  std::uint64_t used_;
  bool user_set_;
};

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_BUDGET_H_
