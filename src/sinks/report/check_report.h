// Reports of `fragscope check`: one screen of text (the verdict first, then one line per check
// and device, the failures explained) or JSON (schema "fragscope.check" version 1,
// docs/json-schema.md).
#ifndef FRAGSCOPE_SINKS_REPORT_CHECK_REPORT_H_
#define FRAGSCOPE_SINKS_REPORT_CHECK_REPORT_H_

#include <string>

#include "analysis/check.h"

namespace fragscope::sinks {

inline constexpr char kCheckSchemaName[] = "fragscope.check";
inline constexpr int kCheckSchemaVersion = 1;

std::string RenderCheckText(const analysis::CheckResult& result, bool color);
std::string RenderCheckJson(const analysis::CheckResult& result);

}  // namespace fragscope::sinks

#endif  // FRAGSCOPE_SINKS_REPORT_CHECK_REPORT_H_
