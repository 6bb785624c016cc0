#include "fragscope/status.h"

namespace fragscope {

namespace {
const char* CodeName(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "OK";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kCorruption:
      return "corrupt input";
    case StatusCode::kLimitExceeded:
      return "limit exceeded";
    case StatusCode::kIoError:
      return "I/O error";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kUnimplemented:
      return "unimplemented";
    case StatusCode::kInternal:
      return "internal error";
    case StatusCode::kOutOfMemory:
      return "out of memory";
  }
  return "unknown";
}
}  // namespace

std::string Status::ToString() const {
  if (ok()) return "OK";
  return std::string(CodeName(code_)) + ": " + message();
}

}  // namespace fragscope
