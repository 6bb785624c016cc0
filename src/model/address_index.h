// AddressIndex: block start address -> block id, an open-addressing hash table with linear
// probing and backward-shift deletion. The hot path of every trace replay looks blocks up by
// address; a node-based map would cost a cache miss per level.
//
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_ADDRESS_INDEX_H_
#define FRAGSCOPE_MODEL_ADDRESS_INDEX_H_

#include <bit>
#include <cstdint>
#include <vector>

#include "common/big_array.h"

namespace fragscope::model {

class AddressIndex {
 public:
  static constexpr std::uint32_t kNotFound = 0xffffffffu;

  AddressIndex() { Rehash(64); }

  std::uint32_t Find(std::uint64_t key) const {
    if (key == kEmptyKey) return kNotFound;
    for (std::size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return slots_[i].value;
      if (slots_[i].key == kEmptyKey) return kNotFound;
    }
  }

  /// REQUIRES: key is not present and key != UINT64_MAX.
  void Insert(std::uint64_t key, std::uint32_t value) {
    if ((size_ + 1) * 4 > slots_.size() * 3) Rehash(slots_.size() * 2);
    std::size_t i = Slot(key);
    while (slots_[i].key != kEmptyKey) i = (i + 1) & mask_;
    slots_[i] = {key, value};
    ++size_;
  }

  /// Changes the value of a present key; no-op when absent.
  void Update(std::uint64_t key, std::uint32_t value) {
    for (std::size_t i = Slot(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {
        slots_[i].value = value;
        return;
      }
      if (slots_[i].key == kEmptyKey) return;
    }
  }

  /// Removes `key` if present.
  void Erase(std::uint64_t key) {
    std::size_t i = Slot(key);
    while (slots_[i].key != key) {
      if (slots_[i].key == kEmptyKey) return;
      i = (i + 1) & mask_;
    }
    // Backward-shift: move later entries of the probe run into the hole.
    for (std::size_t j = (i + 1) & mask_;; j = (j + 1) & mask_) {
      if (slots_[j].key == kEmptyKey) break;
      const std::size_t home = Slot(slots_[j].key);
      // Entry j may move to i iff i lies cyclically in [home, j).
      if (((j - home) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = slots_[j];
        i = j;
      }
    }
    slots_[i].key = kEmptyKey;
    --size_;
  }

  std::size_t size() const { return size_; }

  /// Hints the CPU to load the slot `key` hashes to: a caller that knows the next keys
  /// (a replay loop reading ahead) hides the cache miss of a later Find().
  void Prefetch(std::uint64_t key) const { __builtin_prefetch(&slots_[Slot(key)]); }

 private:
  static constexpr std::uint64_t kEmptyKey = ~std::uint64_t{0};

  std::size_t Slot(std::uint64_t key) const {
    return static_cast<std::size_t>((key * 0x9E3779B97F4A7C15ull) >> shift_);
  }

  void Rehash(std::size_t capacity) {
    BigVector<Slot_> old = std::move(slots_);
    slots_.assign(capacity, Slot_{kEmptyKey, 0});
    mask_ = capacity - 1;
    shift_ = 64 - std::countr_zero(capacity);
    size_ = 0;
    for (const Slot_& s : old) {
      if (s.key != kEmptyKey) Insert(s.key, s.value);
    }
  }

  // Key and value side by side: one cache line per probe.
  struct Slot_ {
    std::uint64_t key;
    std::uint32_t value;
  };
  BigVector<Slot_> slots_;  // huge pages once large: lookups are random
  std::size_t mask_ = 0;
  int shift_ = 0;
  std::size_t size_ = 0;
};

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_ADDRESS_INDEX_H_
