#include "model/memory_model.h"

#include <fmt/format.h>

namespace fragscope::model {

Status MemoryModel::Apply(const Event& event) {
  if (event.device < 0 || event.device >= kMaxDevices) {
    return Status::Corruption(
        fmt::format("device {} is outside [0, {})", event.device, kMaxDevices));
  }
  return Device(event.device).Apply(event);
}

DeviceMemory& MemoryModel::Device(std::int32_t device) {
  const auto index = static_cast<std::size_t>(device);
  if (index >= devices_.size()) devices_.resize(index + 1);
  if (!devices_[index]) devices_[index] = std::make_unique<DeviceMemory>(device, rules_);
  return *devices_[index];
}

const DeviceMemory* MemoryModel::FindDevice(std::int32_t device) const {
  const auto index = static_cast<std::size_t>(device);
  return device >= 0 && index < devices_.size() ? devices_[index].get() : nullptr;
}

std::vector<const DeviceMemory*> MemoryModel::devices() const {
  std::vector<const DeviceMemory*> out;
  for (const auto& d : devices_) {
    if (d) out.push_back(d.get());
  }
  return out;
}

}  // namespace fragscope::model
