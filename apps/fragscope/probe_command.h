// `fragscope probe`: one status line of the node daemon's state for monitoring systems that run
// a plugin (Nagios-style: status, message, performance data; exit 0/1/2/3 for OK, WARNING,
// CRITICAL, UNKNOWN), or its JSON. Reads `fragscope serve`'s /metrics. docs/live-monitoring.md.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_PROBE_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_PROBE_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `probe` on `app`. run() returns 0 OK, 1 WARNING, 2 CRITICAL, 3 UNKNOWN (the
/// daemon cannot be reached or its answer cannot be read).
Command AddProbeCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_PROBE_COMMAND_H_
