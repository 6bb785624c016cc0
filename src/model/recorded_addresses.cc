#include "model/recorded_addresses.h"

#include <algorithm>

#include "model/allocator_rules.h"

namespace fragscope::model {

void RecordedAddresses::Add(std::uint64_t bytes, std::uint64_t addr) {
  if (bytes == 0 || addr == 0) return;
  by_size_[bytes].push_back(addr);
  lowest_ = recorded_ == 0 ? addr : std::min(lowest_, addr);
  ++recorded_;
}

std::uint64_t RecordedAddresses::Take(std::uint64_t bytes) {
  const auto it = by_size_.find(bytes);
  if (it == by_size_.end() || it->second.empty()) return 0;
  const std::uint64_t addr = it->second.front();
  it->second.pop_front();
  return addr;
}

std::uint64_t RecordedAddresses::base() const { return lowest_ - lowest_ % kRoundLarge; }

void RecordedAddresses::Attach(DriverModel* driver) {
  driver->address_base = base();
  driver->segment_address = [this](std::uint64_t bytes) { return Take(bytes); };
}

}  // namespace fragscope::model
