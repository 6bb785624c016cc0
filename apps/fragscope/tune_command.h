// `fragscope tune TRACE --capacity SIZE`: replays a request trace under a grid of allocator
// settings in parallel and recommends the PYTORCH_CUDA_ALLOC_CONF that avoids an OOM with the
// lowest peak reserved memory. Wiring only: sources -> analysis::Tune -> text/JSON.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_TUNE_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_TUNE_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `tune` on `app`. Exit status: 0 when some setting runs without an OOM, 1 when
/// none does, 2 for bad input or usage.
Command AddTuneCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_TUNE_COMMAND_H_
