// `fragscope explain [FILE|-]`: reads a log or the pasted text of an out-of-memory error and
// says why it happened (fragmentation, shortage, other processes) and what to do, ranked;
// with --trace/--snapshot it replays the job's requests under each proposed allocator setting.
// Wiring only: sources::ReadOomText -> analysis::ExplainOom / VerifyRemedies -> text/JSON.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_EXPLAIN_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_EXPLAIN_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `explain` on `app`. Exit status: 0 when at least one message was explained, 2 when
/// no message was found or none had its figures, or for bad usage.
Command AddExplainCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_EXPLAIN_COMMAND_H_
