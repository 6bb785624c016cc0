// JSON to Document, for snapshots exported as JSON (the newest PyTorch viewer accepts them).
// Integers are read as 64-bit (addresses above 2^53 keep their value); larger integers become
// big ints; numbers with a fraction or exponent become floats. Objects become dicts (keys in
// file order), arrays lists. Strings are unescaped to UTF-8.
//
// Streaming like ReadPickle, with the same limits (depth, objects, string bytes, input bytes)
// and errors that start with "line L, column C: ".
#ifndef FRAGSCOPE_SOURCES_DOCUMENT_JSON_DOCUMENT_H_
#define FRAGSCOPE_SOURCES_DOCUMENT_JSON_DOCUMENT_H_

#include <string_view>

#include "fragscope/status.h"
#include "sources/document/document.h"
#include "sources/pickle/pickle_reader.h"
#include "sources/trace/input_stream.h"

namespace fragscope::sources {

Result<Document> ReadJsonDocument(InputStream& input, const PickleLimits& limits = {},
                                  const ProgressFn& progress = {});
Result<Document> ReadJsonDocumentBytes(std::string_view bytes, const PickleLimits& limits = {});

/// Which reader a file needs, from its first decoded bytes: JSON when the first byte that is
/// not whitespace is '{' or '[', else pickle.
enum class DocumentFormat { kPickle, kJson };
DocumentFormat DetectDocumentFormat(std::string_view first_bytes);

/// Opens `path` (plain, gzip or zstd), detects the format and reads it. Errors start with the
/// path: "PATH: byte N: ..." or "PATH: line L, column C: ...". A pickle is read with `sink`
/// (PickleListSink), JSON without.
Result<Document> ReadDocumentFile(const std::string& path, DocumentFormat* format = nullptr,
                                  const PickleLimits& limits = {}, const ProgressFn& progress = {},
                                  PickleListSink* sink = nullptr);

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_DOCUMENT_JSON_DOCUMENT_H_
