// Reports of `fragscope explain`: for each out-of-memory message found in a log, its figures,
// the verdict with the formula behind it, the stranded memory and the ranked remedies, and,
// when a trace or snapshot was replayed, what each allocator setting measured.
//
// JSON: schema "fragscope.explain" version 1 (docs/json-schema.md).
#ifndef FRAGSCOPE_SINKS_REPORT_EXPLAIN_REPORT_H_
#define FRAGSCOPE_SINKS_REPORT_EXPLAIN_REPORT_H_

#include <string>

#include "analysis/bfc_explain.h"
#include "analysis/explain.h"

namespace fragscope::sinks {

inline constexpr char kExplainSchemaName[] = "fragscope.explain";
inline constexpr int kExplainSchemaVersion = 1;

/// Plain text for a terminal (no colors).
std::string RenderExplainText(const analysis::ExplainReport& report);

/// One JSON document (indent 2), ending with a newline.
std::string RenderExplainJson(const analysis::ExplainReport& report);

/// The same two forms for a TensorFlow / JAX log (same schema: its errors carry "framework"
/// and BFC figures; docs/json-schema.md).
std::string RenderBfcExplainText(const analysis::BfcExplainReport& report);
std::string RenderBfcExplainJson(const analysis::BfcExplainReport& report);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_EXPLAIN_REPORT_H_
