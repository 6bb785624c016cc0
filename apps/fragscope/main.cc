// fragscope: the command-line tool. A thin main: it parses the command line with CLI11 and
// runs the chosen subcommand; each subcommand's wiring lives in its own <name>_command.cc.
#include <sstream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "alerts_command.h"
#include "analyze_command.h"
#include "check_command.h"
#include "cli_util.h"
#include "command.h"
#include "common/out_of_memory.h"
#include "common/units.h"
#include "convert_command.h"
#include "diff_command.h"
#include "explain_command.h"
#include "gpus_command.h"
#include "history_command.h"
#include "probe_command.h"
#include "replay_command.h"
#include "report_command.h"
#include "serve_command.h"
#include "sources/budget.h"
#include "top_command.h"
#include "tune_command.h"

#ifndef FRAGSCOPE_VERSION
#define FRAGSCOPE_VERSION "unknown"
#endif

namespace {

constexpr char kIntro[] =
    "fragscope finds and explains GPU memory fragmentation in PyTorch's CUDA caching\n"
    "allocator: how much reserved memory sits unused, how scattered the free memory is,\n"
    "which gaps are too small to ever be used, and the largest allocation that would\n"
    "still succeed. It reads PyTorch memory snapshots (the .pickle of\n"
    "torch.cuda.memory._dump_snapshot, docs/snapshots.md), traces of allocator events\n"
    "or of requests (.jsonl, .gz, .zst; docs/formats.md), and the out-of-memory\n"
    "messages in logs (`fragscope explain`).\n";

constexpr char kMainFooter[] =
    "Run `fragscope COMMAND --help` for a command's options and examples.\n"
    "Control characters in what the input says (names, labels, paths, log text) are printed\n"
    "as \\xNN, so a file cannot drive the terminal (docs/user-guide.md, \"Terminal safety\").\n"
    "Docs: docs/user-guide.md (walkthrough), docs/metrics.md (every metric).";

}  // namespace

int main(int argc, char** argv) {
  using fragscope::cli::Command;
  // Out of memory is an exit with one line, never an abort (issue 30 item 6).
  {
    const fragscope::sources::UsableMemory usable = fragscope::sources::ProcessUsableMemory();
    fragscope::InstallOutOfMemoryExit(fmt::format(
        "fragscope: out of memory: an allocation failed{}; lower --max-memory (the input "
        "budgets, docs/user-guide.md \"Input budgets\") or give the process more memory",
        usable.bytes == 0 ? std::string()
                          : fmt::format(" (this process may use {} by {})",
                                        fragscope::FormatBytes(usable.bytes), usable.source)));
  }
  CLI::App app(kIntro, "fragscope");
  app.set_version_flag("--version", std::string("fragscope ") + FRAGSCOPE_VERSION);
  app.footer(kMainFooter);
  app.require_subcommand(1);

  std::vector<Command> commands;
  commands.push_back(fragscope::cli::AddAnalyzeCommand(app));
  commands.push_back(fragscope::cli::AddReplayCommand(app));
  commands.push_back(fragscope::cli::AddTuneCommand(app));
  commands.push_back(fragscope::cli::AddConvertCommand(app));
  commands.push_back(fragscope::cli::AddGpusCommand(app));
  commands.push_back(fragscope::cli::AddHistoryCommand(app));
  commands.push_back(fragscope::cli::AddCheckCommand(app));
  commands.push_back(fragscope::cli::AddServeCommand(app));
  commands.push_back(fragscope::cli::AddExplainCommand(app));
  commands.push_back(fragscope::cli::AddAlertsCommand(app));
  commands.push_back(fragscope::cli::AddReportCommand(app));
  commands.push_back(fragscope::cli::AddDiffCommand(app));
  commands.push_back(fragscope::cli::AddProbeCommand(app));
  commands.push_back(fragscope::cli::AddTopCommand(app));

  // Commands that read snapshots or traces take the input budgets (issue 24 item 1).
  for (const Command& command : commands) {
    const std::string& name = command.app->get_name();
    if (name == "analyze" || name == "replay" || name == "tune" || name == "convert" ||
        name == "check" || name == "explain" || name == "report" || name == "diff") {
      fragscope::cli::AddBudgetOptions(*command.app);
    }
  }
  if (argc <= 1) {
    // A bare `fragscope` lists the commands rather than CLI11's "a subcommand is required"; it
    // is still a usage error for a script that meant to run one.
    fragscope::cli::PrintSafe(stderr, app.help());
    return fragscope::cli::kExitBadInput;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // A mistyped command or option gets a suggestion instead of CLI11's own message.
    if (e.get_exit_code() != 0) {
      if (const std::string hint = fragscope::cli::UsageHint(app, argc, argv); !hint.empty()) {
        return fragscope::cli::BadInput(hint);
      }
    }
    // --help and --version exit 0; every usage error exits 2 whatever CLI11's own code is.
    // CLI11's messages quote the command line, so they go out with control characters escaped.
    std::ostringstream out;
    std::ostringstream err;
    const int code = app.exit(e, out, err);
    fragscope::cli::PrintSafe(stdout, out.str());
    fragscope::cli::PrintSafe(stderr, err.str());
    return code == 0 ? fragscope::cli::kExitOk : fragscope::cli::kExitBadInput;
  }
  for (const Command& command : commands) {
    if (command.app->parsed()) return command.run();
  }
  return fragscope::cli::kExitBadInput;  // unreachable: require_subcommand(1)
}
