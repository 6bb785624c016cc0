#include "model/recorded_addresses.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "model/allocator_rules.h"

namespace fragscope::model {

void RecordedAddresses::Add(std::uint64_t bytes, std::uint64_t addr) {
  if (bytes == 0 || addr == 0) return;
  if (!by_size_) {
    by_size_ = std::make_shared<Table>();
  } else if (by_size_.use_count() > 1) {
    by_size_ = std::make_shared<Table>(*by_size_);  // an attached driver keeps the old one
  }
  (*by_size_)[bytes].push_back(addr);
  const std::uint64_t end = addr > UINT64_MAX - bytes ? UINT64_MAX : addr + bytes;
  end_ = std::max(end_, end);
  ++recorded_;
}

std::uint64_t RecordedAddresses::base() const {
  constexpr std::uint64_t kLimit = std::uint64_t{1} << 47;  // DriverModel::address_base's
  if (end_ == 0 || end_ > kLimit - kRoundLarge) return 0;
  return (end_ + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

void RecordedAddresses::Attach(DriverModel* driver) const {
  driver->address_base = base();
  if (!by_size_) {
    driver->segment_address = nullptr;
    return;
  }
  // The table is shared read-only; the cursors travel with each copy of the function.
  driver->segment_address = [table = std::shared_ptr<const Table>(by_size_),
                             next = std::unordered_map<std::uint64_t, std::size_t>()](
                                std::uint64_t bytes) mutable -> std::uint64_t {
    const auto it = table->find(bytes);
    if (it == table->end()) return 0;
    std::size_t& i = next[bytes];
    return i < it->second.size() ? it->second[i++] : 0;
  };
}

}  // namespace fragscope::model
