// How the `fragscope` CLI is put together: each subcommand lives in its own file and exposes
// one Add<Name>Command(app) function that registers its options on a CLI11 subcommand and
// returns a Command. main.cc adds them in the order `fragscope --help` lists them and runs the
// one that was parsed. Commands are wired explicitly (no static registration), as STYLE.md §2
// asks.
#ifndef FRAGSCOPE_APPS_FRAGSCOPE_COMMAND_H_
#define FRAGSCOPE_APPS_FRAGSCOPE_COMMAND_H_

#include <functional>

namespace CLI {
class App;
}  // namespace CLI

namespace fragscope::cli {

/// Process exit statuses shared by every subcommand.
inline constexpr int kExitOk = 0;
inline constexpr int kExitFailure = 1;   // the input was fine but something else failed (output)
inline constexpr int kExitBadInput = 2;  // bad input file or bad usage (CLI11's own errors too)

struct Command {
  CLI::App* app = nullptr;   // the subcommand; app->parsed() says whether it was chosen
  std::function<int()> run;  // runs it after parsing; returns the process exit status
};

}  // namespace fragscope::cli

#endif  // FRAGSCOPE_APPS_FRAGSCOPE_COMMAND_H_
