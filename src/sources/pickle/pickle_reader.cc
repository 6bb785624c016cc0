// The safe pickle reader: a bounded, non-executing subset of Python's pickle machine
// (Lib/pickle.py's _Unpickler is the reference for every opcode's meaning and its errors).
//
// The machine has a value stack, a stack of MARK positions and a memo; opcodes push plain
// values, pop runs above a MARK into containers, and store/fetch memo entries. Containers are
// built in the Document as they are filled, so the stack holds only handles and memo
// references keep the identity of what they refer to.
//
// Input is a window [p_, end_) over either the caller's bytes (no copy) or a buffer refilled
// from an InputStream. Payloads longer than the buffer are collected as they arrive, so a
// length field never sizes an allocation by itself.
#include "sources/pickle/pickle_reader.h"

#include <algorithm>
#include <array>
#include <bit>
#include <charconv>
#include <cstring>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/utf8.h"
#include "sources/budget.h"
#include "sources/document/pod_buffer.h"
#include "sources/document/read_from.h"

namespace fragscope::sources {

namespace {

// ---- Opcodes --------------------------------------------------------------------------------

enum Op : std::uint8_t {
  kMark = '(',
  kStop = '.',
  kPop = '0',
  kPopMark = '1',
  kDup = '2',
  kFloat = 'F',
  kInt = 'I',
  kBinInt = 'J',
  kBinInt1 = 'K',
  kLong = 'L',
  kBinInt2 = 'M',
  kNone = 'N',
  kPersId = 'P',
  kBinPersId = 'Q',
  kReduce = 'R',
  kString = 'S',
  kBinString = 'T',
  kShortBinString = 'U',
  kUnicode = 'V',
  kBinUnicode = 'X',
  kAppend = 'a',
  kBuild = 'b',
  kGlobal = 'c',
  kDict = 'd',
  kEmptyDict = '}',
  kAppends = 'e',
  kGet = 'g',
  kBinGet = 'h',
  kInst = 'i',
  kLongBinGet = 'j',
  kList = 'l',
  kEmptyList = ']',
  kObj = 'o',
  kPut = 'p',
  kBinPut = 'q',
  kLongBinPut = 'r',
  kSetItem = 's',
  kTuple = 't',
  kEmptyTuple = ')',
  kSetItems = 'u',
  kBinFloat = 'G',
  kProto = 0x80,
  kNewObj = 0x81,
  kExt1 = 0x82,
  kExt2 = 0x83,
  kExt4 = 0x84,
  kTuple1 = 0x85,
  kTuple2 = 0x86,
  kTuple3 = 0x87,
  kNewTrue = 0x88,
  kNewFalse = 0x89,
  kLong1 = 0x8a,
  kLong4 = 0x8b,
  kBinBytes = 'B',
  kShortBinBytes = 'C',
  kShortBinUnicode = 0x8c,
  kBinUnicode8 = 0x8d,
  kBinBytes8 = 0x8e,
  kEmptySet = 0x8f,
  kAddItems = 0x90,
  kFrozenSet = 0x91,
  kNewObjEx = 0x92,
  kStackGlobal = 0x93,
  kMemoize = 0x94,
  kFrame = 0x95,
  kByteArray8 = 0x96,
  kNextBuffer = 0x97,
  kReadOnlyBuffer = 0x98,
};

constexpr std::pair<std::uint8_t, std::string_view> kOpNames[] = {
    {kMark, "MARK"},
    {kStop, "STOP"},
    {kPop, "POP"},
    {kPopMark, "POP_MARK"},
    {kDup, "DUP"},
    {kFloat, "FLOAT"},
    {kInt, "INT"},
    {kBinInt, "BININT"},
    {kBinInt1, "BININT1"},
    {kLong, "LONG"},
    {kBinInt2, "BININT2"},
    {kNone, "NONE"},
    {kPersId, "PERSID"},
    {kBinPersId, "BINPERSID"},
    {kReduce, "REDUCE"},
    {kString, "STRING"},
    {kBinString, "BINSTRING"},
    {kShortBinString, "SHORT_BINSTRING"},
    {kUnicode, "UNICODE"},
    {kBinUnicode, "BINUNICODE"},
    {kAppend, "APPEND"},
    {kBuild, "BUILD"},
    {kGlobal, "GLOBAL"},
    {kDict, "DICT"},
    {kEmptyDict, "EMPTY_DICT"},
    {kAppends, "APPENDS"},
    {kGet, "GET"},
    {kBinGet, "BINGET"},
    {kInst, "INST"},
    {kLongBinGet, "LONG_BINGET"},
    {kList, "LIST"},
    {kEmptyList, "EMPTY_LIST"},
    {kObj, "OBJ"},
    {kPut, "PUT"},
    {kBinPut, "BINPUT"},
    {kLongBinPut, "LONG_BINPUT"},
    {kSetItem, "SETITEM"},
    {kTuple, "TUPLE"},
    {kEmptyTuple, "EMPTY_TUPLE"},
    {kSetItems, "SETITEMS"},
    {kBinFloat, "BINFLOAT"},
    {kProto, "PROTO"},
    {kNewObj, "NEWOBJ"},
    {kExt1, "EXT1"},
    {kExt2, "EXT2"},
    {kExt4, "EXT4"},
    {kTuple1, "TUPLE1"},
    {kTuple2, "TUPLE2"},
    {kTuple3, "TUPLE3"},
    {kNewTrue, "NEWTRUE"},
    {kNewFalse, "NEWFALSE"},
    {kLong1, "LONG1"},
    {kLong4, "LONG4"},
    {kBinBytes, "BINBYTES"},
    {kShortBinBytes, "SHORT_BINBYTES"},
    {kShortBinUnicode, "SHORT_BINUNICODE"},
    {kBinUnicode8, "BINUNICODE8"},
    {kBinBytes8, "BINBYTES8"},
    {kEmptySet, "EMPTY_SET"},
    {kAddItems, "ADDITEMS"},
    {kFrozenSet, "FROZENSET"},
    {kNewObjEx, "NEWOBJ_EX"},
    {kStackGlobal, "STACK_GLOBAL"},
    {kMemoize, "MEMOIZE"},
    {kFrame, "FRAME"},
    {kByteArray8, "BYTEARRAY8"},
    {kNextBuffer, "NEXT_BUFFER"},
    {kReadOnlyBuffer, "READONLY_BUFFER"},
};

// Why an opcode is refused; null for the opcodes we run.
const char* RefusalReason(std::uint8_t op) {
  switch (op) {
    case kGlobal:
    case kStackGlobal:
      return "it would import Python code";
    case kInst:
    case kObj:
    case kNewObj:
    case kNewObjEx:
    case kReduce:
      return "it would call Python code";
    case kBuild:
      return "it would call Python code to set an object's state";
    case kExt1:
    case kExt2:
    case kExt4:
      return "it would import Python code named in the copyreg extension registry";
    case kPersId:
    case kBinPersId:
      return "it would ask the application for a persistent object";
    case kNextBuffer:
    case kReadOnlyBuffer:
      return "it needs out-of-band buffers";
    default:
      return nullptr;
  }
}

std::string Hex(std::uint8_t op) {
  static constexpr char kDigits[] = "0123456789abcdef";
  return std::string("0x") + kDigits[op >> 4] + kDigits[op & 15];
}

std::string Limit(std::uint64_t limit, const char* name) {
  return "the limit of " + std::to_string(limit) + " (" + name + ")";
}

inline std::uint16_t Le16(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return static_cast<std::uint16_t>(b[0] | (b[1] << 8));
}
inline std::uint32_t Le32(const char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, 4);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap32(v);
  return v;
}
inline std::uint64_t Le64(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::big) v = __builtin_bswap64(v);
  return v;
}
inline double Be64Double(const char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, 8);
  if constexpr (std::endian::native == std::endian::little) v = __builtin_bswap64(v);
  return std::bit_cast<double>(v);
}

// ---- Text arguments (protocols 0 and 1) -----------------------------------------------------

bool IsPySpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string_view StripSpace(std::string_view s) {
  while (!s.empty() && IsPySpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsPySpace(s.back())) s.remove_suffix(1);
  return s;
}

int DigitValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'z') return c - 'a' + 10;
  if (c >= 'A' && c <= 'Z') return c - 'A' + 10;
  return 99;
}

// A Python integer literal as int(text, base) reads it, base 0 (prefixes 0x/0o/0b, no leading
// zeros in decimal) or 10. Sets *le_bytes to little-endian two's complement bytes. Returns an
// error text, or "" on success.
std::string ParsePyInt(std::string_view text, int base, std::string* le_bytes) {
  std::string_view s = StripSpace(text);
  bool negative = false;
  if (!s.empty() && (s[0] == '+' || s[0] == '-')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  bool prefixed = false;
  if (base == 0) {
    base = 10;
    if (s.size() >= 2 && s[0] == '0') {
      char p = static_cast<char>(s[1] | 0x20);
      if (p == 'x' || p == 'o' || p == 'b') {
        base = p == 'x' ? 16 : p == 'o' ? 8 : 2;
        s.remove_prefix(2);
        prefixed = true;
      }
    }
    if (base == 10 && s.size() > 1 && s[0] == '0' && s.find_first_not_of("0_") != s.npos) {
      return "leading zeros in a decimal integer";
    }
  }
  // Digits, with single underscores between them (and one right after a base prefix).
  std::string digits;
  digits.reserve(s.size());
  bool last_underscore = !prefixed;  // an underscore may not come first, except after 0x
  for (char c : s) {
    if (c == '_') {
      if (last_underscore) return "misplaced '_'";
      last_underscore = true;
      continue;
    }
    if (DigitValue(c) >= base) return "not an integer";
    digits.push_back(c);
    last_underscore = false;
  }
  if (digits.empty() || (!s.empty() && s.back() == '_')) return "not an integer";
  if (base == 10 && digits.size() > internal::kMaxDecimalDigits) return "";  // caller checks
  *le_bytes = internal::IntegerDigitsToLongBytes(digits, base, negative);
  return "";
}

// codecs.escape_decode, which the STRING opcode applies to its quoted argument.
bool EscapeDecode(std::string_view s, std::string* out) {
  out->clear();
  for (std::size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c != '\\') {
      out->push_back(c);
      continue;
    }
    if (++i == s.size()) return false;  // trailing backslash
    c = s[i];
    switch (c) {
      case '\n':
        break;  // line continuation
      case '\\':
      case '\'':
      case '"':
        out->push_back(c);
        break;
      case 'a':
        out->push_back('\a');
        break;
      case 'b':
        out->push_back('\b');
        break;
      case 'f':
        out->push_back('\f');
        break;
      case 'n':
        out->push_back('\n');
        break;
      case 'r':
        out->push_back('\r');
        break;
      case 't':
        out->push_back('\t');
        break;
      case 'v':
        out->push_back('\v');
        break;
      case 'x': {
        if (i + 2 >= s.size()) return false;
        int hi = DigitValue(s[i + 1]);
        int lo = DigitValue(s[i + 2]);
        if (hi >= 16 || lo >= 16) return false;
        out->push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        break;
      }
      default:
        if (c >= '0' && c <= '7') {
          int v = c - '0';
          for (int k = 0; k < 2 && i + 1 < s.size() && s[i + 1] >= '0' && s[i + 1] <= '7'; ++k) {
            v = v * 8 + (s[++i] - '0');
          }
          out->push_back(static_cast<char>(v & 0xff));
        } else {
          out->push_back('\\');  // unknown escapes stay as they are
          out->push_back(c);
        }
    }
  }
  return true;
}

// The raw-unicode-escape codec, which the UNICODE opcode uses: bytes are Latin-1 characters,
// except \uXXXX and \UXXXXXXXX. Output is UTF-8. Returns an error text or "".
std::string RawUnicodeEscapeDecode(std::string_view s, std::string* out) {
  out->clear();
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c != '\\' || i + 1 == s.size()) {
      AppendUtf8(c, out);
      continue;
    }
    auto next = static_cast<unsigned char>(s[++i]);
    if (next != 'u' && next != 'U') {
      out->push_back('\\');
      AppendUtf8(next, out);
      continue;
    }
    std::size_t count = next == 'u' ? 4 : 8;
    if (s.size() - i - 1 < count)
      return next == 'u' ? "truncated \\uXXXX escape" : "truncated \\UXXXXXXXX escape";
    std::uint32_t cp = 0;
    for (std::size_t k = 0; k < count; ++k) {
      int d = DigitValue(s[++i]);
      if (d >= 16) return next == 'u' ? "truncated \\uXXXX escape" : "truncated \\UXXXXXXXX escape";
      cp = cp * 16 + static_cast<std::uint32_t>(d);
    }
    if (cp > 0x10FFFF) return "\\Uxxxxxxxx out of range";
    AppendUtf8(cp, out);
  }
  return "";
}

// ---- The machine ----------------------------------------------------------------------------

// The value stack. std::vector's push_back is not always inlined into the big dispatch loop,
// and a call per pushed value costs more than the rest of BINGET; this one's fast paths are.
class ValueStack {
 public:
  std::size_t size() const { return size_; }
  std::size_t capacity() const { return capacity_; }
  const Value* data() const { return data_.get(); }
  Value back() const { return data_[size_ - 1]; }
  Value operator[](std::size_t i) const { return data_[i]; }
  // False when the stack already holds `limit` values.
  [[gnu::always_inline]] bool push_back(Value v, std::uint64_t limit) {
    if (size_ == capacity_) [[unlikely]] {
      if (!Grow(limit)) return false;
    }
    data_[size_++] = v;
    return true;
  }
  void pop_back() { --size_; }
  // REQUIRES: n <= size() (the machine only ever cuts the stack back).
  void resize(std::size_t n) { size_ = n; }
  // For a loop that pushes many values without growing: the next free slot and the end of
  // the room, then Commit(next) with the slot after its last push (issue 34: the BINGET run
  // keeps them in registers instead of storing the size back for every value).
  Value* next_free() { return data_.get() + size_; }
  Value* room_end() { return data_.get() + capacity_; }
  // REQUIRES: next_free() <= next <= room_end(), the slots before `next` written.
  void Commit(Value* next) { size_ = static_cast<std::size_t>(next - data_.get()); }

 private:
  [[gnu::noinline]] bool Grow(std::uint64_t limit) {
    if (size_ >= limit) return false;
    std::size_t bigger = static_cast<std::size_t>(
        std::min<std::uint64_t>(capacity_ == 0 ? 256 : capacity_ * 2, limit));
    std::unique_ptr<Value[]> grown(new Value[bigger]);
    std::copy_n(data_.get(), size_, grown.get());
    data_ = std::move(grown);
    capacity_ = bigger;
    return true;
  }

  std::unique_ptr<Value[]> data_;
  std::size_t size_ = 0;
  std::size_t capacity_ = 0;
};

// In a helper: return false when `expr` (a bool helper) failed.
#define FRAGSCOPE_PICKLE_TRY(expr) \
  do {                             \
    if (!(expr)) return false;     \
  } while (false)
// In Run(): return the stored error when `expr` failed.
#define FRAGSCOPE_PICKLE_RUN(expr) \
  do {                             \
    if (!(expr)) [[unlikely]]      \
      return std::move(status_);   \
  } while (false)

class Unpickler {
 public:
  Unpickler(std::string_view head, InputStream* rest, const PickleLimits& limits,
            const ProgressFn& progress, PickleListSink* sink)
      : rest_(rest), limits_(limits), progress_(progress), sink_(sink) {
    const std::uint64_t input_size = BudgetInputBytes(head, rest_);
    memory_user_set_ = limits_.max_memory_bytes != 0 || ProcessBudget().max_memory_bytes != 0;
    memory_budget_ =
        limits_.max_memory_bytes != 0 ? limits_.max_memory_bytes : MemoryBudgetFor(input_size);
    const std::uint64_t decoded_budget = DecodedBudgetFor(input_size);
    decoded_budget_binds_ = decoded_budget < limits_.max_input_bytes;
    max_input_ = std::min(decoded_budget, limits_.max_input_bytes);
    if (rest_ == nullptr) {
      // Zero copy: the window is the caller's bytes, capped at max_input_bytes.
      std::size_t n = head.size();
      if (n > max_input_) {
        n = static_cast<std::size_t>(max_input_);
        capped_ = true;
      }
      begin_ = p_ = head.data();
      end_ = begin_ + n;
      return;
    }
    // A small input of known size gets a small buffer (64 KiB at least: compressed input
    // decodes to more than its raw size). Anything can be read with any buffer size.
    constexpr std::size_t kMinBufferBytes = std::size_t{64} << 10;
    const std::uint64_t raw = rest_->raw_bytes_total();
    capacity_ = raw > 0 && raw < kStreamBufferBytes
                    ? std::max(kMinBufferBytes, static_cast<std::size_t>(raw))
                    : kStreamBufferBytes;
    capacity_ = std::max(capacity_, head.size());
    buffer_.reset(new char[capacity_]);
    if (!head.empty()) std::memcpy(buffer_.get(), head.data(), head.size());
    begin_ = p_ = buffer_.get();
    end_ = begin_ + head.size();
    if (head.size() > max_input_) {
      end_ = begin_ + max_input_;
      capped_ = true;
    }
  }

  Result<Document> Run();

 private:
  // -- Input.
  std::uint64_t Offset(const char* at) const {
    return base_ + static_cast<std::uint64_t>(at - begin_);
  }
  // Makes n bytes available at p_ (n <= capacity_ for streams). False at the end of the input
  // or on a read error (stream_status_).
  bool Fill(std::size_t n);
  // The next `n` payload bytes: a view into the window, or (longer than the buffer) collected
  // in scratch_ as they arrive. False as Fill.
  bool ReadPayload(std::uint64_t n, std::string_view* out);
  // The bytes up to the next "\n" (excluded, and consumed). False as Fill.
  bool ReadLine(std::string_view* out);

  // -- Errors, all "byte N: ...".
  Status Error(std::string what) const {
    return Status::Corruption("byte " + std::to_string(OpOffset()) + ": " + std::move(what));
  }
  Status OpError(const std::string& what) const { return Error("opcode " + Name() + ": " + what); }
  Status LimitError(const std::string& what) const {
    return Status::LimitExceeded("byte " + std::to_string(OpOffset()) + ": " + what);
  }
  // Fill/ReadPayload/ReadLine failed.
  Status InputEnded(const char* what) const;
  std::string Name() const { return std::string(PickleOpcodeName(op_)); }
  // Hot-path helpers return false after storing their error here, so that no Status is
  // built or moved for an opcode that succeeds.
  bool Fail(Status status) {
    status_ = std::move(status);
    return false;
  }
  Status status_;

  // -- Stack.
  std::size_t FrameBegin() const { return marks_.empty() ? 0 : marks_.back(); }
  [[gnu::always_inline]] bool Push(Value v) {
    if (!stack_.push_back(v, limits_.max_stack)) [[unlikely]]
      return StackFull();
    return true;
  }
  [[gnu::noinline]] bool StackFull() {
    return Fail(LimitError("the stack holds more than " + Limit(limits_.max_stack, "max_stack") +
                           " values"));
  }
  // The top `n` values above the last MARK; error if there are fewer.
  bool NeedOnFrame(std::size_t n) {
    if (stack_.size() - FrameBegin() >= n) return true;
    return Fail(
        OpError(marks_.empty() ? "stack underflow" : "stack underflow (above the last MARK)"));
  }
  // Pops the last MARK; *begin = where its run starts.
  bool PopMark(std::size_t* begin) {
    if (marks_.empty()) return Fail(OpError("no MARK to pop"));
    *begin = marks_.back();
    marks_.pop_back();
    mark_taken_.pop_back();
    return true;
  }
  bool CheckObjects() {
    if (doc_.object_count() <= limits_.max_objects) [[likely]] {
      // Memory is also checked at every refill of the read buffer; this covers input that is
      // all in memory. Every 4096 objects keeps the cost off the hot path.
      if ((++memory_checks_ & 0xfff) != 0 || MemoryUsed() <= memory_budget_) [[likely]]
        return true;
      return Fail(LimitError(MemoryMessage()));
    }
    return Fail(LimitError("more than " + Limit(limits_.max_objects, "max_objects") + " objects"));
  }
  // Bytes held by what the machine has decoded so far (issue 24 item 1).
  std::uint64_t MemoryUsed() const {
    return doc_.used_bytes() + memo_.size() * sizeof(MemoSlot) + sparse_memo_.size() * 48 +
           stack_.capacity() * sizeof(Value) + marks_.capacity() * sizeof(std::size_t) +
           scratch_.capacity() + scratch2_.capacity() + taken_.capacity() / 8 +
           (sink_ != nullptr ? sink_->used_bytes() : 0);
  }
  [[gnu::noinline]] std::string MemoryMessage() const {
    return (BudgetMessage("the decoded data outgrew its memory budget", "memory", memory_budget_,
                          MemoryUsed(), memory_user_set_, "--max-memory", /*bytes=*/true));
  }
  std::uint64_t memory_budget_ = 0;
  std::uint64_t max_input_ = 0;        // decoded bytes read at most
  bool decoded_budget_binds_ = false;  // max_input_ is DecodedBudgetFor's, not the fixed cap
  std::uint32_t memory_checks_ = 0;    // CheckObjects calls; memory is measured every 4096th
  bool memory_user_set_ = false;
  bool CheckSize(std::uint64_t n, const char* what);
  bool ContainerRoom(Value container, std::uint64_t add);
  // The container that APPEND(S)/SETITEM(S) fill: stack_[top - 1], which must lie in the
  // current frame (above the last MARK).
  bool Target(ValueKind kind, std::size_t top, Value* out);

  // -- The sink (PickleListSink).
  bool Taken(Value list) const {
    const std::optional<ObjectId> id = doc_.Id(list);
    return id && *id < taken_.size() && taken_[*id];
  }
  // Offers `items`, about to be appended to `list`, to the sink; *took when it took them.
  bool Offer(Value list, std::span<const Value> items, bool* took);
  // Whether a dict at stack position `at` stands directly in a taken list's MARK frame, so
  // that SETITEM(S) gives its pairs to the sink.
  bool InTakenFrame(std::size_t at) const {
    return !marks_.empty() && mark_taken_.back() && marks_.back() <= at;
  }
  void PushMark() {
    marks_.push_back(stack_.size());
    mark_taken_.push_back(sink_ != nullptr && stack_.size() > 0 &&
                          stack_.back().kind() == ValueKind::kList && Taken(stack_.back()) &&
                          sink_->RoutesDictItems(doc_, stack_.back()));
  }

  // -- Memo.
  bool MemoPut(std::uint64_t index);
  bool MemoGet(std::uint64_t index);
  [[gnu::noinline]] bool MemoGetSlow(std::uint64_t index);

  // -- Opcodes with more work.
  bool TextInt(bool is_long);
  bool TextFloat();
  bool TextString(bool unicode);
  bool TextMemo(bool put);
  bool Payload(std::uint64_t n, bool bytes);
  bool Long(std::uint64_t n);

  InputStream* rest_;
  const PickleLimits& limits_;
  const ProgressFn& progress_;
  PickleListSink* sink_;
  std::vector<bool> taken_;       // by ObjectId: lists the sink took
  std::vector<bool> mark_taken_;  // parallel to marks_: the frame's owner is a taken list
  std::unique_ptr<char[]> buffer_;
  std::size_t capacity_ = 0;
  const char* begin_ = nullptr;  // the window's start, at stream offset base_
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  std::uint64_t base_ = 0;
  bool eof_ = false;
  bool capped_ = false;  // the window stops at max_input_bytes
  bool line_too_long_ = false;
  Status stream_status_;
  std::uint64_t next_progress_ = kProgressBytes;
  static constexpr std::uint64_t kProgressBytes = std::uint64_t{4} << 20;

  // Where the current opcode starts: op_start_ in the window, or (once Fill() has moved the
  // window past it) op_offset_. Kept as a pointer so the dispatch loop does no arithmetic.
  const char* op_start_ = nullptr;
  std::uint64_t op_offset_ = 0;
  std::uint64_t OpOffset() const { return op_start_ != nullptr ? Offset(op_start_) : op_offset_; }
  std::uint8_t op_ = 0;
  ValueStack stack_;
  std::vector<std::size_t> marks_;
  // Memo: dense slots (8 bytes: the handle, Value::Unset() where nothing was stored; a snapshot
  // memoises about two objects per trace entry), far keys in sparse_memo_.
  struct MemoSlot {
    Value value = Value::Unset();
    bool set() const { return value != Value::Unset(); }
  };
  // Declared before the buffers it warms; its requests on freed memory are harmless anyway.
  Prefaulter prefaulter_;
  bool warming_ = false;
  static constexpr std::uint64_t kWarmAfterBytes = std::uint64_t{32} << 20;
  internal::PodBuffer<MemoSlot> memo_;
  std::unordered_map<std::uint64_t, Value> sparse_memo_;
  std::uint64_t memo_count_ = 0;  // keys that hold a value (Python's len(memo))
  std::string scratch_;
  std::string scratch2_;
  Document doc_;
};

bool Unpickler::Fill(std::size_t n) {
  while (static_cast<std::size_t>(end_ - p_) < n) {
    if (rest_ == nullptr || eof_ || capped_ || !stream_status_.ok()) return false;
    // Move what is left to the front, then read behind it.
    std::size_t left = static_cast<std::size_t>(end_ - p_);
    if (op_start_ != nullptr) {
      op_offset_ = Offset(op_start_);
      op_start_ = nullptr;
    }
    base_ += static_cast<std::uint64_t>(p_ - begin_);
    std::memmove(buffer_.get(), p_, left);
    begin_ = p_ = buffer_.get();
    end_ = begin_ + left;
    std::size_t room = capacity_ - left;
    std::uint64_t total = base_ + left;
    if (total + room > max_input_) {
      room = static_cast<std::size_t>(max_input_ - std::min(total, max_input_));
      if (room == 0) {
        capped_ = true;
        return false;
      }
    }
    Result<std::size_t> got = rest_->Read(buffer_.get() + left, room);
    if (!got.ok()) {
      stream_status_ = got.status();
      return false;
    }
    if (*got == 0) eof_ = true;
    end_ += *got;
    if (MemoryUsed() > memory_budget_) [[unlikely]] {
      // Reported by InputEnded() as the stream's error: the memory budget stops decoding here,
      // while a payload is still being collected if need be.
      stream_status_ = Status::LimitExceeded(MemoryMessage());
      return false;
    }
    if (!warming_ && base_ >= kWarmAfterBytes) {
      // A big input: fault the arenas' next pages in on the other core from now on.
      warming_ = true;
      doc_.WarmWhileBuilding(&prefaulter_);
      memo_.WarmAhead(&prefaulter_, std::size_t{4} << 20);
    }
    if (progress_ && rest_->raw_bytes_consumed() >= next_progress_) {
      progress_(rest_->raw_bytes_consumed(), rest_->raw_bytes_total());
      next_progress_ = rest_->raw_bytes_consumed() + kProgressBytes;
    }
  }
  return true;
}

bool Unpickler::ReadPayload(std::uint64_t n, std::string_view* out) {
  if (static_cast<std::uint64_t>(end_ - p_) >= n ||
      (rest_ != nullptr && n <= capacity_ && Fill(static_cast<std::size_t>(n)))) {
    *out = std::string_view(p_, static_cast<std::size_t>(n));
    p_ += n;
    return true;
  }
  if (rest_ == nullptr || n <= capacity_) return false;
  // Longer than the buffer: collect it as it arrives (growing with the data, not the length).
  scratch_.clear();
  while (scratch_.size() < n) {
    if (p_ == end_ && !Fill(1)) return false;
    std::size_t take = static_cast<std::size_t>(
        std::min<std::uint64_t>(static_cast<std::uint64_t>(end_ - p_), n - scratch_.size()));
    scratch_.append(p_, take);
    p_ += take;
  }
  *out = scratch_;
  return true;
}

bool Unpickler::ReadLine(std::string_view* out) {
  std::size_t scanned = 0;
  for (;;) {
    const char* nl = static_cast<const char*>(
        std::memchr(p_ + scanned, '\n', static_cast<std::size_t>(end_ - p_) - scanned));
    if (nl != nullptr) {
      *out = std::string_view(p_, static_cast<std::size_t>(nl - p_));
      p_ = nl + 1;
      return true;
    }
    scanned = static_cast<std::size_t>(end_ - p_);
    if (rest_ == nullptr) return false;
    if (scanned > limits_.max_string_bytes) {
      line_too_long_ = true;  // InputEnded() reports the limit
      return false;
    }
    if (scanned == capacity_) {
      // A line longer than the buffer: grow with the data (the limit above bounds it).
      std::size_t bigger = capacity_ * 2;
      std::unique_ptr<char[]> grown(new char[bigger]);
      std::memcpy(grown.get(), p_, scanned);
      if (op_start_ != nullptr) {
        op_offset_ = Offset(op_start_);
        op_start_ = nullptr;
      }
      base_ += static_cast<std::uint64_t>(p_ - begin_);
      buffer_ = std::move(grown);
      capacity_ = bigger;
      begin_ = p_ = buffer_.get();
      end_ = begin_ + scanned;
    }
    if (!Fill(scanned + 1)) return false;
  }
}

Status Unpickler::InputEnded(const char* what) const {
  if (!stream_status_.ok())
    return stream_status_.WithPrefix("byte " + std::to_string(Offset(end_)));
  if (line_too_long_) {
    return LimitError("opcode " + Name() + ": a text line longer than " +
                      Limit(limits_.max_string_bytes, "max_string_bytes") + " bytes");
  }
  if (capped_ && decoded_budget_binds_) {
    return Status::LimitExceeded(
        "byte " + std::to_string(OpOffset()) + ": " +
        BudgetMessage("the input decompresses to more than its size justifies", "decoded-size",
                      max_input_, max_input_ + 1, ProcessBudget().max_decoded_bytes != 0,
                      "--max-decoded", /*bytes=*/true));
  }
  if (capped_) {
    return LimitError("the input is longer than " +
                      Limit(limits_.max_input_bytes, "max_input_bytes") + " bytes");
  }
  return Error("truncated: the input ends inside " + std::string(what) + " " + Name() +
               " (at byte " + std::to_string(Offset(end_)) + ")");
}

bool Unpickler::CheckSize(std::uint64_t n, const char* what) {
  if (n > limits_.max_string_bytes) {
    return Fail(LimitError("opcode " + Name() + ": a " + what + " of " + std::to_string(n) +
                           " bytes is longer than " +
                           Limit(limits_.max_string_bytes, "max_string_bytes")));
  }
  if (n > Document::kMaxObjectSize) {
    return Fail(LimitError("opcode " + Name() + ": a " + what + " of " + std::to_string(n) +
                           " bytes is longer than the 4 GiB one object may hold"));
  }
  return true;
}

bool Unpickler::ContainerRoom(Value container, std::uint64_t add) {
  std::uint64_t have = container.kind() == ValueKind::kDict ? doc_.Entries(container).size()
                                                            : doc_.Items(container).size();
  if (have + add <= Document::kMaxObjectSize) return true;
  return Fail(LimitError("opcode " + Name() + ": a container would hold more than " +
                         std::to_string(Document::kMaxObjectSize) + " items"));
}

bool Unpickler::Target(ValueKind kind, std::size_t top, Value* out) {
  if (top <= FrameBegin()) {
    return Fail(OpError(std::string("stack underflow: no ") + std::string(ValueKindName(kind)) +
                        " to add to"));
  }
  *out = stack_[top - 1];
  if (out->kind() == kind) return true;
  return Fail(OpError(std::string("expected a ") + std::string(ValueKindName(kind)) +
                      " to add to, found " + std::string(ValueKindName(out->kind()))));
}

bool Unpickler::Offer(Value list, std::span<const Value> items, bool* took) {
  const bool taken = Taken(list);
  if (Status status = sink_->TakeItems(doc_, list, taken, items, OpOffset(), took); !status.ok())
      [[unlikely]] {
    return Fail(status.WithPrefix("byte " + std::to_string(OpOffset())));
  }
  if (*took && !taken) {
    const ObjectId id = *doc_.Id(list);
    if (id >= taken_.size()) taken_.resize(std::max<std::size_t>(id + 1, taken_.size() * 2));
    taken_[id] = true;
  }
  return true;
}

bool Unpickler::MemoPut(std::uint64_t index) {
  FRAGSCOPE_PICKLE_TRY(NeedOnFrame(1));
  const Value v = stack_.back();
  if (index < memo_.size()) {
    if (!memo_[index].set()) ++memo_count_;
    memo_[index] = MemoSlot{v};
  } else if (auto it = sparse_memo_.find(index); it != sparse_memo_.end()) {
    it->second = v;
    return true;
  } else if (index <= 2 * memo_count_ + 16) {
    // Dense, with holes bounded by the entries there are: memory follows the input.
    if (memo_.size() + sparse_memo_.size() >= limits_.max_memo) {
      return Fail(LimitError("the memo holds more than " + Limit(limits_.max_memo, "max_memo") +
                             " entries"));
    }
    const std::size_t old_size = memo_.size();
    MemoSlot* fresh = memo_.Extend(index + 1 - old_size);
    std::fill(fresh, fresh + (index + 1 - old_size), MemoSlot{});
    memo_[index] = MemoSlot{v};
    ++memo_count_;
  } else {
    if (memo_.size() + sparse_memo_.size() >= limits_.max_memo) {
      return Fail(LimitError("the memo holds more than " + Limit(limits_.max_memo, "max_memo") +
                             " entries"));
    }
    sparse_memo_.emplace(index, v);
    ++memo_count_;
  }
  return true;
}

[[gnu::always_inline]] inline bool Unpickler::MemoGet(std::uint64_t index) {
  if (index < memo_.size() && memo_[index].set()) [[likely]]
    return Push(memo_[index].value);
  return MemoGetSlow(index);
}

bool Unpickler::MemoGetSlow(std::uint64_t index) {
  if (!sparse_memo_.empty()) {
    if (auto it = sparse_memo_.find(index); it != sparse_memo_.end()) return Push(it->second);
  }
  return Fail(OpError("memo key " + std::to_string(index) + " was never stored"));
}

bool Unpickler::TextInt(bool is_long) {
  std::string_view line;
  if (!ReadLine(&line)) return Fail(InputEnded("the line of"));
  if (!is_long) {
    // Protocol 0 writes bools as INT "01" / "00".
    if (line == "01") return Push(doc_.AddBool(true));
    if (line == "00") return Push(doc_.AddBool(false));
  } else if (!line.empty() && line.back() == 'L') {
    line.remove_suffix(1);
  }
  std::string bytes;
  std::string error = ParsePyInt(line, 0, &bytes);
  if (!error.empty()) return Fail(OpError(error + ": \"" + std::string(line.substr(0, 40)) + "\""));
  if (bytes.empty()) {
    return Fail(LimitError("opcode " + Name() + ": a decimal integer of more than " +
                           std::to_string(internal::kMaxDecimalDigits) + " digits"));
  }
  FRAGSCOPE_PICKLE_TRY(CheckSize(bytes.size(), "integer"));
  Value v = doc_.AddLongBytes(bytes);
  FRAGSCOPE_PICKLE_TRY(CheckObjects());
  return Push(v);
}

bool Unpickler::TextFloat() {
  std::string_view line;
  if (!ReadLine(&line)) return Fail(InputEnded("the line of"));
  std::string_view s = StripSpace(line);
  std::string text;
  for (char c : s) {
    if (c != '_') text.push_back(c);
  }
  std::string_view t = text;
  if (!t.empty() && t[0] == '+') t.remove_prefix(1);
  double d = 0;
  auto [end, ec] = std::from_chars(t.data(), t.data() + t.size(), d);
  if (t.empty() || end != t.data() + t.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    return Fail(OpError("not a float: \"" + std::string(line.substr(0, 40)) + "\""));
  }
  Value v = doc_.AddFloat(d);
  FRAGSCOPE_PICKLE_TRY(CheckObjects());
  return Push(v);
}

bool Unpickler::TextString(bool unicode) {
  std::string_view line;
  if (!ReadLine(&line)) return Fail(InputEnded("the line of"));
  FRAGSCOPE_PICKLE_TRY(CheckSize(line.size(), "string"));
  if (unicode) {
    std::string error = RawUnicodeEscapeDecode(line, &scratch2_);
    if (!error.empty()) return Fail(OpError(error));
  } else {
    // Python 2's repr of a str: quoted, with backslash escapes.
    if (line.size() < 2 || line.front() != line.back() || (line[0] != '\'' && line[0] != '"')) {
      return Fail(OpError("the argument must be quoted"));
    }
    if (!EscapeDecode(line.substr(1, line.size() - 2), &scratch2_)) {
      return Fail(OpError("bad escape in the quoted string"));
    }
  }
  FRAGSCOPE_PICKLE_TRY(CheckSize(scratch2_.size(), "string"));
  Value v = doc_.AddString(scratch2_);
  FRAGSCOPE_PICKLE_TRY(CheckObjects());
  return Push(v);
}

bool Unpickler::TextMemo(bool put) {
  std::string_view line;
  if (!ReadLine(&line)) return Fail(InputEnded("the line of"));
  std::string bytes;
  std::string error = ParsePyInt(line, 10, &bytes);
  if (!error.empty())
    return Fail(OpError("bad memo key: \"" + std::string(line.substr(0, 40)) + "\""));
  if (bytes.empty()) return Fail(OpError("memo key too long"));
  // A key that does not fit 63 bits cannot have been stored.
  std::string_view b = bytes;
  while (b.size() > 1 && b.back() == 0) b.remove_suffix(1);
  if (static_cast<unsigned char>(b.back()) & 0x80) {
    return Fail(OpError(put ? "negative memo key" : "memo key is negative"));
  }
  if (b.size() > 8) return Fail(OpError(put ? "memo key too large" : "memo key was never stored"));
  std::uint64_t key = 0;
  for (std::size_t i = b.size(); i-- > 0;) key = (key << 8) | static_cast<unsigned char>(b[i]);
  return put ? MemoPut(key) : MemoGet(key);
}

bool Unpickler::Payload(std::uint64_t n, bool bytes) {
  FRAGSCOPE_PICKLE_TRY(CheckSize(n, bytes ? "bytes payload" : "string"));
  std::string_view payload;
  if (!ReadPayload(n, &payload)) return Fail(InputEnded("the payload of"));
  Value v = bytes ? doc_.AddBytes(payload) : doc_.AddString(payload);
  FRAGSCOPE_PICKLE_TRY(CheckObjects());
  return Push(v);
}

bool Unpickler::Long(std::uint64_t n) {
  FRAGSCOPE_PICKLE_TRY(CheckSize(n, "integer"));
  std::string_view payload;
  if (!ReadPayload(n, &payload)) return Fail(InputEnded("the payload of"));
  Value v = doc_.AddLongBytes(payload);
  FRAGSCOPE_PICKLE_TRY(CheckObjects());
  return Push(v);
}

// Makes `n` argument bytes available at p_, or returns the truncation error.
#define FRAGSCOPE_PICKLE_NEED(n)                                 \
  do {                                                           \
    if (static_cast<std::size_t>(end_ - p_) < (n) && !Fill(n)) { \
      return InputEnded("the argument of");                      \
    }                                                            \
  } while (false)

Result<Document> Unpickler::Run() {
  for (;;) {
    // Fast path for runs of BINGET and LONG_BINGET, most of a snapshot's opcodes (list items
    // and dict keys): locals only, no dispatch. Anything unusual (a missing key, a full
    // stack, the end of the window) leaves it for the general path below.
    {
      const char* p = p_;
      const char* const end = end_;
      const MemoSlot* const memo = memo_.data();
      const std::size_t memo_size = memo_.size();
      Value* out = stack_.next_free();
      Value* const room = stack_.room_end();
      while (end - p >= 5 && out != room) {
        std::uint64_t index;
        std::ptrdiff_t length;
        if (static_cast<std::uint8_t>(*p) == kBinGet) {
          index = static_cast<unsigned char>(p[1]);
          length = 2;
        } else if (static_cast<std::uint8_t>(*p) == kLongBinGet) {
          index = Le32(p + 1);
          length = 5;
        } else {
          break;
        }
        if (index >= memo_size || !memo[index].set()) break;
        *out++ = memo[index].value;
        p += length;
      }
      stack_.Commit(out);
      p_ = p;
    }
    if (p_ == end_ && !Fill(1)) {
      op_start_ = p_;
      if (!stream_status_.ok() || capped_) return InputEnded("");
      return Error("truncated: the input ends before the STOP opcode");
    }
    op_start_ = p_;
    op_ = static_cast<std::uint8_t>(*p_++);
    switch (op_) {
      // -- Machine control.
      case kProto: {
        FRAGSCOPE_PICKLE_NEED(1);
        auto proto = static_cast<std::uint8_t>(*p_++);
        if (proto > 5) return OpError("unsupported pickle protocol " + std::to_string(proto));
        break;
      }
      case kFrame:
        // Frames only group opcodes for buffered reading; their bounds carry no meaning here.
        FRAGSCOPE_PICKLE_NEED(8);
        p_ += 8;
        break;
      case kStop: {
        FRAGSCOPE_PICKLE_RUN(NeedOnFrame(1));
        doc_.set_root(stack_.back());
        doc_.set_input_bytes(Offset(p_));
        doc_.FinishBuilding();
        return std::move(doc_);
      }
      case kMark:
        if (marks_.size() >= limits_.max_depth) {
          return LimitError("more than " + Limit(limits_.max_depth, "max_depth") + " nested MARKs");
        }
        PushMark();
        break;
      case kPop:
        // As Python: POP on an empty frame discards the MARK instead.
        if (stack_.size() > FrameBegin()) {
          stack_.pop_back();
        } else {
          std::size_t begin = 0;
          FRAGSCOPE_PICKLE_RUN(PopMark(&begin));
        }
        break;
      case kPopMark: {
        std::size_t begin = 0;
        FRAGSCOPE_PICKLE_RUN(PopMark(&begin));
        stack_.resize(begin);
        break;
      }
      case kDup:
        FRAGSCOPE_PICKLE_RUN(NeedOnFrame(1));
        FRAGSCOPE_PICKLE_RUN(Push(stack_.back()));
        break;

      // -- Scalars.
      case kNone:
        FRAGSCOPE_PICKLE_RUN(Push(Value()));
        break;
      case kNewTrue:
      case kNewFalse:
        FRAGSCOPE_PICKLE_RUN(Push(doc_.AddBool(op_ == kNewTrue)));
        break;
      case kBinInt1:
        FRAGSCOPE_PICKLE_NEED(1);
        FRAGSCOPE_PICKLE_RUN(Push(doc_.AddInt(static_cast<unsigned char>(*p_))));
        p_ += 1;
        break;
      case kBinInt2:
        FRAGSCOPE_PICKLE_NEED(2);
        FRAGSCOPE_PICKLE_RUN(Push(doc_.AddInt(Le16(p_))));
        p_ += 2;
        break;
      case kBinInt:
        FRAGSCOPE_PICKLE_NEED(4);
        FRAGSCOPE_PICKLE_RUN(Push(doc_.AddInt(static_cast<std::int32_t>(Le32(p_)))));
        p_ += 4;
        break;
      case kLong1: {
        FRAGSCOPE_PICKLE_NEED(1);
        std::size_t n = static_cast<unsigned char>(*p_++);
        FRAGSCOPE_PICKLE_NEED(n);
        Value v;
        if (n > 0 && n <= 8) {
          // Addresses, sizes and times: sign-extend the n bytes here.
          std::uint64_t u = (static_cast<unsigned char>(p_[n - 1]) & 0x80) ? ~std::uint64_t{0} : 0;
          for (std::size_t i = n; i-- > 0;) u = (u << 8) | static_cast<unsigned char>(p_[i]);
          v = doc_.AddInt(static_cast<std::int64_t>(u));
        } else {
          v = doc_.AddLongBytes(std::string_view(p_, n));
        }
        p_ += n;
        FRAGSCOPE_PICKLE_RUN(CheckObjects());
        FRAGSCOPE_PICKLE_RUN(Push(v));
        break;
      }
      case kLong4: {
        FRAGSCOPE_PICKLE_NEED(4);
        auto n = static_cast<std::int32_t>(Le32(p_));
        p_ += 4;
        if (n < 0) return OpError("negative byte count " + std::to_string(n));
        FRAGSCOPE_PICKLE_RUN(Long(static_cast<std::uint64_t>(n)));
        break;
      }
      case kInt:
      case kLong:
        FRAGSCOPE_PICKLE_RUN(TextInt(op_ == kLong));
        break;
      case kBinFloat: {
        FRAGSCOPE_PICKLE_NEED(8);
        Value v = doc_.AddFloat(Be64Double(p_));
        p_ += 8;
        FRAGSCOPE_PICKLE_RUN(CheckObjects());
        FRAGSCOPE_PICKLE_RUN(Push(v));
        break;
      }
      case kFloat:
        FRAGSCOPE_PICKLE_RUN(TextFloat());
        break;

      // -- Strings and bytes. (Python 2 str: STRING, BINSTRING, SHORT_BINSTRING; read as str.)
      case kShortBinUnicode:
      case kShortBinString:
      case kShortBinBytes: {
        FRAGSCOPE_PICKLE_NEED(1);
        std::size_t n = static_cast<unsigned char>(*p_++);
        FRAGSCOPE_PICKLE_RUN(Payload(n, op_ == kShortBinBytes));
        break;
      }
      case kBinUnicode:
      case kBinBytes: {
        FRAGSCOPE_PICKLE_NEED(4);
        std::uint32_t n = Le32(p_);
        p_ += 4;
        FRAGSCOPE_PICKLE_RUN(Payload(n, op_ == kBinBytes));
        break;
      }
      case kBinString: {
        FRAGSCOPE_PICKLE_NEED(4);
        auto n = static_cast<std::int32_t>(Le32(p_));
        p_ += 4;
        if (n < 0) return OpError("negative byte count " + std::to_string(n));
        FRAGSCOPE_PICKLE_RUN(Payload(static_cast<std::uint64_t>(n), false));
        break;
      }
      case kBinUnicode8:
      case kBinBytes8:
      case kByteArray8: {
        FRAGSCOPE_PICKLE_NEED(8);
        std::uint64_t n = Le64(p_);
        p_ += 8;
        FRAGSCOPE_PICKLE_RUN(Payload(n, op_ != kBinUnicode8));
        break;
      }
      case kString:
      case kUnicode:
        FRAGSCOPE_PICKLE_RUN(TextString(op_ == kUnicode));
        break;

      // -- Containers.
      case kEmptyList:
      case kEmptySet: {  // sets are read as lists (docs/formats.md)
        Value v = doc_.AddList();
        FRAGSCOPE_PICKLE_RUN(CheckObjects());
        FRAGSCOPE_PICKLE_RUN(Push(v));
        break;
      }
      case kEmptyDict: {
        Value v = doc_.AddDict();
        FRAGSCOPE_PICKLE_RUN(CheckObjects());
        FRAGSCOPE_PICKLE_RUN(Push(v));
        break;
      }
      case kEmptyTuple: {
        Value v = doc_.AddTuple({});
        FRAGSCOPE_PICKLE_RUN(CheckObjects());
        FRAGSCOPE_PICKLE_RUN(Push(v));
        break;
      }
      case kTuple1:
      case kTuple2:
      case kTuple3: {
        std::size_t n = op_ - kTuple1 + 1u;
        FRAGSCOPE_PICKLE_RUN(NeedOnFrame(n));
        Value v = doc_.AddTuple(std::span<const Value>(stack_.data() + stack_.size() - n, n));
        FRAGSCOPE_PICKLE_RUN(CheckObjects());
        stack_.resize(stack_.size() - n);
        FRAGSCOPE_PICKLE_RUN(Push(v));
        break;
      }
      case kTuple:
      case kList:
      case kFrozenSet:  // read as a tuple: immutable, like a frozenset
      case kDict: {
        std::size_t begin = 0;
        FRAGSCOPE_PICKLE_RUN(PopMark(&begin));
        std::span<const Value> run(stack_.data() + begin, stack_.size() - begin);
        Value v;
        if (op_ == kDict) {
          if (run.size() % 2 != 0) return OpError("odd number of values (keys without a value)");
          v = doc_.AddDict();
          FRAGSCOPE_PICKLE_RUN(ContainerRoom(v, run.size() / 2));
          doc_.SetItems(v, run);
        } else if (op_ == kList) {
          v = doc_.AddList();
          FRAGSCOPE_PICKLE_RUN(ContainerRoom(v, run.size()));
          doc_.Append(v, run);
        } else {
          FRAGSCOPE_PICKLE_RUN(ContainerRoom(Value(), run.size()));
          v = doc_.AddTuple(run);
        }
        FRAGSCOPE_PICKLE_RUN(CheckObjects());
        stack_.resize(begin);
        FRAGSCOPE_PICKLE_RUN(Push(v));
        break;
      }
      case kAppend: {
        FRAGSCOPE_PICKLE_RUN(NeedOnFrame(2));
        Value item = stack_.back();
        stack_.pop_back();
        Value list;
        FRAGSCOPE_PICKLE_RUN(Target(ValueKind::kList, stack_.size(), &list));
        bool took = false;
        if (sink_ != nullptr) FRAGSCOPE_PICKLE_RUN(Offer(list, {&item, 1}, &took));
        if (took) break;
        FRAGSCOPE_PICKLE_RUN(ContainerRoom(list, 1));
        doc_.Append(list, item);
        break;
      }
      case kAppends:
      case kAddItems: {
        std::size_t begin = 0;
        FRAGSCOPE_PICKLE_RUN(PopMark(&begin));
        Value list;
        FRAGSCOPE_PICKLE_RUN(Target(ValueKind::kList, begin, &list));
        std::span<const Value> run(stack_.data() + begin, stack_.size() - begin);
        bool took = false;
        if (sink_ != nullptr) FRAGSCOPE_PICKLE_RUN(Offer(list, run, &took));
        if (!took) {
          FRAGSCOPE_PICKLE_RUN(ContainerRoom(list, run.size()));
          doc_.Append(list, run);
        }
        stack_.resize(begin);
        break;
      }
      case kSetItem: {
        FRAGSCOPE_PICKLE_RUN(NeedOnFrame(3));
        Value value = stack_.back();
        Value key = stack_[stack_.size() - 2];
        stack_.resize(stack_.size() - 2);
        Value dict;
        FRAGSCOPE_PICKLE_RUN(Target(ValueKind::kDict, stack_.size(), &dict));
        if (InTakenFrame(stack_.size() - 1)) {
          const Value pair[2] = {key, value};
          sink_->DictItems(doc_, dict, pair);
          break;
        }
        FRAGSCOPE_PICKLE_RUN(ContainerRoom(dict, 1));
        doc_.SetItem(dict, key, value);
        break;
      }
      case kSetItems: {
        std::size_t begin = 0;
        FRAGSCOPE_PICKLE_RUN(PopMark(&begin));
        Value dict;
        FRAGSCOPE_PICKLE_RUN(Target(ValueKind::kDict, begin, &dict));
        std::span<const Value> run(stack_.data() + begin, stack_.size() - begin);
        if (run.size() % 2 != 0) return OpError("odd number of values (a key without a value)");
        if (InTakenFrame(begin - 1)) {
          sink_->DictItems(doc_, dict, run);
        } else {
          FRAGSCOPE_PICKLE_RUN(ContainerRoom(dict, run.size() / 2));
          doc_.SetItems(dict, run);
        }
        stack_.resize(begin);
        break;
      }

      // -- Memo.
      case kMemoize:
        // Protocol 4 memoises every container and string, in order: a dense append.
        if (memo_count_ == memo_.size() && stack_.size() > FrameBegin() &&
            memo_count_ + sparse_memo_.size() < limits_.max_memo) [[likely]] {
          memo_.push_back(MemoSlot{stack_.back()});
          ++memo_count_;
          break;
        }
        FRAGSCOPE_PICKLE_RUN(MemoPut(memo_count_));
        break;
      case kBinPut:
        FRAGSCOPE_PICKLE_NEED(1);
        FRAGSCOPE_PICKLE_RUN(MemoPut(static_cast<unsigned char>(*p_++)));
        break;
      case kLongBinPut:
        FRAGSCOPE_PICKLE_NEED(4);
        p_ += 4;
        FRAGSCOPE_PICKLE_RUN(MemoPut(Le32(p_ - 4)));
        break;
      case kBinGet:
        FRAGSCOPE_PICKLE_NEED(1);
        FRAGSCOPE_PICKLE_RUN(MemoGet(static_cast<unsigned char>(*p_++)));
        break;
      case kLongBinGet:
        FRAGSCOPE_PICKLE_NEED(4);
        p_ += 4;
        FRAGSCOPE_PICKLE_RUN(MemoGet(Le32(p_ - 4)));
        break;
      case kPut:
      case kGet:
        FRAGSCOPE_PICKLE_RUN(TextMemo(op_ == kPut));
        break;

      default: {
        if (const char* why = RefusalReason(op_)) {
          return Error("opcode " + Name() + " (" + Hex(op_) + ") refused: " + why +
                       "; a memory snapshot holds only plain data");
        }
        return Error("unknown opcode " + Hex(op_) + " (not a pickle, or a corrupt one)");
      }
    }
  }
}

#undef FRAGSCOPE_PICKLE_NEED
#undef FRAGSCOPE_PICKLE_RUN
#undef FRAGSCOPE_PICKLE_TRY

}  // namespace

// ---- Public entry points --------------------------------------------------------------------

std::string_view PickleOpcodeName(std::uint8_t op) {
  static const std::array<std::string_view, 256> kNames = [] {
    std::array<std::string_view, 256> names;
    names.fill("unknown");
    for (const auto& [code, name] : kOpNames) names[code] = name;
    return names;
  }();
  return kNames[op];
}

namespace internal {

bool LooksCompressed(std::string_view bytes) {
  auto starts = [&](std::string_view magic) { return bytes.substr(0, magic.size()) == magic; };
  bool zstd_skippable = bytes.size() >= 4 &&
                        (static_cast<unsigned char>(bytes[0]) & 0xF0) == 0x50 &&
                        bytes.substr(1, 3) == "\x2a\x4d\x18";
  return starts("\x1f\x8b") || starts("\x28\xb5\x2f\xfd") || zstd_skippable;
}

std::string IntegerDigitsToLongBytes(std::string_view digits, int base, bool negative) {
  // Magnitude as little-endian 32-bit limbs.
  std::vector<std::uint32_t> limbs;
  if (base == 10) {
    for (char c : digits) {
      std::uint64_t carry = static_cast<std::uint64_t>(c - '0');
      for (std::uint32_t& limb : limbs) {
        std::uint64_t v = std::uint64_t{limb} * 10 + carry;
        limb = static_cast<std::uint32_t>(v);
        carry = v >> 32;
      }
      if (carry != 0) limbs.push_back(static_cast<std::uint32_t>(carry));
    }
  } else {
    const int bits = base == 16 ? 4 : base == 8 ? 3 : 1;
    std::size_t bit = 0;
    for (std::size_t i = digits.size(); i-- > 0; bit += bits) {
      std::uint32_t d = static_cast<std::uint32_t>(DigitValue(digits[i]));
      for (int k = 0; k < bits; ++k) {
        if ((d >> k) & 1) {
          std::size_t at = bit + k;
          if (limbs.size() <= at / 32) limbs.resize(at / 32 + 1, 0);
          limbs[at / 32] |= std::uint32_t{1} << (at % 32);
        }
      }
    }
  }
  std::string out;
  out.reserve(limbs.size() * 4 + 1);
  for (std::uint32_t limb : limbs) {
    for (int k = 0; k < 4; ++k) out.push_back(static_cast<char>((limb >> (8 * k)) & 0xff));
  }
  out.push_back('\0');  // sign byte: the magnitude is non-negative
  if (negative) {
    // Two's complement: invert and add one.
    unsigned carry = 1;
    for (char& c : out) {
      unsigned v = (static_cast<unsigned char>(c) ^ 0xffu) + carry;
      c = static_cast<char>(v & 0xff);
      carry = v >> 8;
    }
  }
  return out;
}

Result<Document> ReadPickleFrom(std::string_view head, InputStream* rest,
                                const PickleLimits& limits, const ProgressFn& progress,
                                PickleListSink* sink) {
  Unpickler unpickler(head, rest, limits, progress, sink);
  return unpickler.Run();
}

}  // namespace internal

Result<Document> ReadPickle(InputStream& input, const PickleLimits& limits,
                            const ProgressFn& progress, PickleListSink* sink) {
  return internal::ReadPickleFrom({}, &input, limits, progress, sink);
}

Result<Document> ReadPickleBytes(std::string_view bytes, const PickleLimits& limits,
                                 PickleListSink* sink) {
  if (!internal::LooksCompressed(bytes))
    return internal::ReadPickleFrom(bytes, nullptr, limits, {}, sink);
  Result<std::unique_ptr<InputStream>> input = InputStream::Open(MemorySource(std::string(bytes)));
  if (!input.ok()) return input.status();
  return ReadPickle(**input, limits, {}, sink);
}

}  // namespace fragscope::sources
