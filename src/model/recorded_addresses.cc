#include "model/recorded_addresses.h"

#include <algorithm>
#include <cstdint>

#include "model/allocator_rules.h"

namespace fragscope::model {

void RecordedAddresses::Add(std::uint64_t bytes, std::uint64_t addr) {
  if (bytes == 0 || addr == 0) return;
  by_size_[bytes].push_back(addr);
  const std::uint64_t end = addr > UINT64_MAX - bytes ? UINT64_MAX : addr + bytes;
  end_ = std::max(end_, end);
  ++recorded_;
}

std::uint64_t RecordedAddresses::Take(std::uint64_t bytes) {
  const auto it = by_size_.find(bytes);
  if (it == by_size_.end() || it->second.empty()) return 0;
  const std::uint64_t addr = it->second.front();
  it->second.pop_front();
  return addr;
}

std::uint64_t RecordedAddresses::base() const {
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 47;  // DriverModel::address_base's
  if (end_ == 0 || end_ > kLimit - kRoundLarge) return 0;
  return (end_ + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

void RecordedAddresses::Attach(DriverModel* driver) {
  driver->address_base = base();
  driver->segment_address = [this](std::uint64_t bytes) { return Take(bytes); };
}

}  // namespace fragscope::model
