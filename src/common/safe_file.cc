// SafeFile (safe_file.h).
#include "common/safe_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include <fmt/format.h>
#include <sys/random.h>
#include <sys/stat.h>

namespace fragscope {

// ---- Temporaries removed on a fatal signal ----------------------------------------------------

namespace {

// The handler may only call async-signal-safe functions, so the live temporaries sit in a fixed
// table of plain character arrays. A slot is claimed (kClaimed), filled, then published
// (kReady); the handler unlinks only published slots. More temporaries at once than slots are
// still removed on every ordinary exit path, only not on a signal.
constexpr int kTempSlots = 32;
constexpr int kFree = 0, kClaimed = 1, kReady = 2;

struct TempSlot {
  std::atomic<int> state{kFree};
  char path[PATH_MAX];
};

std::array<TempSlot, kTempSlots> g_temp_slots;

}  // namespace

void RemoveTemporariesNow() {
  for (TempSlot& slot : g_temp_slots) {
    if (slot.state.load() == kReady) ::unlink(slot.path);
  }
}

namespace {

void UnlinkTempsOnSignal(int sig) {
  RemoveTemporariesNow();
  // Then die of the signal as if there were no handler (the shell sees 128 + sig).
  struct sigaction dfl;
  std::memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  ::sigaction(sig, &dfl, nullptr);
  ::raise(sig);  // blocked while this handler runs; delivered when it returns
}

// Installs the handler for the signals that end a CLI run, only where nobody else handles them
// (the daemon takes SIGINT/SIGTERM with sigtimedwait and keeps doing so).
void InstallSignalCleanup() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old;
      if (::sigaction(sig, nullptr, &old) != 0) continue;
      if ((old.sa_flags & SA_SIGINFO) != 0 || old.sa_handler != SIG_DFL) continue;
      struct sigaction act;
      std::memset(&act, 0, sizeof act);
      act.sa_handler = UnlinkTempsOnSignal;
      sigemptyset(&act.sa_mask);
      ::sigaction(sig, &act, nullptr);
    }
  });
}

int RegisterTemp(const std::string& path) {
  if (path.size() >= PATH_MAX) return -1;
  for (int i = 0; i < kTempSlots; ++i) {
    TempSlot& slot = g_temp_slots[static_cast<std::size_t>(i)];
    int expected = kFree;
    if (!slot.state.compare_exchange_strong(expected, kClaimed)) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.state.store(kReady);
    return i;
  }
  return -1;
}

void UnregisterTemp(int i) {
  if (i >= 0) g_temp_slots[static_cast<std::size_t>(i)].state.store(kFree);
}

// ---- Names ------------------------------------------------------------------------------------

std::string DirName(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

std::string BaseName(const std::string& path) {
  const std::size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

std::string RandomSuffix() {
  std::uint64_t bits = 0;
  if (::getrandom(&bits, sizeof bits, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof bits)) {
    // No entropy yet (early boot): O_EXCL still makes a guessed name harmless, only retried.
    static std::atomic<std::uint64_t> counter{0};
    bits = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()) ^
           (static_cast<std::uint64_t>(::getpid()) << 32) ^ (counter++ * 0x9e3779b97f4a7c15ULL);
  }
  return fmt::format("{:012x}", bits & 0xffffffffffffULL);
}

std::string ReadLinkText(const std::string& path) {
  char buf[PATH_MAX];
  const ssize_t n = ::readlink(path.c_str(), buf, sizeof buf - 1);
  if (n < 0) return "?";
  return std::string(buf, static_cast<std::size_t>(n));
}

const char* KindName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// Where a SafeFile for `path` renames to, or why it may not.
Result<std::string> ResolveTarget(const std::string& path, OutputOrigin origin) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return path;  // a new file; its directory is checked by the open
    return Status::IoError(fmt::format("{}: cannot check it: {}", path, std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode)) return path;
  if (!S_ISLNK(st.st_mode)) {
    return Status::InvalidArgument(
        fmt::format("{}: exists and is {}; refusing to replace it", path, KindName(st.st_mode)));
  }
  const std::string points_to = ReadLinkText(path);
  if (origin == OutputOrigin::kChosenByTool) {
    return Status::InvalidArgument(fmt::format(
        "{}: is a symbolic link (to {}); fragscope does not write through a link at a path it "
        "chose itself: remove the link, or name the output explicitly (docs/user-guide.md, "
        "\"Files and links\")",
        path, points_to));
  }
  char resolved[PATH_MAX];
  if (::realpath(path.c_str(), resolved) == nullptr) {
    return Status::InvalidArgument(fmt::format(
        "{}: is a symbolic link to {}, which does not exist; fragscope does not create a link's "
        "target: remove the link or name another output",
        path, points_to));
  }
  struct stat target_st;
  if (::stat(resolved, &target_st) != 0 || !S_ISREG(target_st.st_mode)) {
    return Status::InvalidArgument(
        fmt::format("{}: is a symbolic link to {}, which is {}; refusing to replace it", path,
                    resolved, KindName(target_st.st_mode)));
  }
  return std::string(resolved);
}

}  // namespace

// ---- SafeFile ---------------------------------------------------------------------------------

Result<std::unique_ptr<SafeFile>> SafeFile::Create(const std::string& path, OutputOrigin origin,
                                                   const SafeFileOptions& options) {
  if (path.empty()) return Status::InvalidArgument("the output path is empty");
  Result<std::string> target = ResolveTarget(path, origin);
  if (!target.ok()) return target.status();
  const std::string dir = DirName(*target);
  const std::string base = BaseName(*target);
  InstallSignalCleanup();
  // A dot name ending in .tmp: invisible to `ls`, and to node_exporter (it reads *.prom only).
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string temp = fmt::format("{}/.{}.{}.tmp", dir, base, RandomSuffix());
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                          static_cast<mode_t>(options.mode));
    if (fd >= 0) {
      // Listed for the signal handler only once it is ours: a name that failed with EEXIST
      // belongs to someone else and must never be removed. (A signal between the two calls
      // leaves this temporary behind: a dot file, never the output.)
      const int slot = RegisterTemp(temp);
      return std::unique_ptr<SafeFile>(
          new SafeFile(path, std::move(*target), std::move(temp), fd, slot, options));
    }
    const int err = errno;
    if (err == EEXIST) continue;  // a name someone else holds: never opened, another is drawn
    if (err == ENOENT) {
      return Status::NotFound(fmt::format("{}: cannot create: no such directory {}", path, dir));
    }
    return Status::IoError(
        fmt::format("{}: cannot create a file in {}: {}", path, dir, std::strerror(err)));
  }
  return Status::IoError(fmt::format("{}: cannot find a free temporary name in {}", path, dir));
}

SafeFile::SafeFile(std::string path, std::string target, std::string temp, int fd, int slot,
                   SafeFileOptions options)
    : path_(std::move(path)),
      target_(std::move(target)),
      temp_(std::move(temp)),
      fd_(fd),
      slot_(slot),
      options_(options) {}

SafeFile::~SafeFile() { Abandon(); }

void SafeFile::Abandon() {
  if (done_) return;
  done_ = true;
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(temp_.c_str());
  UnregisterTemp(slot_);
}

Status SafeFile::Write(std::string_view data) {
  if (done_) return Status::InvalidArgument(fmt::format("{}: write after commit", path_));
  while (!data.empty()) {
    const ssize_t put = ::write(fd_, data.data(), data.size());
    if (put < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(fmt::format("{}: write failed: {}", path_, std::strerror(errno)));
    }
    data.remove_prefix(static_cast<std::size_t>(put));
  }
  return Status::Ok();
}

Status SafeFile::Commit() {
  if (done_) return Status::InvalidArgument(fmt::format("{}: committed twice", path_));
  auto fail = [&](std::string_view what, int err) {
    Abandon();
    return Status::IoError(fmt::format("{}: {}: {}", path_, what, std::strerror(err)));
  };
  if (options_.durable && ::fsync(fd_) != 0) return fail("fsync failed", errno);
  const int fd = fd_;
  fd_ = -1;
  // close() reports delayed write errors (NFS, quota), so its result matters.
  if (::close(fd) != 0) return fail("close failed", errno);
  // rename() replaces the directory entry and never follows a link there: if one was planted
  // since Create() looked, the link is replaced, not written through.
  if (::rename(temp_.c_str(), target_.c_str()) != 0) {
    return fail(fmt::format("cannot rename {} to {}", temp_, target_), errno);
  }
  done_ = true;
  UnregisterTemp(slot_);
  if (options_.durable) {
    // The rename itself is durable only once the directory is synced.
    const int dir_fd = ::open(DirName(target_).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dir_fd >= 0) {
      ::fsync(dir_fd);
      ::close(dir_fd);
    }
  }
  return Status::Ok();
}

Status WriteFileSafely(const std::string& path, std::string_view content, OutputOrigin origin,
                       const SafeFileOptions& options) {
  Result<std::unique_ptr<SafeFile>> file = SafeFile::Create(path, origin, options);
  if (!file.ok()) return file.status();
  FRAGSCOPE_RETURN_IF_ERROR((*file)->Write(content));
  return (*file)->Commit();
}

Status RefuseLinkOrSpecial(const std::string& path, std::string_view what) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return Status::IoError(
        fmt::format("{} {}: cannot check it: {}", what, path, std::strerror(errno)));
  }
  if (S_ISREG(st.st_mode)) return Status::Ok();
  if (S_ISLNK(st.st_mode)) {
    return Status::InvalidArgument(
        fmt::format("{} {}: is a symbolic link (to {})", what, path, ReadLinkText(path)));
  }
  return Status::InvalidArgument(
      fmt::format("{} {}: exists and is {}", what, path, KindName(st.st_mode)));
}

}  // namespace fragscope
