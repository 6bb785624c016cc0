// The JSON report of `fragscope analyze --json`: the same content as the text report, in the
// stable schema "fragscope.analyze" version 1 that docs/json-schema.md documents key by key.
//
// Stability: keys are snake_case, byte values are integers and their keys end in _bytes (or
// sit under a "bytes" key), ratios are numbers in [0, 1]. Every key is always present; a value
// that does not apply (allocator numbers of a request trace, an extreme never reached, an
// unknown time) is null. Adding keys is compatible; renaming or removing one bumps
// schema_version.
//
// Thread safety: pure functions.
#ifndef FRAGSCOPE_SINKS_REPORT_JSON_REPORT_H_
#define FRAGSCOPE_SINKS_REPORT_JSON_REPORT_H_

#include <string>

#include "analysis/analysis_result.h"

namespace fragscope::sinks {

inline constexpr char kJsonSchemaName[] = "fragscope.analyze";
inline constexpr int kJsonSchemaVersion = 1;

struct JsonOptions {
  /// Spaces per indent level; -1 for one compact line.
  int indent = 2;
  /// false: "layout" is null (the map was not requested, e.g. `--no-map`).
  bool include_layout = true;
};

/// The report as one JSON document, ending with a newline.
std::string RenderJson(const analysis::AnalysisResult& result, const JsonOptions& options);
inline std::string RenderJson(const analysis::AnalysisResult& result) {
  return RenderJson(result, JsonOptions{});
}

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_JSON_REPORT_H_
