// Document: a read-only tree of plain data (None, bools, ints of any length, floats, strings,
// bytes, lists, tuples, dicts) decoded from a pickle or a JSON file, for the snapshot decoder.
//
// Values are 8-byte handles. Small scalars live in the handle; strings, bytes, floats, big ints
// and containers live once in the Document and handles refer to them by index, so an object that a
// pickle memo references a million times is stored once and every reference has the same
// identity (ObjectId) — the snapshot decoder interns frames and stacks on it. Memory is
// proportional to distinct objects plus the references held in containers, never to the
// unfolded size of the tree.
//
// A Document is built by one reader (Add*/Append/SetItem) and then only read. Because readers
// follow the input, a hostile pickle can make a container hold itself: walkers that do not
// follow a fixed schema must bound their depth (see WriteDocumentJson in document_json.h).
//
// Dicts keep their entries in insertion order, duplicates included (a pickle may SETITEM the
// same key twice); Find returns the last, as Python's dict would hold.
//
// Thread safety: a built Document may be read from several threads; building is one thread.
#ifndef FRAGSCOPE_SOURCES_DOCUMENT_DOCUMENT_H_
#define FRAGSCOPE_SOURCES_DOCUMENT_DOCUMENT_H_

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/prefaulter.h"
#include "sources/document/pod_buffer.h"

namespace fragscope::sources {

enum class ValueKind : std::uint8_t {
  kNone,
  kBool,
  kInt,     // fits in int64
  kBigInt,  // any other integer (stored as little-endian two's complement bytes)
  kFloat,
  kString,  // UTF-8 as found in the file (not validated)
  kBytes,
  kList,
  kTuple,
  kDict,
};

/// "int", "list", ... for messages.
std::string_view ValueKindName(ValueKind kind);

namespace internal {
// The handle encoding (document.cc explains it). It sits here rather than in document.cc only
// so that the accessors a decoder calls for every field inline: out of line, each returned its
// std::optional through memory and stalled on it (analyze of the 494 MB snapshot ran 14%
// slower). Nothing outside Value and Document uses it.
enum DocumentTag : unsigned {
  kTagNone = 0,
  kTagBool = 1,
  kTagSmallInt = 2,
  kTagInt64 = 3,
  kTagBigInt = 4,
  kTagFloat = 5,
  kTagString = 6,
  kTagBytes = 7,
  kTagList = 8,
  kTagTuple = 9,
  kTagDict = 10,
};
inline constexpr unsigned kTagBits = 4;
inline constexpr std::uint64_t kTagMask = (1u << kTagBits) - 1;
inline constexpr ValueKind kKindOfTag[16] = {
    ValueKind::kNone,   ValueKind::kBool,  ValueKind::kInt,    ValueKind::kInt,
    ValueKind::kBigInt, ValueKind::kFloat, ValueKind::kString, ValueKind::kBytes,
    ValueKind::kList,   ValueKind::kTuple, ValueKind::kDict,   ValueKind::kNone,
    ValueKind::kNone,   ValueKind::kNone,  ValueKind::kNone,   ValueKind::kNone,
};
inline unsigned TagOf(std::uint64_t bits) { return static_cast<unsigned>(bits & kTagMask); }
inline std::uint32_t IdOf(std::uint64_t bits) {
  return static_cast<std::uint32_t>(bits >> kTagBits);
}
}  // namespace internal

/// A handle: 8 bytes, copied freely. Small scalars (None, bools, ints that fit the handle)
/// live in it; everything else is stored in the Document and the handle holds its index.
class Value {
 public:
  Value() = default;  // None
  ValueKind kind() const { return internal::kKindOfTag[bits_ & internal::kTagMask]; }
  bool is_none() const { return kind() == ValueKind::kNone; }
  bool is_sequence() const {
    const ValueKind k = kind();
    return k == ValueKind::kList || k == ValueKind::kTuple;
  }
  bool operator==(const Value&) const = default;
  /// A handle no Document makes, for the empty slots of a reader's own tables (the pickle
  /// memo). Its kind reads as kNone; it must not be given to a Document.
  static Value Unset() { return Value(std::uint64_t{internal::kTagMask}); }

 private:
  friend class Document;
  explicit Value(std::uint64_t bits) : bits_(bits) {}
  std::uint64_t bits_ = 0;  // internal::DocumentTag in the low bits; see document.cc
};
static_assert(sizeof(Value) == 8);

/// Identity of a stored object (string, bytes, big int, container): equal ids = same object.
using ObjectId = std::uint32_t;

class Document {
 public:
  using Entry = std::pair<Value, Value>;

  /// The most items, entries or payload bytes one object may hold; readers refuse more
  /// (kLimitExceeded) before calling the builders.
  static constexpr std::uint64_t kMaxObjectSize = UINT32_MAX;

  Document() = default;
  Document(Document&&) = default;
  Document& operator=(Document&&) = default;

  Value root() const { return root_; }
  void set_root(Value v) { root_ = v; }

  // ---- Reading. Each accessor answers for the kinds it names and "nothing" otherwise, so
  // a decoder can test and read in one step.

  /// kInt, or a kBigInt that fits in int64. Bools are not ints here.
  std::optional<std::int64_t> AsInt(Value v) const {
    if (internal::TagOf(v.bits_) == internal::kTagSmallInt) {
      return static_cast<std::int64_t>(v.bits_) >> internal::kTagBits;
    }
    return AsIntStored(v);
  }
  /// A non-negative kInt or kBigInt below 2^64 (addresses, sizes).
  std::optional<std::uint64_t> AsUint(Value v) const {
    if (internal::TagOf(v.bits_) == internal::kTagSmallInt) {
      const std::int64_t i = static_cast<std::int64_t>(v.bits_) >> internal::kTagBits;
      if (i < 0) return std::nullopt;
      return static_cast<std::uint64_t>(i);
    }
    return AsUintStored(v);
  }
  /// kFloat, or an int (exactly when |i| <= 2^53, else rounded).
  std::optional<double> AsDouble(Value v) const;
  std::optional<bool> AsBool(Value v) const;
  /// kString only. The view lives as long as the Document.
  std::optional<std::string_view> AsString(Value v) const {
    if (internal::TagOf(v.bits_) != internal::kTagString) return std::nullopt;
    const ObjectId id = internal::IdOf(v.bits_);
    return std::string_view(bytes_.data() + word_[id], size_[id]);
  }
  /// kBytes only.
  std::optional<std::string_view> AsBytes(Value v) const;
  /// kBigInt: its little-endian two's complement bytes (the shortest form).
  std::optional<std::string_view> BigIntBytes(Value v) const;

  /// Items of a list or tuple; empty for any other kind.
  std::span<const Value> Items(Value v) const {
    const unsigned tag = internal::TagOf(v.bits_);
    if (tag != internal::kTagList && tag != internal::kTagTuple) return {};
    const ObjectId id = internal::IdOf(v.bits_);
    return {items_.data() + word_[id], size_[id]};
  }
  /// Where the items of a list or tuple start in the Document's item storage, for a key that
  /// outlives the growth of that storage: two containers whose items are shared (equal runs,
  /// see FinishBuilding) have equal offsets and sizes. 0 for any other kind.
  std::uint64_t ItemsOffset(Value v) const {
    const unsigned tag = internal::TagOf(v.bits_);
    if (tag != internal::kTagList && tag != internal::kTagTuple) return 0;
    return word_[internal::IdOf(v.bits_)];
  }
  /// Entries of a dict in insertion order; empty for any other kind.
  std::span<const Entry> Entries(Value v) const {
    if (internal::TagOf(v.bits_) != internal::kTagDict) return {};
    const ObjectId id = internal::IdOf(v.bits_);
    return {entries_.data() + word_[id], size_[id]};
  }
  /// The value of the last entry whose key is the string `key`; nullopt if none or `dict` is
  /// not a dict. Linear in the dict's size.
  std::optional<Value> Find(Value dict, std::string_view key) const;

  /// The identity of a stored object; nullopt for values held in the handle.
  std::optional<ObjectId> Id(Value v) const {
    if (internal::TagOf(v.bits_) < internal::kTagInt64) return std::nullopt;
    return internal::IdOf(v.bits_);
  }

  // ---- Building (readers).

  Value AddString(std::string_view utf8);
  Value AddBytes(std::string_view bytes);
  /// An integer from little-endian two's complement bytes of any length (pickle's LONG1/LONG4);
  /// kInt when it fits in int64, else kBigInt. Empty = 0.
  Value AddLongBytes(std::string_view le_bytes);
  Value AddList();
  Value AddDict();
  Value AddTuple(std::span<const Value> items);
  /// REQUIRES: list.kind() == kList.
  void Append(Value list, Value item);
  void Append(Value list, std::span<const Value> items);
  /// REQUIRES: dict.kind() == kDict.
  void SetItem(Value dict, Value key, Value value);
  /// Adds keys_and_values[0] -> [1], [2] -> [3], ... in one batch (pickle's SETITEMS).
  /// REQUIRES: dict.kind() == kDict and an even number of values.
  void SetItems(Value dict, std::span<const Value> keys_and_values);

  Value AddNone() const { return Value(); }
  Value AddBool(bool b);
  Value AddInt(std::int64_t i);
  Value AddFloat(double d);

  /// Ends building: releases what only building needs (the index that lets equal runs of
  /// list/tuple items share storage) and trims spare capacity, so heap_bytes() drops to what
  /// reading needs. Building may go on afterwards; items added later are no longer shared.
  void FinishBuilding();
  /// Building a big document: `prefaulter` faults in the arenas' next pages on another thread
  /// while they fill (common/prefaulter.h); FinishBuilding waits for it and lets it go. nullptr
  /// stops it. It must outlive building.
  void WarmWhileBuilding(Prefaulter* prefaulter);

  /// Stored objects (strings, bytes, floats, big ints, containers).
  std::uint64_t object_count() const { return objects_; }
  /// Decoded (decompressed) input bytes the reader consumed to build this; budgets that follow
  /// the input's size use it (sources/budget.h).
  std::uint64_t input_bytes() const { return input_bytes_; }
  void set_input_bytes(std::uint64_t n) { input_bytes_ = n; }
  /// Approximate heap bytes held (for limits and benchmarks).
  std::uint64_t heap_bytes() const;
  /// Bytes of the arenas in use (their sizes, not the capacity reserved ahead, which stays
  /// untouched address space until it is filled): what the memory budget is charged, so a
  /// budget stops near its figure instead of at the next doubling (issue 30 item 4).
  std::uint64_t used_bytes() const;

 private:
  // AsInt and AsUint for what the handle does not hold (stored int64s, big ints).
  std::optional<std::int64_t> AsIntStored(Value v) const;
  std::optional<std::uint64_t> AsUintStored(Value v) const;
  // Storage is private to document.cc: flat arenas, so that a dict of six entries costs about
  // what its six key/value handles do (see document.cc).
  // Makes room for `add` more items of container `id` and returns where they go; the caller
  // writes them all before anything else touches the arena.
  template <typename T>
  T* Extend(internal::PodBuffer<T>& arena, ObjectId id, std::size_t add);
  // For a list or tuple receiving its first items: points it at an equal run if one exists.
  bool ShareRun(ObjectId id, std::span<const Value> items, std::uint32_t hash);
  void IndexRun(ObjectId id, std::uint32_t hash);
  Value AddObject(unsigned tag, std::uint64_t word, std::uint32_t size);

  Value root_;
  std::uint64_t objects_ = 0;
  std::uint64_t input_bytes_ = 0;
  // Per stored object, indexed by ObjectId: the arena offset (containers, strings, bytes, big
  // ints) or the bits (floats, int64s too big for the handle); and the item, entry or byte
  // count.
  internal::PodBuffer<std::uint64_t> word_;
  internal::PodBuffer<std::uint32_t> size_;
  internal::PodBuffer<Value> items_;    // list and tuple items, one run per container
  internal::PodBuffer<Entry> entries_;  // dict entries, one run per dict
  internal::PodBuffer<char> bytes_;     // string, bytes and big int payloads
  // Building only: open-addressing index of item runs by content hash, (hash << 32) | (id + 1)
  // per slot, 0 = empty; and the spare capacity reserved behind relocated containers.
  std::vector<std::uint64_t> run_index_;
  std::uint64_t run_index_used_ = 0;
  std::unordered_map<ObjectId, std::uint32_t> reserved_;
  Prefaulter* prefaulter_ = nullptr;  // building only
};

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_DOCUMENT_DOCUMENT_H_
