// `fragscope replay TRACE --capacity SIZE`: replays a request trace through the caching-
// allocator simulator on a virtual GPU and reports whether and where it runs out of memory,
// then analyzes the simulated allocator trace. Wiring only: sources -> sim -> analysis -> sinks.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_REPLAY_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_REPLAY_COMMAND_H_

#include "command.h"
#include "pipeline/replay.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `replay` on `app`. Exit status: 0 when the trace replays without an OOM, 1 when
/// it runs out of memory (the report says where), 2 for bad input or usage.
Command AddReplayCommand(CLI::App& app);

/// The pipeline's replay entry point (pipeline/replay.h), under the names the commands that
/// build on `replay` use (`check`, `report`).
using ReplayRequest = pipeline::ReplayRequest;
using ReplayRun = pipeline::ReplayRun;
using pipeline::ReplayInput;

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_REPLAY_COMMAND_H_
