// `fragscope convert INPUT -o OUT`: a snapshot or a trace to our trace format (allocator or
// request events), to Perfetto/Chrome trace JSON, or (snapshots) to plain JSON.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_CONVERT_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_CONVERT_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `convert` on `app`. run() returns kExitOk when OUT was written, kExitBadInput for
/// bad input or usage, kExitFailure when the output could not be written (nothing is left
/// under OUT's name then).
Command AddConvertCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_CONVERT_COMMAND_H_
