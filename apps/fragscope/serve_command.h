// `fragscope serve`: the node daemon. It receives agent samples on a Unix socket, keeps the
// latest per process and device, and publishes them with the node's GPU facts to Prometheus
// (HTTP /metrics, and/or node_exporter's textfile directory).
//
// The parts other subsystems plug in are the ServeHooks: where GPU facts come from (the NVML
// and /proc collectors), what to do with each accepted sample (history writes, alert rules),
// and a periodic tick (alert evaluation, retention).
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_SERVE_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_SERVE_COMMAND_H_

#include <functional>

#include "command.h"
#include "sources/agent/agent_registry.h"
#include "sources/agent/agent_sample.h"
#include "sources/gpu/gpu_info.h"

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

struct ServeHooks {
  /// The node's GPU facts, called once per --interval on the daemon's main thread. Unset: a
  /// provider that reports NVML as unavailable ("NVML collector not built yet").
  std::function<gpu::NodeGpuInfo()> gpu_provider;
  /// Each accepted sample, on the agent server's thread (keep it short: agents wait behind it).
  std::function<void(const agent::AgentSample&)> on_sample;
  /// Once per --interval on the main thread, after the GPU facts are refreshed, with the
  /// current registry (latest samples, counters).
  std::function<void(const agent::AgentRegistry&)> on_tick;
};

/// Registers `serve` on `app`. run() returns kExitOk after a clean shutdown (SIGINT/SIGTERM),
/// kExitBadInput for bad usage, kExitFailure when the socket or the port cannot be opened.
Command AddServeCommand(CLI::App& app, ServeHooks hooks = {});

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_SERVE_COMMAND_H_
