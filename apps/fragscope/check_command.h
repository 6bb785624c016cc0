// `fragscope check INPUT`: a CI gate on a run's memory behaviour. Analyzes (or, for a request
// trace, replays) INPUT, checks it against the given limits, the forecast and the baseline
// runs in the history, and exits 1 when a check fails. Wiring only: the checks are
// analysis::CheckDevice, the report sinks::RenderCheck*.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_CHECK_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_CHECK_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `check` on `app`. Exit status: 0 all checks pass, 1 one fails, 2 bad input/usage.
Command AddCheckCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_CHECK_COMMAND_H_
