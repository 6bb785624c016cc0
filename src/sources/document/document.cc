// Document storage: handles, object records and three flat arenas.
//
// A Value is 64 bits whose low 4 bits are a tag:
//   0  None (all bits zero)          1  bool (bit 4)       2  int in bits 4..63 (60-bit signed)
//   3  stored int64   4  big int   5  float   6  string   7  bytes   8  list   9  tuple   10  dict
// Tags 3..10 hold an ObjectId in bits 4..35. Per object, word_[id] is its arena offset (or, for
// floats and stored int64s, the 64 bits themselves) and size_[id] its item, entry or byte count.
//
// Arenas: items_ (list and tuple items), entries_ (dict entries) and bytes_ (string, bytes and
// big int payloads). Every container's items form one run [word_, word_ + size_) in its arena,
// so Items() and Entries() are spans. The arenas are append-only: a slot, once written, never
// changes, which is what makes sharing runs safe. Adding to a container:
//   * its first items go to the arena's end (pickle fills a container with one APPENDS or
//     SETITEMS batch in the common case, so this is the only case that matters for speed);
//   * when its run ends at the arena's end, further items go right behind it;
//   * when it has spare capacity reserved behind its run (reserved_), they go there;
//   * otherwise (another container was appended to in between: e.g. a device trace list
//     receives 1,000 entries per APPENDS and each entry's frame list lands in the arena before
//     the next batch) the run moves to the arena's end with as much spare capacity again as it
//     holds, so a container moves O(log n) times and the abandoned copies and spare slots
//     together stay below twice its final size.
// Equal item runs are shared: when a list or tuple receives its first items, or a tuple is
// made, the run is looked up by content (run_index_) and, if an equal run exists, the new
// container points at it and the arena is cut back. Real snapshots hold many distinct frame
// lists with equal contents (one per trace entry, built from the same frame dicts), and sharing
// them reduces the items arena 3-10x on the real corpus. Sharing cannot leak writes: a
// container writes only behind the arena's end or into capacity reserved for it alone. Dict
// entries are not shared: trace-entry dicts are nearly all distinct, so the index would cost
// more than it saves.
#include "sources/document/document.h"

#include <algorithm>
#include <bit>
#include <cstring>

namespace fragscope::sources {

namespace {

using internal::IdOf;
using internal::kTagBigInt;
using internal::kTagBits;
using internal::kTagBool;
using internal::kTagBytes;
using internal::kTagDict;
using internal::kTagFloat;
using internal::kTagInt64;
using internal::kTagList;
using internal::kTagSmallInt;
using internal::kTagString;
using internal::kTagTuple;
using internal::TagOf;
// Ints in [-2^59, 2^59) live in the handle.
constexpr std::int64_t kSmallIntMin = -(std::int64_t{1} << 59);
constexpr std::int64_t kSmallIntMax = (std::int64_t{1} << 59) - 1;

// Slots a run-index lookup or insertion looks at before giving up (sharing is an optimisation:
// a run not found is stored again). At load <= 1/2 an honest lookup needs a few.
constexpr std::size_t kMaxRunProbes = 64;

// The runs of item values hashed for sharing: multiply-xorshift over the 64-bit words, in four
// independent lanes so that long frame lists hash at memory speed.
template <typename T>
std::uint32_t HashRun(std::span<const T> run) {
  static_assert(sizeof(T) % sizeof(std::uint64_t) == 0);
  const std::size_t n = run.size() * (sizeof(T) / sizeof(std::uint64_t));
  const auto* bytes = reinterpret_cast<const unsigned char*>(run.data());
  auto word = [&](std::size_t i) {
    std::uint64_t w;
    std::memcpy(&w, bytes + i * 8, 8);
    return w;
  };
  constexpr std::uint64_t kMul = 0xFF51AFD7ED558CCDull;
  std::uint64_t lane[4] = {0x9E3779B97F4A7C15ull ^ n, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
                           0x27D4EB2F165667C5ull};
  std::size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    lane[0] = (lane[0] ^ word(i)) * kMul;
    lane[1] = (lane[1] ^ word(i + 1)) * kMul;
    lane[2] = (lane[2] ^ word(i + 2)) * kMul;
    lane[3] = (lane[3] ^ word(i + 3)) * kMul;
  }
  for (; i < n; ++i) lane[i & 3] = (lane[i & 3] ^ word(i)) * kMul;
  std::uint64_t h = lane[0] ^ (lane[1] >> 17) ^ (lane[2] << 13) ^ (lane[3] >> 29);
  h = (h ^ (h >> 32)) * kMul;
  h ^= h >> 29;
  return static_cast<std::uint32_t>(h);
}

}  // namespace

std::string_view ValueKindName(ValueKind kind) {
  switch (kind) {
    case ValueKind::kNone:
      return "None";
    case ValueKind::kBool:
      return "bool";
    case ValueKind::kInt:
      return "int";
    case ValueKind::kBigInt:
      return "big int";
    case ValueKind::kFloat:
      return "float";
    case ValueKind::kString:
      return "str";
    case ValueKind::kBytes:
      return "bytes";
    case ValueKind::kList:
      return "list";
    case ValueKind::kTuple:
      return "tuple";
    case ValueKind::kDict:
      return "dict";
  }
  return "unknown";
}

// ---- Reading --------------------------------------------------------------------------------

std::optional<std::int64_t> Document::AsIntStored(Value v) const {
  switch (TagOf(v.bits_)) {  // small ints never get here (AsInt answers them inline)
    case kTagInt64:
      return static_cast<std::int64_t>(word_[IdOf(v.bits_)]);
    case kTagBigInt: {
      std::string_view b = *BigIntBytes(v);
      if (b.size() > 8) return std::nullopt;  // the shortest form of an int64 has <= 8 bytes
      std::uint64_t u = (static_cast<unsigned char>(b.back()) & 0x80) ? ~std::uint64_t{0} : 0;
      for (std::size_t i = b.size(); i-- > 0;) u = (u << 8) | static_cast<unsigned char>(b[i]);
      return static_cast<std::int64_t>(u);
    }
    default:
      return std::nullopt;
  }
}

std::optional<std::uint64_t> Document::AsUintStored(Value v) const {
  if (TagOf(v.bits_) == kTagBigInt) {
    std::string_view b = *BigIntBytes(v);
    if (static_cast<unsigned char>(b.back()) & 0x80) return std::nullopt;  // negative
    // Non-negative and shortest: 2^64 - 1 takes 8 bytes plus a 0x00 sign byte.
    if (b.size() > 9 || (b.size() == 9 && b[8] != 0)) return std::nullopt;
    std::uint64_t u = 0;
    for (std::size_t i = std::min<std::size_t>(b.size(), 8); i-- > 0;) {
      u = (u << 8) | static_cast<unsigned char>(b[i]);
    }
    return u;
  }
  std::optional<std::int64_t> i = AsInt(v);
  if (!i || *i < 0) return std::nullopt;
  return static_cast<std::uint64_t>(*i);
}

std::optional<double> Document::AsDouble(Value v) const {
  switch (TagOf(v.bits_)) {
    case kTagFloat:
      return std::bit_cast<double>(word_[IdOf(v.bits_)]);
    case kTagSmallInt:
    case kTagInt64:
      return static_cast<double>(*AsInt(v));
    case kTagBigInt: {
      std::string_view b = *BigIntBytes(v);
      // Little-endian two's complement: the top byte is signed, the others are not.
      double d = static_cast<double>(static_cast<signed char>(b.back()));
      for (std::size_t i = b.size() - 1; i-- > 0;) {
        d = d * 256.0 + static_cast<double>(static_cast<unsigned char>(b[i]));
      }
      return d;
    }
    default:
      return std::nullopt;
  }
}

std::optional<bool> Document::AsBool(Value v) const {
  if (TagOf(v.bits_) != kTagBool) return std::nullopt;
  return (v.bits_ >> kTagBits) != 0;
}

std::optional<std::string_view> Document::AsBytes(Value v) const {
  if (TagOf(v.bits_) != kTagBytes) return std::nullopt;
  ObjectId id = IdOf(v.bits_);
  return std::string_view(bytes_.data() + word_[id], size_[id]);
}

std::optional<std::string_view> Document::BigIntBytes(Value v) const {
  if (TagOf(v.bits_) != kTagBigInt) return std::nullopt;
  ObjectId id = IdOf(v.bits_);
  return std::string_view(bytes_.data() + word_[id], size_[id]);
}

std::optional<Value> Document::Find(Value dict, std::string_view key) const {
  std::span<const Entry> entries = Entries(dict);
  for (std::size_t i = entries.size(); i-- > 0;) {
    std::uint64_t k = entries[i].first.bits_;
    if (TagOf(k) != kTagString) continue;
    ObjectId id = IdOf(k);
    if (size_[id] == key.size() &&
        std::memcmp(bytes_.data() + word_[id], key.data(), key.size()) == 0) {
      return entries[i].second;
    }
  }
  return std::nullopt;
}

// ---- Building -------------------------------------------------------------------------------

Value Document::AddObject(unsigned tag, std::uint64_t word, std::uint32_t size) {
  auto id = static_cast<ObjectId>(word_.size());
  word_.push_back(word);
  size_.push_back(size);
  ++objects_;
  return Value((static_cast<std::uint64_t>(id) << kTagBits) | tag);
}

Value Document::AddString(std::string_view utf8) {
  std::uint64_t offset = bytes_.size();
  bytes_.Append(utf8.data(), utf8.size());
  return AddObject(kTagString, offset, static_cast<std::uint32_t>(utf8.size()));
}

Value Document::AddBytes(std::string_view bytes) {
  std::uint64_t offset = bytes_.size();
  bytes_.Append(bytes.data(), bytes.size());
  return AddObject(kTagBytes, offset, static_cast<std::uint32_t>(bytes.size()));
}

Value Document::AddLongBytes(std::string_view le_bytes) {
  // Drop sign-extension bytes: a top 0x00 above a byte with bit 7 clear, or 0xff above one
  // with bit 7 set, says nothing.
  std::size_t n = le_bytes.size();
  auto byte = [&](std::size_t i) { return static_cast<unsigned char>(le_bytes[i]); };
  while (n > 1 && ((byte(n - 1) == 0x00 && (byte(n - 2) & 0x80) == 0) ||
                   (byte(n - 1) == 0xff && (byte(n - 2) & 0x80) != 0))) {
    --n;
  }
  if (n <= 8) {
    if (n == 0) return AddInt(0);
    std::uint64_t u = (byte(n - 1) & 0x80) ? ~std::uint64_t{0} : 0;
    for (std::size_t i = n; i-- > 0;) u = (u << 8) | byte(i);
    return AddInt(static_cast<std::int64_t>(u));
  }
  std::uint64_t offset = bytes_.size();
  bytes_.Append(le_bytes.data(), n);
  return AddObject(kTagBigInt, offset, static_cast<std::uint32_t>(n));
}

Value Document::AddList() { return AddObject(kTagList, 0, 0); }
Value Document::AddDict() { return AddObject(kTagDict, 0, 0); }

Value Document::AddTuple(std::span<const Value> items) {
  Value tuple = AddObject(kTagTuple, 0, 0);
  Append(tuple, items);
  return tuple;
}

void Document::Append(Value list, Value item) { Append(list, std::span<const Value>(&item, 1)); }

void Document::Append(Value list, std::span<const Value> items) {
  if (items.empty()) return;
  const ObjectId id = IdOf(list.bits_);
  if (size_[id] == 0) {
    // First items: share an equal run if there is one, without writing anything.
    const std::uint32_t hash = HashRun(items);
    if (ShareRun(id, items, hash)) return;
    Value* to = Extend(items_, id, items.size());
    std::memcpy(static_cast<void*>(to), items.data(), items.size() * sizeof(Value));
    IndexRun(id, hash);
    return;
  }
  Value* to = Extend(items_, id, items.size());
  std::memcpy(static_cast<void*>(to), items.data(), items.size() * sizeof(Value));
}

void Document::SetItem(Value dict, Value key, Value value) {
  const Value pair[2] = {key, value};
  SetItems(dict, pair);
}

void Document::SetItems(Value dict, std::span<const Value> keys_and_values) {
  const std::size_t n = keys_and_values.size() / 2;
  if (n == 0) return;
  Entry* to = Extend(entries_, IdOf(dict.bits_), n);
  for (std::size_t i = 0; i < n; ++i) {
    to[i].first = keys_and_values[2 * i];
    to[i].second = keys_and_values[2 * i + 1];
  }
}

Value Document::AddBool(bool b) { return Value((std::uint64_t{b} << kTagBits) | kTagBool); }

Value Document::AddInt(std::int64_t i) {
  if (i >= kSmallIntMin && i <= kSmallIntMax) {
    return Value((static_cast<std::uint64_t>(i) << kTagBits) | kTagSmallInt);
  }
  return AddObject(kTagInt64, static_cast<std::uint64_t>(i), 0);
}

Value Document::AddFloat(double d) {
  return AddObject(kTagFloat, std::bit_cast<std::uint64_t>(d), 0);
}

template <typename T>
T* Document::Extend(internal::PodBuffer<T>& arena, ObjectId id, std::size_t add) {
  const std::uint64_t offset = word_[id];
  const std::uint32_t count = size_[id];
  const std::size_t end = arena.size();
  if (count == 0 || offset + count == end) {
    // The common case: the first (often only) batch, or more behind a run that ends the arena.
    if (count == 0) word_[id] = end;
    size_[id] = static_cast<std::uint32_t>(count + add);
    return arena.Extend(add);
  }
  if (auto it = reserved_.find(id); it != reserved_.end() && count + add <= it->second) {
    size_[id] = static_cast<std::uint32_t>(count + add);
    return arena.data() + offset + count;
  }
  // Move the run to the end with spare capacity equal to its new size (capped by the 32-bit
  // count). The old run stays where it is: other containers may share it.
  const std::uint64_t needed = std::uint64_t{count} + add;
  const std::uint64_t capacity = std::min<std::uint64_t>(needed * 2, UINT32_MAX);
  T* fresh = arena.Extend(capacity);
  std::memcpy(static_cast<void*>(fresh), arena.data() + offset, count * sizeof(T));
  std::memset(static_cast<void*>(fresh + needed), 0, (capacity - needed) * sizeof(T));
  word_[id] = end;
  size_[id] = static_cast<std::uint32_t>(needed);
  reserved_[id] = static_cast<std::uint32_t>(capacity);
  return fresh + count;
}

bool Document::ShareRun(ObjectId id, std::span<const Value> items, std::uint32_t hash) {
  if (run_index_.empty()) return false;
  const std::size_t mask = run_index_.size() - 1;
  std::size_t probes = 0;
  for (std::size_t i = hash & mask; run_index_[i] != 0; i = (i + 1) & mask) {
    // Hashes chosen to collide would make every lookup walk one long cluster and compare long
    // runs (quadratic; issue 24 item 2): past kMaxRunProbes the run is simply not shared.
    if (++probes > kMaxRunProbes) return false;
    const std::uint64_t slot = run_index_[i];
    if (static_cast<std::uint32_t>(slot >> 32) != hash) continue;
    const auto other = static_cast<ObjectId>((slot & 0xffffffffu) - 1);
    // The other container may have grown or moved since; its first items are still the ones
    // it was indexed with (runs only ever grow at the back).
    if (size_[other] < items.size()) continue;
    const Value* run = items_.data() + word_[other];
    if (std::memcmp(static_cast<const void*>(run), static_cast<const void*>(items.data()),
                    items.size() * sizeof(Value)) != 0) {
      continue;
    }
    word_[id] = word_[other];
    size_[id] = static_cast<std::uint32_t>(items.size());
    return true;
  }
  return false;
}

void Document::IndexRun(ObjectId id, std::uint32_t hash) {
  if ((run_index_used_ + 1) * 2 > run_index_.size()) {
    // Grow to keep the load below 1/2; the slots carry their hashes, so nothing is rehashed.
    std::vector<std::uint64_t> old = std::move(run_index_);
    run_index_.assign(std::max<std::size_t>(64, old.size() * 2), 0);
    const std::size_t mask = run_index_.size() - 1;
    for (std::uint64_t slot : old) {
      if (slot == 0) continue;
      std::size_t i = (slot >> 32) & mask;
      while (run_index_[i] != 0) i = (i + 1) & mask;
      run_index_[i] = slot;
    }
  }
  const std::size_t mask = run_index_.size() - 1;
  std::size_t i = hash & mask;
  for (std::size_t probes = 0; run_index_[i] != 0; i = (i + 1) & mask) {
    if (++probes > kMaxRunProbes) return;  // a crowded cluster: leave this run unindexed
  }
  run_index_[i] = (std::uint64_t{hash} << 32) | (std::uint64_t{id} + 1);
  ++run_index_used_;
}

void Document::WarmWhileBuilding(Prefaulter* prefaulter) {
  // Each arena warms up to 8 MB past its end: a few ms of work for the other core, and
  // FinishBuilding trims what was warmed but not filled.
  constexpr std::size_t kWindow = std::size_t{8} << 20;
  if (prefaulter == nullptr && prefaulter_ != nullptr) prefaulter_->Drain();
  prefaulter_ = prefaulter;
  word_.WarmAhead(prefaulter, kWindow);
  size_.WarmAhead(prefaulter, kWindow);
  items_.WarmAhead(prefaulter, kWindow);
  entries_.WarmAhead(prefaulter, kWindow);
  bytes_.WarmAhead(prefaulter, kWindow);
}

void Document::FinishBuilding() {
  if (prefaulter_ != nullptr) WarmWhileBuilding(nullptr);
  std::vector<std::uint64_t>().swap(run_index_);
  run_index_used_ = 0;
  std::unordered_map<ObjectId, std::uint32_t>().swap(reserved_);
  word_.ShrinkToFit();
  size_.ShrinkToFit();
  items_.ShrinkToFit();
  entries_.ShrinkToFit();
  bytes_.ShrinkToFit();
}

std::uint64_t Document::heap_bytes() const {
  std::uint64_t total = word_.capacity() * sizeof(std::uint64_t) +
                        size_.capacity() * sizeof(std::uint32_t) +
                        items_.capacity() * sizeof(Value) + entries_.capacity() * sizeof(Entry) +
                        run_index_.capacity() * sizeof(std::uint64_t);
  total += bytes_.capacity();
  // An unordered_map node holds the pair and a next pointer; the buckets are one pointer each.
  total += reserved_.size() * 32 + reserved_.bucket_count() * sizeof(void*);
  return total;
}

std::uint64_t Document::used_bytes() const {
  return word_.size() * sizeof(std::uint64_t) + size_.size() * sizeof(std::uint32_t) +
         items_.size() * sizeof(Value) + entries_.size() * sizeof(Entry) +
         run_index_.size() * sizeof(std::uint64_t) + bytes_.size() + reserved_.size() * 32 +
         reserved_.bucket_count() * sizeof(void*);
}

}  // namespace fragscope::sources
