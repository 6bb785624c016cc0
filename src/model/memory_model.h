// MemoryModel: one DeviceMemory per GPU, created when a device's first event arrives.
//
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_MEMORY_MODEL_H_
#define FRAGSCOPE_MODEL_MEMORY_MODEL_H_

#include <memory>
#include <vector>

#include "model/device_memory.h"

namespace fragscope::model {

class MemoryModel {
 public:
  static constexpr std::int32_t kMaxDevices = 4096;

  explicit MemoryModel(AllocatorRules rules = {}) : rules_(rules) {}

  /// Applies `event` to its device (created on first use). Errors as DeviceMemory::Apply, or
  /// kCorruption for a device index outside [0, kMaxDevices).
  Status Apply(const Event& event);

  /// The device, creating it if needed. REQUIRES: 0 <= device < kMaxDevices.
  DeviceMemory& Device(std::int32_t device);
  /// nullptr if the device has had no event.
  const DeviceMemory* FindDevice(std::int32_t device) const;
  /// Devices that exist, in index order.
  std::vector<const DeviceMemory*> devices() const;

 private:
  AllocatorRules rules_;
  std::vector<std::unique_ptr<DeviceMemory>> devices_;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_MEMORY_MODEL_H_
