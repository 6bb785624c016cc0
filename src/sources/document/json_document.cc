// JSON to Document through nlohmann::json's SAX parser (iterative: its nesting is an explicit
// stack, so deep input cannot overflow ours), fed by a byte iterator over the input window.
// Values wait on a stack until their container closes; each container is then filled in one
// batch, so its items form one run in the Document's arena. Object keys and short strings are
// interned (JSON repeats every key in every object; a pickle would have memoised them).
#include "sources/document/json_document.h"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/keyed_hash.h"
#include "sources/budget.h"
#include "sources/document/read_from.h"

namespace fragscope::sources {

namespace {

using Json = nlohmann::json;

// ---- Input ----------------------------------------------------------------------------------

// The bytes to parse: `head` (read in place), then the rest of a stream. Counts lines for
// error messages; the window never reaches past max_input_bytes.
class JsonInput {
 public:
  JsonInput(std::string_view head, InputStream* rest, const PickleLimits& limits,
            const ProgressFn& progress)
      : rest_(rest), limits_(limits), progress_(progress) {
    const std::uint64_t decoded_budget = DecodedBudgetFor(BudgetInputBytes(head, rest));
    decoded_budget_binds_ = decoded_budget < limits_.max_input_bytes;
    max_input_ = std::min(decoded_budget, limits_.max_input_bytes);
    Show(head.data(), head.size());
  }

  bool AtEnd() { return p_ == end_ && !Fill(); }
  char Peek() const { return *p_; }
  void Advance() {
    if (*p_ == '\n') {
      ++line_;
      line_start_ = consumed_ + 1;
    }
    ++p_;
    ++consumed_;
  }

  std::uint64_t line() const { return line_ + 1; }
  std::uint64_t column() const { return consumed_ - line_start_; }
  const Status& status() const { return status_; }
  std::uint64_t consumed() const { return consumed_; }

 private:
  // Makes [data, data + n) the window, cut at max_input_bytes.
  void Show(const char* data, std::size_t n) {
    std::uint64_t room = max_input_ - std::min(consumed_, max_input_);
    if (n > room) {
      n = static_cast<std::size_t>(room);
      capped_ = true;
    }
    p_ = data;
    end_ = data + n;
  }

  bool Fill() {
    if (!status_.ok()) return false;
    if (capped_ && decoded_budget_binds_) {
      status_ = Status::LimitExceeded(
          "line " + std::to_string(line()) + ", column " + std::to_string(column()) + ": " +
          BudgetMessage("the input decompresses to more than its size justifies", "decoded-size",
                        max_input_, max_input_ + 1, ProcessBudget().max_decoded_bytes != 0,
                        "--max-decoded", /*bytes=*/true));
      return false;
    }
    if (capped_) {
      status_ = Status::LimitExceeded("line " + std::to_string(line()) + ", column " +
                                      std::to_string(column()) + ": the input is longer than " +
                                      "the limit of " + std::to_string(limits_.max_input_bytes) +
                                      " (max_input_bytes) bytes");
      return false;
    }
    if (rest_ == nullptr || eof_) return false;
    if (buffer_ == nullptr) buffer_.reset(new char[kStreamBufferBytes]);
    Result<std::size_t> got = rest_->Read(buffer_.get(), kStreamBufferBytes);
    if (!got.ok()) {
      status_ = got.status().WithPrefix("line " + std::to_string(line()) + ", column " +
                                        std::to_string(column()));
      return false;
    }
    if (*got == 0) {
      eof_ = true;
      return false;
    }
    Show(buffer_.get(), *got);
    if (progress_ && rest_->raw_bytes_consumed() >= next_progress_) {
      progress_(rest_->raw_bytes_consumed(), rest_->raw_bytes_total());
      next_progress_ = rest_->raw_bytes_consumed() + (std::uint64_t{4} << 20);
    }
    return p_ != end_ || Fill();
  }

  InputStream* rest_;
  const PickleLimits& limits_;
  const ProgressFn& progress_;
  std::unique_ptr<char[]> buffer_;
  const char* p_ = nullptr;
  const char* end_ = nullptr;
  bool eof_ = false;
  bool capped_ = false;
  std::uint64_t max_input_ = 0;        // decoded bytes read at most
  bool decoded_budget_binds_ = false;  // max_input_ is DecodedBudgetFor's, not the fixed cap
  Status status_;
  std::uint64_t consumed_ = 0;
  std::uint64_t line_ = 0;
  std::uint64_t line_start_ = 0;
  std::uint64_t next_progress_ = std::uint64_t{4} << 20;
};

// The iterator nlohmann's iterator_input_adapter reads through: every copy shares the input,
// and an iterator equals the end one when the input has no more bytes.
class JsonInputIterator {
 public:
  using iterator_category = std::input_iterator_tag;
  using value_type = char;
  using difference_type = std::ptrdiff_t;
  using pointer = const char*;
  using reference = const char&;

  JsonInputIterator() = default;
  explicit JsonInputIterator(JsonInput* input) : input_(input) {}
  char operator*() const { return input_->Peek(); }
  JsonInputIterator& operator++() {
    input_->Advance();
    return *this;
  }
  bool operator==(const JsonInputIterator& other) const {
    bool a = input_ == nullptr || input_->AtEnd();
    bool b = other.input_ == nullptr || other.input_->AtEnd();
    return a == b;
  }
  bool operator!=(const JsonInputIterator& other) const { return !(*this == other); }

 private:
  JsonInput* input_ = nullptr;
};

// ---- SAX handler ----------------------------------------------------------------------------

class DocumentBuilder {
 public:
  using number_integer_t = Json::number_integer_t;
  using number_unsigned_t = Json::number_unsigned_t;
  using number_float_t = Json::number_float_t;
  using string_t = Json::string_t;
  using binary_t = Json::binary_t;

  DocumentBuilder(JsonInput* input, const PickleLimits& limits, std::uint64_t input_size)
      : input_(input),
        limits_(limits),
        memory_user_set_(limits.max_memory_bytes != 0 || ProcessBudget().max_memory_bytes != 0),
        memory_budget_(limits.max_memory_bytes != 0 ? limits.max_memory_bytes
                                                    : MemoryBudgetFor(input_size)) {}

  bool null() { return Push(Value()) && Objects(); }
  bool boolean(bool b) { return Push(doc_.AddBool(b)) && Objects(); }
  bool number_integer(number_integer_t i) { return Push(doc_.AddInt(i)) && Objects(); }
  bool number_unsigned(number_unsigned_t u) {
    if (u <= static_cast<std::uint64_t>(INT64_MAX))
      return Push(doc_.AddInt(static_cast<std::int64_t>(u))) && Objects();
    char bytes[9];
    for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((u >> (8 * i)) & 0xff);
    bytes[8] = 0;  // sign byte
    return Push(doc_.AddLongBytes(std::string_view(bytes, 9))) && Objects();
  }
  bool number_float(number_float_t d, const string_t& text) {
    if (text.find_first_of(".eE") == string_t::npos) {
      // An integer beyond 64 bits (nlohmann hands those over as floats): keep it exact.
      std::string_view digits = text;
      bool negative = !digits.empty() && digits[0] == '-';
      if (negative) digits.remove_prefix(1);
      if (digits.size() > internal::kMaxDecimalDigits) {
        return Fail(Status::LimitExceeded(Where() + "an integer of more than " +
                                          std::to_string(internal::kMaxDecimalDigits) + " digits"));
      }
      return Push(doc_.AddLongBytes(internal::IntegerDigitsToLongBytes(digits, 10, negative))) &&
             Objects();
    }
    return Push(doc_.AddFloat(d)) && Objects();
  }
  bool string(string_t& s) {
    if (!Size(s.size()) || !Memory(s.capacity())) return false;
    return Push(Intern(s)) && Objects();
  }
  bool binary(binary_t&) {
    return Fail(Status::Corruption(Where() + "binary values are not JSON"));
  }
  bool start_object(std::size_t) { return Open(); }
  bool key(string_t& s) {
    if (!Size(s.size())) return false;
    return Push(Intern(s)) && Objects();
  }
  bool end_object() {
    std::size_t begin = starts_.back();
    starts_.pop_back();
    Value dict = doc_.AddDict();
    doc_.SetItems(dict, std::span<const Value>(stack_.data() + begin, stack_.size() - begin));
    stack_.resize(begin);
    return Push(dict) && Objects();
  }
  bool start_array(std::size_t) { return Open(); }
  bool end_array() {
    std::size_t begin = starts_.back();
    starts_.pop_back();
    Value list = doc_.AddList();
    doc_.Append(list, std::span<const Value>(stack_.data() + begin, stack_.size() - begin));
    stack_.resize(begin);
    return Push(list) && Objects();
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& ex) {
    // "[json.exception.parse_error.101] parse error at line 1, column 2: syntax error ...":
    // keep the location and the reason.
    // Other errors ("[json.exception.out_of_range.406] number overflow parsing '999...'") get
    // our location, and long quotes are cut.
    std::string what = ex.what();
    std::size_t at = what.find("line ");
    if (at != std::string::npos) {
      what = what.substr(at);
    } else {
      if (std::size_t close = what.find("] ");
          what.rfind("[json.exception.", 0) == 0 && close != std::string::npos) {
        what = what.substr(close + 2);
      }
      what = Where() + what;
    }
    constexpr std::size_t kMaxMessageBytes = 200;
    if (what.size() > kMaxMessageBytes) what = what.substr(0, kMaxMessageBytes) + "...";
    return Fail(Status::Corruption(what));
  }

  Result<Document> Finish(bool parsed) {
    // A read error explains a parse error that follows from it, so it comes first.
    if (!input_->status().ok()) return input_->status();
    if (!status_.ok()) return status_;
    if (!parsed || stack_.size() != 1) return Status::Corruption(Where() + "incomplete JSON");
    doc_.set_root(stack_.back());
    doc_.set_input_bytes(input_->consumed());
    doc_.FinishBuilding();
    return std::move(doc_);
  }

 private:
  std::string Where() const {
    return "line " + std::to_string(input_->line()) + ", column " +
           std::to_string(input_->column()) + ": ";
  }
  bool Fail(Status status) {
    if (status_.ok()) status_ = std::move(status);
    return false;
  }
  bool Push(Value v) {
    if (stack_.size() >= limits_.max_stack) {
      return Fail(Status::LimitExceeded(Where() + "more than the limit of " +
                                        std::to_string(limits_.max_stack) +
                                        " (max_stack) values wait in open containers"));
    }
    stack_.push_back(v);
    return true;
  }
  bool Objects() {
    if (doc_.object_count() <= limits_.max_objects) {
      // The memory budget (issue 24 item 1), every 4096 objects: JSON cannot share objects,
      // but a compressed file can still describe more than the machine holds.
      if ((++memory_checks_ & 0xfff) != 0) return true;
      return Memory(0);
    }
    return Fail(Status::LimitExceeded(Where() + "more than the limit of " +
                                      std::to_string(limits_.max_objects) +
                                      " (max_objects) objects"));
  }
  bool Size(std::size_t n) {
    if (n <= limits_.max_string_bytes && n <= Document::kMaxObjectSize) return true;
    return Fail(Status::LimitExceeded(
        Where() + "a string of " + std::to_string(n) + " bytes is longer than the limit of " +
        std::to_string(limits_.max_string_bytes) + " (max_string_bytes)"));
  }
  // Within the memory budget with `pending` more bytes held (a string not yet stored)?
  bool Memory(std::uint64_t pending) {
    const std::uint64_t used = doc_.heap_bytes() + stack_.capacity() * sizeof(Value) +
                               starts_.capacity() * sizeof(std::size_t) + interned_.size() * 64 +
                               pending;
    if (used <= memory_budget_) return true;
    return Fail(Status::LimitExceeded(
        Where() + BudgetMessage("the decoded data outgrew its memory budget", "memory",
                                memory_budget_, used, memory_user_set_, "--max-memory",
                                /*bytes=*/true)));
  }
  bool Open() {
    if (starts_.size() >= limits_.max_depth) {
      return Fail(Status::LimitExceeded(Where() + "more than the limit of " +
                                        std::to_string(limits_.max_depth) +
                                        " (max_depth) nested arrays and objects"));
    }
    starts_.push_back(stack_.size());
    return true;
  }
  Value Intern(const std::string& s) {
    // Short strings only: keys, actions, states, file and function names.
    constexpr std::size_t kMaxInternBytes = 256;
    constexpr std::size_t kMaxInterned = std::size_t{1} << 20;
    if (s.size() > kMaxInternBytes) return doc_.AddString(s);
    auto it = interned_.find(s);
    if (it != interned_.end()) return it->second;
    Value v = doc_.AddString(s);
    if (interned_.size() < kMaxInterned) interned_.emplace(s, v);
    return v;
  }

  JsonInput* input_;
  const PickleLimits& limits_;
  bool memory_user_set_;
  std::uint64_t memory_budget_;
  std::uint32_t memory_checks_ = 0;  // Objects() calls; memory is measured every 4096th
  Document doc_;
  std::vector<Value> stack_;
  std::vector<std::size_t> starts_;
  KeyedStringMap<Value> interned_;
  Status status_;
};

}  // namespace

namespace internal {

Result<Document> ReadJsonFrom(std::string_view head, InputStream* rest, const PickleLimits& limits,
                              const ProgressFn& progress) {
  JsonInput input(head, rest, limits, progress);
  DocumentBuilder builder(&input, limits, BudgetInputBytes(head, rest));
  bool parsed = Json::sax_parse(JsonInputIterator(&input), JsonInputIterator(), &builder,
                                nlohmann::detail::input_format_t::json, /*strict=*/true);
  return builder.Finish(parsed);
}

}  // namespace internal

Result<Document> ReadJsonDocument(InputStream& input, const PickleLimits& limits,
                                  const ProgressFn& progress) {
  return internal::ReadJsonFrom({}, &input, limits, progress);
}

Result<Document> ReadJsonDocumentBytes(std::string_view bytes, const PickleLimits& limits) {
  if (!internal::LooksCompressed(bytes)) return internal::ReadJsonFrom(bytes, nullptr, limits, {});
  Result<std::unique_ptr<InputStream>> input = InputStream::Open(MemorySource(std::string(bytes)));
  if (!input.ok()) return input.status();
  return ReadJsonDocument(**input, limits);
}

DocumentFormat DetectDocumentFormat(std::string_view first_bytes) {
  if (first_bytes.substr(0, 3) == "\xEF\xBB\xBF") first_bytes.remove_prefix(3);  // UTF-8 BOM
  for (char c : first_bytes) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') continue;
    return c == '{' || c == '[' ? DocumentFormat::kJson : DocumentFormat::kPickle;
  }
  return DocumentFormat::kPickle;
}

Result<Document> ReadDocumentFile(const std::string& path, DocumentFormat* format,
                                  const PickleLimits& limits, const ProgressFn& progress,
                                  PickleListSink* sink) {
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource(path);
  if (!source.ok()) return source.status();  // already names the path
  Result<std::unique_ptr<InputStream>> input = InputStream::Open(std::move(*source));
  if (!input.ok()) return input.status().WithPrefix(path);
  // Peek: read until the first byte that is not whitespace (or 4 KiB, or the end).
  std::string head;
  constexpr std::size_t kPeekBytes = 4096;
  head.resize(kPeekBytes);
  std::size_t have = 0;
  while (have < kPeekBytes) {
    Result<std::size_t> got = (*input)->Read(head.data() + have, kPeekBytes - have);
    if (!got.ok()) return got.status().WithPrefix(path);
    if (*got == 0) break;
    have += *got;
    if (head.find_first_not_of(" \t\r\n\xEF\xBB\xBF", 0) < have) break;
  }
  head.resize(have);
  DocumentFormat detected = DetectDocumentFormat(head);
  if (format != nullptr) *format = detected;
  Result<Document> doc = detected == DocumentFormat::kJson
                             ? internal::ReadJsonFrom(head, input->get(), limits, progress)
                             : internal::ReadPickleFrom(head, input->get(), limits, progress, sink);
  if (!doc.ok()) return doc.status().WithPrefix(path);
  return doc;
}

}  // namespace fragscope::sources
