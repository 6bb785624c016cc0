// PodBuffer<T>: a growable array of plain values that grows and shrinks with realloc, which
// for large blocks remaps pages instead of copying them (glibc uses mremap above the mmap
// threshold). The Document's arenas reach hundreds of MB for big snapshots; std::vector would
// copy them at every doubling and once more in shrink_to_fit, touching every page each time.
//
// With WarmAhead(), a Prefaulter faults the pages just past the end in on another thread while
// this one fills the buffer (see common/prefaulter.h), at most `window` bytes ahead.
//
// Only for types that may be moved by copying their bytes (no constructors run, new slots are
// uninitialised). Thread safety: none.
#ifndef FRAGSCOPE_SOURCES_DOCUMENT_POD_BUFFER_H_
#define FRAGSCOPE_SOURCES_DOCUMENT_POD_BUFFER_H_

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

#include "common/prefaulter.h"

namespace fragscope::sources::internal {

template <typename T>
class PodBuffer {
  static_assert(std::is_trivially_copy_constructible_v<T> && std::is_trivially_destructible_v<T>);

 public:
  PodBuffer() = default;
  PodBuffer(const PodBuffer&) = delete;
  PodBuffer& operator=(const PodBuffer&) = delete;
  PodBuffer(PodBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)),
        size_(std::exchange(other.size_, 0)),
        capacity_(std::exchange(other.capacity_, 0)),
        limit_(std::exchange(other.limit_, 0)) {
    other.WarmAhead(nullptr, 0);
  }
  PodBuffer& operator=(PodBuffer&& other) noexcept {
    if (this != &other) {
      std::free(data_);
      data_ = std::exchange(other.data_, nullptr);
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, 0);
      limit_ = std::exchange(other.limit_, 0);
      WarmAhead(nullptr, 0);
      other.WarmAhead(nullptr, 0);
    }
    return *this;
  }
  ~PodBuffer() { std::free(data_); }

  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](std::size_t i) { return data_[i]; }
  const T& operator[](std::size_t i) const { return data_[i]; }

  void push_back(const T& value) {
    if (size_ >= limit_) Reach(size_ + 1);
    data_[size_++] = value;
  }
  /// Adds n uninitialised slots and returns the first; pointers into the buffer taken before
  /// may be invalid afterwards.
  T* Extend(std::size_t n) {
    if (limit_ - size_ < n) Reach(size_ + n);  // size_ <= limit_ always
    T* slots = data_ + size_;
    size_ += n;
    return slots;
  }
  /// REQUIRES: `values` does not point into this buffer.
  void Append(const T* values, std::size_t n) {
    if (n > 0) std::memcpy(static_cast<void*>(Extend(n)), values, n * sizeof(T));
  }
  /// REQUIRES: n <= size().
  void Truncate(std::size_t n) { size_ = n; }
  /// From now on `prefaulter` (nullptr: none) warms up to `window` bytes past the end as the
  /// buffer fills. Requests still queued when the buffer shrinks or is freed are harmless (see
  /// common/prefaulter.h); draining the prefaulter first (as Document::FinishBuilding does)
  /// keeps them from warming memory that is no longer the buffer's.
  void WarmAhead(Prefaulter* prefaulter, std::size_t window) {
    prefaulter_ = window >= sizeof(T) ? prefaulter : nullptr;
    window_ = window / sizeof(T);
    warmed_ = size_;
    limit_ = capacity_;
    if (prefaulter_ != nullptr) Reach(size_);
  }

  void ShrinkToFit() {
    if (size_ == capacity_) return;
    if (size_ == 0) {
      std::free(std::exchange(data_, nullptr));
      capacity_ = 0;
      return;
    }
    if (void* p = std::realloc(static_cast<void*>(data_), size_ * sizeof(T))) {
      data_ = static_cast<T*>(p);
      capacity_ = size_;
      limit_ = std::min(limit_, capacity_);
      warmed_ = std::min(warmed_, capacity_);
    }  // else keep the larger block: shrinking is only an optimisation
  }
  void Release() { *this = PodBuffer(); }

 private:
  // The slow path of push_back and Extend: grows to hold `needed` elements and keeps the warm
  // region at least half a window past the end. limit_ is where the next call is due.
  void Reach(std::size_t needed) {
    if (needed > capacity_) Grow(needed);
    limit_ = capacity_;
    if (prefaulter_ == nullptr || warmed_ >= capacity_) return;  // next stop: growth
    if (warmed_ < needed + window_ / 2) {
      const std::size_t from = std::max(warmed_, needed);
      const std::size_t to = std::min(capacity_, needed + window_);
      if (to > from) prefaulter_->Populate(data_ + from, (to - from) * sizeof(T));
      warmed_ = std::max(warmed_, to);
    }
    if (warmed_ < capacity_) {
      limit_ = std::max(needed, warmed_ > window_ / 2 ? warmed_ - window_ / 2 : std::size_t{0});
    }
  }

  void Grow(std::size_t needed) {
    std::size_t capacity = std::max<std::size_t>({needed, capacity_ * 2, 16});
    void* p = std::realloc(static_cast<void*>(data_), capacity * sizeof(T));
    if (p == nullptr) throw std::bad_alloc();
    data_ = static_cast<T*>(p);
    capacity_ = capacity;
  }

  T* data_ = nullptr;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
  std::size_t limit_ = 0;  // <= capacity_; push_back and Extend take the slow path beyond it
  Prefaulter* prefaulter_ = nullptr;
  std::size_t window_ = 0;  // elements
  std::size_t warmed_ = 0;  // elements [0, warmed_) are warm or queued
};

}  // namespace fragscope::sources::internal

#endif  // FRAGSCOPE_SOURCES_DOCUMENT_POD_BUFFER_H_
