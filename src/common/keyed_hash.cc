// KeyedStringHash (keyed_hash.h).
#include "common/keyed_hash.h"

#include <cstring>
#include <random>

namespace fragscope {
namespace {

std::uint64_t Rotl(std::uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct SipState {
  std::uint64_t v0, v1, v2, v3;
  void Round() {
    v0 += v1;
    v1 = Rotl(v1, 13);
    v1 ^= v0;
    v0 = Rotl(v0, 32);
    v2 += v3;
    v3 = Rotl(v3, 16);
    v3 ^= v2;
    v0 += v3;
    v3 = Rotl(v3, 21);
    v3 ^= v0;
    v2 += v1;
    v1 = Rotl(v1, 17);
    v1 ^= v2;
    v2 = Rotl(v2, 32);
  }
  void Absorb(std::uint64_t m, int rounds) {
    v3 ^= m;
    for (int i = 0; i < rounds; ++i) Round();
    v0 ^= m;
  }
};

std::uint64_t LoadLe64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

struct ProcessKey {
  std::uint64_t k0, k1;
  ProcessKey() {
    std::random_device rd;  // getrandom(2) on Linux
    k0 = (std::uint64_t{rd()} << 32) ^ rd();
    k1 = (std::uint64_t{rd()} << 32) ^ rd();
  }
};

}  // namespace

std::uint64_t SipHash(std::uint64_t k0, std::uint64_t k1, std::string_view data, int c, int d) {
  SipState s{k0 ^ 0x736f6d6570736575ULL, k1 ^ 0x646f72616e646f6dULL, k0 ^ 0x6c7967656e657261ULL,
             k1 ^ 0x7465646279746573ULL};
  const auto* p = reinterpret_cast<const unsigned char*>(data.data());
  const std::size_t n = data.size();
  std::size_t i = 0;
  for (; i + 8 <= n; i += 8) s.Absorb(LoadLe64(p + i), c);
  std::uint64_t last = static_cast<std::uint64_t>(n & 0xff) << 56;
  for (std::size_t j = 0; i + j < n; ++j) last |= std::uint64_t{p[i + j]} << (8 * j);
  s.Absorb(last, c);
  s.v2 ^= 0xff;
  for (int r = 0; r < d; ++r) s.Round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

std::uint64_t ProcessKeyedHash(std::string_view data) {
  static const ProcessKey key;
  return SipHash(key.k0, key.k1, data);
}

}  // namespace fragscope
