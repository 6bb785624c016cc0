// WriteDocumentJson: a Document as plain JSON, for scripts (`fragscope convert --to json`).
// dicts -> objects (a key that is not a string is written as its JSON text: 1 -> "1"), lists
// and tuples -> arrays, bytes -> {"__bytes_hex__": "..."}, big ints -> their decimal digits as
// a number, NaN and infinities -> null. Strings are written as found; invalid UTF-8 bytes
// become U+FFFD.
//
// Shared objects are written out at each reference, as Python's json.dump would. A hostile
// file can make that exponential (a list holding the same list twice, 60 times over) or
// circular, so the walk is iterative and bounded: `max_depth` nesting and `max_output_bytes`
// of output; exceeding either is kLimitExceeded, naming the limit (and the flag that raises the
// output budget).
//
// Thread safety: reads the Document only.
#ifndef FRAGSCOPE_SOURCES_DOCUMENT_DOCUMENT_JSON_H_
#define FRAGSCOPE_SOURCES_DOCUMENT_DOCUMENT_JSON_H_

#include <cstdint>
#include <functional>
#include <string_view>

#include "fragscope/status.h"
#include "sources/document/document.h"

namespace fragscope::sources {

struct DocumentJsonLimits {
  std::uint32_t max_depth = 1000;
  /// 0 = OutputBudgetFor(doc.input_bytes()) (sources/budget.h: 1024 x the decoded input, at
  /// least 256 MiB, or --max-output). Checked before each write, so no more is ever written.
  std::uint64_t max_output_bytes = 0;
};

Status WriteDocumentJson(const Document& doc, const std::function<Status(std::string_view)>& write,
                         const DocumentJsonLimits& limits = {});

}  // namespace fragscope::sources

#endif  // FRAGSCOPE_SOURCES_DOCUMENT_DOCUMENT_JSON_H_
