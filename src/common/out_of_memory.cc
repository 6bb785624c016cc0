// InstallOutOfMemoryExit (out_of_memory.h).
#include "common/out_of_memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <exception>
#include <new>

#include "common/safe_file.h"

namespace fragscope {
namespace {

// The line, written without allocating.
char g_message[1024];
std::size_t g_message_size = 0;

[[noreturn]] void ExitOutOfMemory() {
  RemoveTemporariesNow();
  std::size_t done = 0;
  while (done < g_message_size) {
    const ssize_t n = ::write(STDERR_FILENO, g_message + done, g_message_size - done);
    if (n <= 0) break;
    done += static_cast<std::size_t>(n);
  }
  ::_exit(kOutOfMemoryExit);
}

// operator new (on any thread) calls this when malloc fails, before it would throw.
void OnNewFailure() { ExitOutOfMemory(); }

std::terminate_handler g_previous_terminate = nullptr;

// std::bad_alloc thrown by code that allocates without operator new (realloc'd arenas) and
// escaping main, a thread or a noexcept function ends here.
void OnTerminate() {
  if (const std::exception_ptr current = std::current_exception()) {
    try {
      std::rethrow_exception(current);
    } catch (const std::bad_alloc&) {
      ExitOutOfMemory();
    } catch (...) {
    }
  }
  if (g_previous_terminate != nullptr) g_previous_terminate();
  std::abort();
}

}  // namespace

void InstallOutOfMemoryExit(std::string_view message) {
  const std::size_t n = std::min(message.size(), sizeof g_message - 1);
  std::copy_n(message.data(), n, g_message);
  g_message[n] = '\n';
  g_message_size = n + 1;
  std::set_new_handler(OnNewFailure);
  const std::terminate_handler previous = std::set_terminate(OnTerminate);
  if (previous != OnTerminate) g_previous_terminate = previous;
}

}  // namespace fragscope
