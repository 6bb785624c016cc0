// Status and Result<T>: how every fragscope library function reports failure.
//
// A Status is either OK or an error with a code and a message. Messages from parsers say
// *where* (file:line, event index, byte offset) and *what* (the field, the limit that was hit),
// so an application can print them as they are. Nothing is thrown across the public API.
//
// Thread safety: value types; distinct objects may be used from distinct threads.
#ifndef FRAGSCOPE_STATUS_H_
#define FRAGSCOPE_STATUS_H_

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace fragscope {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,  // a caller-supplied value (flag, size string, option) is malformed
  kCorruption,       // input data is malformed or violates the model's invariants
  kLimitExceeded,    // input exceeds an explicit limit (line length, depth, objects)
  kIoError,          // the operating system refused a read or write
  kNotFound,         // a named file or thing does not exist
  kUnimplemented,    // a valid request for something this build does not do
  kInternal,         // a bug in fragscope
  kOutOfMemory,      // a simulated allocation failed as PyTorch's would (message = its text)
};

/// A Status is OK or holds an error code and a human-readable message.
class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message)
      : code_(code), message_(std::make_unique<std::string>(std::move(message))) {}
  Status(const Status& other)
      : code_(other.code_),
        message_(other.message_ ? std::make_unique<std::string>(*other.message_) : nullptr) {}
  Status& operator=(const Status& other) {
    if (this != &other) *this = Status(other);
    return *this;
  }
  Status(Status&&) noexcept = default;
  Status& operator=(Status&&) noexcept = default;

  static Status Ok() { return Status(); }
  static Status InvalidArgument(std::string msg) {
    return {StatusCode::kInvalidArgument, std::move(msg)};
  }
  static Status Corruption(std::string msg) { return {StatusCode::kCorruption, std::move(msg)}; }
  static Status LimitExceeded(std::string msg) {
    return {StatusCode::kLimitExceeded, std::move(msg)};
  }
  static Status IoError(std::string msg) { return {StatusCode::kIoError, std::move(msg)}; }
  static Status NotFound(std::string msg) { return {StatusCode::kNotFound, std::move(msg)}; }
  static Status Unimplemented(std::string msg) {
    return {StatusCode::kUnimplemented, std::move(msg)};
  }
  static Status Internal(std::string msg) { return {StatusCode::kInternal, std::move(msg)}; }
  static Status OutOfMemory(std::string msg) { return {StatusCode::kOutOfMemory, std::move(msg)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  /// The message; empty for OK.
  const std::string& message() const {
    static const std::string kEmpty;
    return message_ ? *message_ : kEmpty;
  }

  /// Returns a copy whose message is "prefix: message" (used to add a location).
  Status WithPrefix(std::string_view prefix) const {
    if (ok()) return *this;
    return Status(code_, std::string(prefix) + ": " + message());
  }

  /// "OK" or "<code name>: <message>".
  std::string ToString() const;

 private:
  // OK is a null message: the hot path (every applied event returns a Status) never touches
  // a std::string.
  StatusCode code_ = StatusCode::kOk;
  std::unique_ptr<std::string> message_;
};

/// Result<T> holds either a T or a non-OK Status. (std::expected once we move to C++23.)
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}          // NOLINT: implicit by design
  Result(Status status) : status_(std::move(status)) {}  // NOLINT: implicit by design

  bool ok() const { return status_.ok(); }
  const Status& status() const { return status_; }
  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  Status status_;
  std::optional<T> value_;
};

}  // namespace fragscope

/// Returns from the enclosing function if `expr` (a Status) is not OK.
#define FRAGSCOPE_RETURN_IF_ERROR(expr)                    \
  do {                                                     \
    ::fragscope::Status fragscope_status_ = (expr);        \
    if (!fragscope_status_.ok()) return fragscope_status_; \
  } while (false)

#endif  // FRAGSCOPE_STATUS_H_
