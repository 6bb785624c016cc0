#include "sources/budget.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include <fmt/format.h>
#include <sys/resource.h>

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

// A limit file of the memory cgroup: "max" (v2) or a number; values from 2^62 up are how v1
// writes "no limit". 0 when absent or unlimited.
std::uint64_t ReadCgroupLimit(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "re");
  if (f == nullptr) return 0;
  char text[64] = {};
  const std::size_t n = std::fread(text, 1, sizeof text - 1, f);
  std::fclose(f);
  text[n] = '\0';
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text, &end, 10);
  if (end == text || v >= (std::uint64_t{1} << 62)) return 0;
  return v;
}

// The smallest memory limit of this process's cgroup and its ancestors (v2 memory.max, v1
// memory.limit_in_bytes), looked up under the paths /proc/self/cgroup names and, in a container
// whose cgroup is mounted as the root, at the root; 0 when none is set.
std::uint64_t CgroupMemoryLimit() {
  std::uint64_t limit = 0;
  auto take = [&limit](std::uint64_t v) {
    if (v != 0 && (limit == 0 || v < limit)) limit = v;
  };
  auto walk = [&take](const std::string& root, std::string path, const char* file) {
    for (;;) {
      take(ReadCgroupLimit(root + path + "/" + file));
      if (path.empty() || path == "/") break;
      const std::size_t slash = path.rfind('/');
      path = slash == std::string::npos ? std::string() : path.substr(0, slash);
    }
  };
  std::FILE* f = std::fopen("/proc/self/cgroup", "re");
  if (f != nullptr) {
    char line[4096];
    while (std::fgets(line, sizeof line, f) != nullptr) {
      std::string entry(line);
      while (!entry.empty() && (entry.back() == '\n' || entry.back() == '\r')) entry.pop_back();
      const std::size_t a = entry.find(':');
      const std::size_t b = a == std::string::npos ? a : entry.find(':', a + 1);
      if (b == std::string::npos) continue;
      const std::string controllers = entry.substr(a + 1, b - a - 1);
      const std::string path = entry.substr(b + 1);
      if (controllers.empty()) {
        walk("/sys/fs/cgroup", path, "memory.max");
      } else if (("," + controllers + ",").find(",memory,") != std::string::npos) {
        walk("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes");
      }
    }
    std::fclose(f);
  }
  take(ReadCgroupLimit("/sys/fs/cgroup/memory.max"));
  take(ReadCgroupLimit("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
  return limit;
}

// The address space this process has mapped now (VmSize), for RLIMIT_AS: what is left is what
// it may still allocate.
std::uint64_t MappedBytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "re");
  if (f == nullptr) return 0;
  unsigned long long pages = 0;
  const int got = std::fscanf(f, "%llu", &pages);
  std::fclose(f);
  const long page_size = sysconf(_SC_PAGESIZE);
  return got == 1 && page_size > 0 ? Times(pages, static_cast<std::uint64_t>(page_size)) : 0;
}

std::uint64_t RlimitBytes(int resource) {
  struct rlimit r = {};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return 0;
  return static_cast<std::uint64_t>(r.rlim_cur);
}

}  // namespace

UsableMemory ProcessUsableMemory() {
  UsableMemory out;
  auto take = [&out](std::uint64_t v, const char* source) {
    if (v != 0 && (out.bytes == 0 || v < out.bytes)) {
      out.bytes = v;
      out.source = source;
    }
  };
  take(PhysicalMemoryBytes(), "physical memory");
  take(CgroupMemoryLimit(), "the cgroup's memory limit");
  if (const std::uint64_t as = RlimitBytes(RLIMIT_AS); as != 0) {
    const std::uint64_t mapped = MappedBytes();
    take(as > mapped ? as - mapped : 1, "RLIMIT_AS (ulimit -v), less what is mapped");
  }
  if (const std::uint64_t data = RlimitBytes(RLIMIT_DATA); data != 0) {
    take(data, "RLIMIT_DATA (ulimit -d)");
  }
  return out;
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
  // Evaluated once: limits do not change while a command runs, and /proc reads are not free.
  static const UsableMemory usable = ProcessUsableMemory();
  if (usable.bytes != 0) budget = std::min(budget, usable.bytes / 2);
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

MemoryMeter::MemoryMeter(std::uint64_t limit, std::uint64_t input_bytes, std::uint64_t already)
    : limit_(limit != 0 ? limit : MemoryBudgetFor(input_bytes)),
      used_(already),
      user_set_(limit != 0 || ProcessBudget().max_memory_bytes != 0) {}

Status MemoryMeter::Charge(std::uint64_t bytes, std::string_view what) {
  if (bytes <= limit_ - std::min(used_, limit_)) {
    used_ += bytes;
    return Status::Ok();
  }
  const std::uint64_t reached = used_ > UINT64_MAX - bytes ? UINT64_MAX : used_ + bytes;
  return Status::LimitExceeded(BudgetMessage(fmt::format("{} outgrew the memory budget", what),
                                             "memory", limit_, reached, user_set_, "--max-memory",
                                             /*bytes=*/true));
}

}  // namespace fragscope::sources
