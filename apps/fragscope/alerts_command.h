// `fragscope alerts check CONFIG` and `fragscope alerts test CONFIG --sample JSON`: validate
// the node daemon's alert rules file, and try its rules and hooks on a hand-written sample.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_ALERTS_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_ALERTS_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `alerts` (with `check` and `test`) on `app`. run() returns kExitOk when the
/// config is valid (check) or every hook delivery succeeded (test), kExitBadInput for a bad
/// config, sample or usage, kExitFailure when a hook failed.
Command AddAlertsCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_ALERTS_COMMAND_H_
