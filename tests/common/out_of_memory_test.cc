#include "common/out_of_memory.h"

#include <new>
#include <stdexcept>
#include <thread>

#include <gtest/gtest.h>

namespace fragscope {
namespace {

void ThrowFromAThread(void (*thrower)()) {
  std::thread t(thrower);
  t.join();
}

TEST(OutOfMemoryExitDeathTest, BadAllocEscapingAThreadIsExit2AndTheLine) {
  EXPECT_EXIT(
      {
        InstallOutOfMemoryExit("tool: out of memory");
        ThrowFromAThread([] { throw std::bad_alloc(); });
      },
      ::testing::ExitedWithCode(kOutOfMemoryExit), "^tool: out of memory\n$");
}

TEST(OutOfMemoryExitDeathTest, AnyOtherEscapingExceptionIsStillNamedWhenItAborts) {
  // Only std::bad_alloc becomes the one-line exit; anything else aborts, named by the
  // previous (libstdc++'s verbose) handler.
  EXPECT_DEATH(
      {
        InstallOutOfMemoryExit("tool: out of memory");
        ThrowFromAThread([] { throw std::runtime_error("the real cause"); });
      },
      "std::runtime_error.*the real cause");
}

}  // namespace
}  // namespace fragscope
