// Internal entry points of the pickle and JSON readers over "bytes already read, then the rest
// of a stream": ReadDocumentFile reads a file's first bytes to tell the format, and in-memory
// input needs no stream at all (zero copy).
#ifndef FRAGSCOPE_SOURCES_DOCUMENT_READ_FROM_H_
#define FRAGSCOPE_SOURCES_DOCUMENT_READ_FROM_H_

#include <string_view>

#include "fragscope/status.h"
#include "sources/document/document.h"
#include "sources/pickle/pickle_reader.h"
#include "sources/trace/input_stream.h"

namespace fragscope::sources::internal {

/// Parses `head` followed by the rest of `rest` (null: `head` is the whole input). `head` must
/// stay valid during the call. Errors are as ReadPickle's / ReadJsonDocument's.
Result<Document> ReadPickleFrom(std::string_view head, InputStream* rest,
                                const PickleLimits& limits, const ProgressFn& progress,
                                PickleListSink* sink = nullptr);
Result<Document> ReadJsonFrom(std::string_view head, InputStream* rest, const PickleLimits& limits,
                              const ProgressFn& progress);

/// True when `bytes` start with a gzip or zstd magic (then they need an InputStream).
bool LooksCompressed(std::string_view bytes);

/// Converts the digits of an integer literal in `base` (2, 8, 10 or 16; no sign, prefix or
/// separators; at least one digit, all valid) to little-endian two's complement bytes, negated
/// when `negative`. Linear for bases 2, 8 and 16, quadratic for base 10: callers bound the
/// length of decimal literals.
std::string IntegerDigitsToLongBytes(std::string_view digits, int base, bool negative);

/// Decimal literals longer than this are refused (CPython's default int_max_str_digits), so
/// that the quadratic conversion stays below a millisecond.
inline constexpr std::size_t kMaxDecimalDigits = 4300;

}  // namespace fragscope::sources::internal

#endif  // FRAGSCOPE_SOURCES_DOCUMENT_READ_FROM_H_
