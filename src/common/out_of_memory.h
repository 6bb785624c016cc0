// Running out of memory ends a command with exit 2 and one line, never an abort (issue 30 item
// 6). The input budgets (sources/budget.h) stop what they can foresee; anything else that
// cannot get memory — operator new on any thread, a realloc'd arena that throws std::bad_alloc,
// an exception that escapes a thread or a noexcept function — reaches this handler, which
// removes the temporaries of unfinished outputs (common/safe_file.h), writes one line to stderr
// and exits with status 2 at once: unwinding would need memory too.
//
// Thread safety: InstallOutOfMemoryExit is called once, from main, before other threads start.
#ifndef FRAGSCOPE_COMMON_OUT_OF_MEMORY_H_
#define FRAGSCOPE_COMMON_OUT_OF_MEMORY_H_

#include <string_view>

namespace fragscope {

/// Installs the handler. `message` is the whole line written on running out of memory (a
/// newline is added); it is copied now, since nothing may be allocated then. Later calls
/// replace the message.
void InstallOutOfMemoryExit(std::string_view message);

/// The exit status it ends the process with.
inline constexpr int kOutOfMemoryExit = 2;

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_OUT_OF_MEMORY_H_
