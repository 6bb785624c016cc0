// kill -9 at any moment loses no committed sample and leaves a readable database (issue 6,
// item 5). A child process appends batches of samples in a loop and, after each commit, writes
// the batch number to a pipe; the parent SIGKILLs it after a random delay, reopens the history
// and checks integrity_check and that every batch reported committed is there, whole.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "sinks/history/history_store.h"
#include "testing/test_util.h"

namespace fragscope::sinks {
namespace {

constexpr int kBatch = 25;

HistoryOptions ChildOptions(bool sync_full) {
  HistoryOptions o;
  o.sync_full = sync_full;
  o.retention.max_age_s = 0;  // keep everything: a missing row must mean a lost row
  o.retention.max_rows = 0;
  return o;
}

// The child: never returns.
[[noreturn]] void AppendUntilKilled(const std::string& path, const std::string& run, bool sync_full,
                                    int report_fd) {
  Result<std::unique_ptr<HistoryStore>> store = HistoryStore::Open(path, ChildOptions(sync_full));
  if (!store.ok()) _exit(3);
  std::vector<agent::AgentSample> batch(kBatch);
  for (std::int64_t n = 0; n < 1'000'000; ++n) {
    for (int i = 0; i < kBatch; ++i) {
      agent::AgentSample& s = batch[static_cast<std::size_t>(i)];
      s.run = run;
      s.pid = static_cast<std::uint32_t>(getpid());
      s.rank = i;
      s.device_uuid = "GPU-kill";
      s.step = n;
      s.free_block_count[static_cast<std::size_t>(i % 64)] = static_cast<std::uint64_t>(n);
    }
    if (!(*store)->AppendSamples(batch, n).ok()) _exit(4);
    if (write(report_fd, &n, sizeof n) != sizeof n) _exit(5);
  }
  _exit(0);
}

TEST(HistoryKillTest, KillNineLosesNoCommittedBatch) {
  const std::string path = testing::MakeTempDir() + "/history.sqlite";
  const unsigned seed =
      static_cast<unsigned>(std::chrono::steady_clock::now().time_since_epoch().count());
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937 rng(seed);
  constexpr int kIterations = 12;
  std::vector<std::int64_t> committed(kIterations, -1);  // last batch reported per iteration

  for (int it = 0; it < kIterations; ++it) {
    const std::string run = "kill-" + std::to_string(it);
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      AppendUntilKilled(path, run, it % 2 == 0, fds[1]);
    }
    close(fds[1]);
    // The first iteration may kill the child while it creates the database.
    const int max_ms = it == 0 ? 15 : 120;
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::uniform_int_distribution<int>(1, max_ms)(rng)));
    ASSERT_EQ(kill(pid, SIGKILL), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFSIGNALED(status)) << "child exited early with " << WEXITSTATUS(status);
    std::int64_t n = -1;
    std::int64_t last = -1;
    ssize_t got;
    while ((got = read(fds[0], &n, sizeof n)) == sizeof n) {
      EXPECT_EQ(n, last + 1);
      last = n;
    }
    close(fds[0]);
    committed[static_cast<std::size_t>(it)] = last;

    // Reopen as the next writer would, then check every iteration so far.
    Result<std::unique_ptr<HistoryStore>> store = HistoryStore::Open(path, ChildOptions(true));
    ASSERT_TRUE(store.ok()) << store.status().ToString();
    ASSERT_TRUE((*store)->IntegrityCheck().ok());
    for (int j = 0; j <= it; ++j) {
      const std::string rj = "kill-" + std::to_string(j);
      Result<std::vector<ReceivedSample>> samples = (*store)->Samples({.run = rj, .job = ""});
      ASSERT_TRUE(samples.ok()) << samples.status().ToString();
      // Whole batches only (a batch is one transaction), and at least every reported one.
      ASSERT_EQ(samples->size() % kBatch, 0u) << rj;
      const std::int64_t batches = static_cast<std::int64_t>(samples->size() / kBatch);
      EXPECT_GE(batches, committed[static_cast<std::size_t>(j)] + 1) << rj;
      // At most one batch committed but not yet reported when the kill came.
      EXPECT_LE(batches, committed[static_cast<std::size_t>(j)] + 2) << rj;
      for (std::size_t k = 0; k < samples->size(); ++k) {
        const agent::AgentSample& s = (*samples)[k].sample;
        ASSERT_EQ(s.step, static_cast<std::int64_t>(k / kBatch)) << rj;
        ASSERT_EQ(s.free_block_count[static_cast<std::size_t>(s.rank % 64)],
                  static_cast<std::uint64_t>(s.step));
      }
    }
  }
  // The test must have actually killed writers mid-stream, not only before their first commit.
  std::int64_t total = 0;
  std::string per_iteration;
  for (std::int64_t c : committed) {
    total += c + 1;
    per_iteration += " " + std::to_string(c + 1);
  }
  std::printf("batches reported committed per iteration:%s\n", per_iteration.c_str());
  EXPECT_GT(total, 0);
}

}  // namespace
}  // namespace fragscope::sinks
