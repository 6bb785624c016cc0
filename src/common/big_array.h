// BigArrayAllocator<T>: a std::allocator for the few large, randomly accessed arrays of a
// replay (hash-table slots, block records). Allocations of 2 MiB or more are 2 MiB-aligned and
// marked for transparent huge pages (Linux madvise(MADV_HUGEPAGE); a no-op elsewhere or when
// THP is off): a replay touches such arrays at random, and with 4 KiB pages nearly every access
// misses the TLB, which costs more than the cache miss itself on a virtual machine (nested page
// walks). Smaller allocations go to operator new. This file and big_array.cc hold the only
// OS-specific calls of the model.
//
// Thread safety: stateless.
#ifndef FRAGSCOPE_COMMON_BIG_ARRAY_H_
#define FRAGSCOPE_COMMON_BIG_ARRAY_H_

#include <cstddef>
#include <new>
#include <vector>

namespace fragscope {

/// `bytes` of memory aligned for any type; huge-page backed from 2 MiB up. Throws
/// std::bad_alloc like operator new.
void* AllocateBigArray(std::size_t bytes);
/// REQUIRES: `p` came from AllocateBigArray(bytes).
void FreeBigArray(void* p, std::size_t bytes) noexcept;

template <typename T>
struct BigArrayAllocator {
  static_assert(alignof(T) <= alignof(std::max_align_t));
  using value_type = T;
  BigArrayAllocator() = default;
  template <typename U>
  BigArrayAllocator(const BigArrayAllocator<U>&) {}  // NOLINT: rebinding is implicit
  T* allocate(std::size_t n) { return static_cast<T*>(AllocateBigArray(n * sizeof(T))); }
  void deallocate(T* p, std::size_t n) noexcept { FreeBigArray(p, n * sizeof(T)); }
  template <typename U>
  bool operator==(const BigArrayAllocator<U>&) const {
    return true;
  }
};

template <typename T>
using BigVector = std::vector<T, BigArrayAllocator<T>>;

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_BIG_ARRAY_H_
