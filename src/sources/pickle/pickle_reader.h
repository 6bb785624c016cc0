// A safe pickle reader: decodes the plain-data subset of Python's pickle format (protocols 0
// to 5: dicts, lists, tuples, str, bytes, ints of any length, floats, bools, None, with the
// memo) into a Document. It never executes anything: an opcode that would import or call
// Python code (GLOBAL, STACK_GLOBAL, REDUCE, BUILD, INST, OBJ, NEWOBJ, NEWOBJ_EX, PERSID,
// BINPERSID, EXT1/2/4, NEXT_BUFFER, READONLY_BUFFER) is refused with an error naming the opcode
// and its byte offset. See ../shared/spec/memory-snapshot-format.md §6 and docs/formats.md.
//
// The reader streams: it holds one read buffer, the stack, the memo (handles, 8 bytes a slot)
// and the Document, never the whole file; a PickleListSink can keep the bulk out of the
// Document too. It is iterative (no recursion on nesting) and enforces PickleLimits, failing
// with kLimitExceeded and the offset where the limit was hit.
// Memo references share the stored object (Document::Id is equal), so memory follows distinct
// objects, not references.
//
// Errors (Status messages) start with "byte N: " where N is the offset of the opcode in the
// decoded (decompressed) stream; they do not name the file (callers add it).
//
// Thread safety: none; one reader per thread.
#ifndef FRAGSCOPE_SOURCES_PICKLE_PICKLE_READER_H_
#define FRAGSCOPE_SOURCES_PICKLE_PICKLE_READER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string_view>

#include "fragscope/status.h"
#include "sources/document/document.h"
#include "sources/trace/input_stream.h"

namespace fragscope::sources {

struct PickleLimits {
  std::uint64_t max_input_bytes = std::uint64_t{64} << 30;  // decoded bytes
  std::uint32_t max_depth = 10'000;                         // nested MARKs + open containers
  std::uint64_t max_objects = 200'000'000;                  // Document::object_count()
  std::uint64_t max_memo = 100'000'000;                     // memo slots
  std::uint64_t max_string_bytes = std::uint64_t{1} << 30;  // one str/bytes/long payload
  std::uint64_t max_stack = 100'000'000;                    // values on the stack
  /// Bytes of decoded structures (the Document, memo, stack and payloads being collected),
  /// checked as they grow; 0 = MemoryBudgetFor(the input's size) (sources/budget.h).
  std::uint64_t max_memory_bytes = 0;
};

/// Called now and then (about every 4 MiB) with the raw bytes consumed so far and the raw
/// size if known (0 otherwise); for progress lines.
using ProgressFn = std::function<void(std::uint64_t consumed, std::uint64_t total)>;

/// A consumer of list items as the machine produces them (issue 34): lets a caller that knows
/// the schema (the snapshot decoder) turn the bulk of a file into its own compact records while
/// the pickle is read, so that the Document never holds it.
///
/// When APPEND or APPENDS is about to add items to a list, TakeItems sees them first and may
/// take the list. A taken list keeps no items in the Document (it reads as empty); every later
/// item appended to it goes to TakeItems, and the key/value pairs that SETITEM(S) puts into a
/// dict standing directly in one of its MARK frames (the next items of that list, being built)
/// go to DictItems instead of the dict, which stays empty in the Document. Items reach the sink
/// in the order of the file; a dict's pairs reach DictItems before the dict reaches TakeItems
/// (when it is appended after being filled, as every pickler writes it).
///
/// Thread safety: called from the reading thread only.
class PickleListSink {
 public:
  virtual ~PickleListSink() = default;
  /// `items` are about to be appended to `list` (`taken`: a list this sink took before).
  /// Returns whether the sink takes them (and the list, from now on); a taken list's items
  /// must be taken. A non-ok status stops the reading with it ("byte N: " is prefixed).
  virtual Status TakeItems(const Document& doc, Value list, bool taken,
                           std::span<const Value> items, std::uint64_t offset, bool* take) = 0;
  /// Pairs (key, value, key, value, ...) that SETITEM(S) puts into `dict`, a dict standing in
  /// a taken list's MARK frame.
  virtual void DictItems(const Document& doc, Value dict,
                         std::span<const Value> keys_and_values) = 0;
  /// Whether the dicts standing in MARK frames of taken `list` give their pairs to DictItems
  /// (the default) or keep them in the Document, as a list whose items the sink reads whole
  /// (a stack's frame dicts) needs.
  virtual bool RoutesDictItems(const Document& /*doc*/, Value /*list*/) { return true; }
  /// Heap bytes the sink holds; counted against PickleLimits::max_memory_bytes with the
  /// machine's own.
  virtual std::uint64_t used_bytes() const = 0;
};

/// Decodes one pickle from `input` (plain, gzip or zstd, as InputStream detects). Bytes after
/// STOP are ignored. A stream that ends before STOP is kCorruption ("truncated"). `sink`, when
/// given, may take lists as they are read (PickleListSink).
Result<Document> ReadPickle(InputStream& input, const PickleLimits& limits = {},
                            const ProgressFn& progress = {}, PickleListSink* sink = nullptr);
/// Convenience over a byte string in memory.
Result<Document> ReadPickleBytes(std::string_view bytes, const PickleLimits& limits = {},
                                 PickleListSink* sink = nullptr);

/// The name of a pickle opcode byte ("BINGET", "GLOBAL", ...), or "unknown".
std::string_view PickleOpcodeName(std::uint8_t op);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_PICKLE_PICKLE_READER_H_
