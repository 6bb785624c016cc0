// KeyedStringHash: the hash of every string-keyed table built from input (trace headers, JSON
// objects, pickle strings, frames, OOM messages). std::hash<std::string> is unkeyed, so a
// crafted file can put every key in one bucket and make a table's inserts quadratic (hash
// flooding); SipHash under a key drawn at random once per process cannot be steered that way
// without knowing the key (issue 24 item 2).
//
// Thread safety: pure functions; the process key is set once, on first use, thread-safely.
#ifndef FRAGSCOPE_COMMON_KEYED_HASH_H_
#define FRAGSCOPE_COMMON_KEYED_HASH_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>

namespace fragscope {

/// SipHash with `c` compression and `d` finalization rounds of `data` under the 128-bit key
/// (k0, k1), the key's bytes read little-endian. SipHash-1-3 (c=1, d=3) is what the tables
/// use; SipHash-2-4 is the reference's, kept to test against its published vectors.
std::uint64_t SipHash(std::uint64_t k0, std::uint64_t k1, std::string_view data, int c = 1,
                      int d = 3);

/// SipHash-1-3 of `data` under this process's random key.
std::uint64_t ProcessKeyedHash(std::string_view data);

struct KeyedStringHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view s) const {
    return static_cast<std::size_t>(ProcessKeyedHash(s));
  }
};

/// A string-keyed map safe from hash flooding.
template <typename V>
using KeyedStringMap = std::unordered_map<std::string, V, KeyedStringHash, std::equal_to<>>;

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_KEYED_HASH_H_
