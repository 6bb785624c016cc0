#include "analysis/analyzer_thread.h"

#include <utility>

#include "model/memory_model.h"

namespace fragscope::analysis {

namespace {
constexpr std::size_t kPrefetchAhead = 8;  // as `analyze` reads ahead of its analyzer
}  // namespace

AnalyzerThread::AnalyzerThread(const TraceAnalyzer& analyzer, Consume consume)
    : analyzer_(analyzer),
      consume_(std::move(consume)),
      pipe_([this](std::span<Item> items) { return ConsumeBatch(items); }) {}

void AnalyzerThread::Send(const Event& event, std::optional<std::uint64_t> alloc_retries,
                          std::uint64_t where) {
  if (pipe_.failed()) return;
  Item& item = pipe_.Slot();
  item.event = event;
  item.retries = alloc_retries;
  item.where = where;
  pipe_.Commit();
}

std::optional<std::uint64_t> AnalyzerThread::AllocRetries(std::int32_t device) const {
  const auto index = static_cast<std::size_t>(device);
  return device >= 0 && index < retries_.size() ? retries_[index] : std::nullopt;
}

Status AnalyzerThread::ConsumeBatch(std::span<Item> items) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i + kPrefetchAhead < items.size()) analyzer_.Prefetch(items[i + kPrefetchAhead].event);
    const Item& item = items[i];
    const std::int32_t device = item.event.device;
    // A step marker is not the simulator's and names no device.
    if (item.retries && item.event.action != Action::kStep && device >= 0 &&
        device < model::MemoryModel::kMaxDevices) {
      const auto index = static_cast<std::size_t>(device);
      if (index >= retries_.size()) retries_.resize(index + 1);
      retries_[index] = item.retries;
    }
    FRAGSCOPE_RETURN_IF_ERROR(consume_(item.event, item.where));
  }
  return Status::Ok();
}

}  // namespace fragscope::analysis
