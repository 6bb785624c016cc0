// `fragscope top`: a live terminal view of the node daemon's processes, worst first, from its
// process API (GET /api/v1/processes); `--once` prints one frame for scripts.
// docs/live-monitoring.md, "fragscope top".
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_TOP_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_TOP_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `top` on `app`. run() returns 0 after q (or a frame printed with --once), 1 when
/// --once cannot read the daemon, 2 for bad usage, 128 + the signal after SIGINT/SIGTERM.
Command AddTopCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_TOP_COMMAND_H_
