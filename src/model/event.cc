#include "fragscope/event.h"

#include <array>

namespace fragscope {

namespace {
constexpr std::array<std::string_view, kNumActions> kActionNames = {
    "alloc",
    "free_requested",
    "free_completed",
    "segment_alloc",
    "segment_free",
    "segment_map",
    "segment_unmap",
    "oom",
    "snapshot",
    "step",
    "record_stream",
    "stream_sync",
    "empty_cache",
    "set_memory_fraction",
    "set_allocator_settings",
    "block",
};
}  // namespace

std::string_view ActionName(Action action) {
  return kActionNames[static_cast<std::size_t>(action)];
}

std::optional<Action> ParseActionName(std::string_view name) {
  // Hot in the trace reader: compare the common actions first.
  if (name == "alloc") return Action::kAlloc;
  if (name == "free_completed") return Action::kFreeCompleted;
  if (name == "free_requested") return Action::kFreeRequested;
  for (std::size_t i = 0; i < kActionNames.size(); ++i) {
    if (kActionNames[i] == name) return static_cast<Action>(i);
  }
  return std::nullopt;
}

std::string_view PoolName(Pool pool) {
  switch (pool) {
    case Pool::kSmall:
      return "small";
    case Pool::kLarge:
      return "large";
    case Pool::kUnknown:
      break;
  }
  return "unknown";
}

}  // namespace fragscope
