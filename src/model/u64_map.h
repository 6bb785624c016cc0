// U64Map: uint64 -> uint64 (U64MapOf<V>: -> V) for ids chosen by a program (request-trace ids,
// addresses), built on AddressIndex plus a slot array with a free list. Lookups are one hash probe;
// memory is proportional to live entries.
//
// Thread safety: none.
#ifndef FRAGSCOPE_MODEL_U64_MAP_H_
#define FRAGSCOPE_MODEL_U64_MAP_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "model/address_index.h"

namespace fragscope::model {

/// Keys to values of type V (default uint64). Find returns a copy; Get a pointer that stays
/// valid until the next Insert.
template <typename V = std::uint64_t>
class U64MapOf {
 public:
  bool Contains(std::uint64_t key) const { return index_.Find(key) != AddressIndex::kNotFound; }
  std::optional<V> Find(std::uint64_t key) const {
    const std::uint32_t slot = index_.Find(key);
    if (slot == AddressIndex::kNotFound) return std::nullopt;
    return values_[slot];
  }
  V* Get(std::uint64_t key) {
    const std::uint32_t slot = index_.Find(key);
    return slot == AddressIndex::kNotFound ? nullptr : &values_[slot];
  }
  /// REQUIRES: !Contains(key) and key != UINT64_MAX (AddressIndex's empty marker).
  void Insert(std::uint64_t key, const V& value) {
    std::uint32_t slot;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
      values_[slot] = value;
    } else {
      slot = static_cast<std::uint32_t>(values_.size());
      values_.push_back(value);
    }
    index_.Insert(key, slot);
  }
  /// Removes `key`; returns its value, or nullopt if absent.
  std::optional<V> Erase(std::uint64_t key) {
    const std::uint32_t slot = index_.Find(key);
    if (slot == AddressIndex::kNotFound) return std::nullopt;
    index_.Erase(key);
    free_slots_.push_back(slot);
    return values_[slot];
  }
  std::size_t size() const { return index_.size(); }

 private:
  AddressIndex index_;
  std::vector<V> values_;
  std::vector<std::uint32_t> free_slots_;
};

using U64Map = U64MapOf<>;

}  // namespace fragscope::model

#endif  // FRAGSCOPE_MODEL_U64_MAP_H_
