// `fragscope gpus`: what this node knows about its GPUs from outside any process — NVML
// (memory totals, BAR1, compute processes, MIG) joined with /proc/driver/nvidia by UUID.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_GPUS_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_GPUS_COMMAND_H_

#include "command.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Registers `gpus` on `app`. run() returns kExitOk when the report was printed (also when
/// neither NVML nor /proc/driver/nvidia is available: that is reported, not an error),
/// kExitBadInput when a path given with --nvml-lib or --proc-root cannot be opened,
/// kExitFailure when stdout cannot be written.
Command AddGpusCommand(CLI::App& app);

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_GPUS_COMMAND_H_
