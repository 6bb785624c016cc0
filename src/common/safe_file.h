// Writing a file safely: SafeFile and WriteFileSafely, the one way fragscope creates an output
// file (convert, report, replay --emit, the daemon's textfile, anything else). The bytes go to a
// new temporary file in the target's directory, created with O_CREAT|O_EXCL|O_NOFOLLOW under a
// random name (so a planted file or link there is never opened), and are renamed onto the target
// only when complete. A reader sees the old file or the whole new one; a failure, an early return
// or SIGINT/SIGTERM/SIGHUP leaves no temporary behind (issue 24 item 4).
//
// Links at the target (docs/user-guide.md, "Files and links"):
//   * a path fragscope chose itself (a default name, a file inside a directory it was given, a
//     temporary) that is a symbolic link is refused: nothing is written through it;
//   * a path the user named (-o OUT, --emit OUT) that is a symbolic link to an existing regular
//     file is followed once, because the user named it: the file it points to is replaced (the
//     temporary is made in that file's directory) and the link stays. A link to nothing is
//     refused: fragscope never creates a link's target.
//   * a target that exists and is not a regular file (a directory, FIFO, device) is refused.
//
// Thread safety: a SafeFile is used by one thread at a time; distinct SafeFiles may be used
// from distinct threads.
#ifndef FRAGSCOPE_COMMON_SAFE_FILE_H_
#define FRAGSCOPE_COMMON_SAFE_FILE_H_

#include <memory>
#include <string>
#include <string_view>

#include "fragscope/status.h"

namespace fragscope {

/// Who chose an output path; decides what a symbolic link there means (see the file comment).
enum class OutputOrigin {
  kNamedByUser,   // given on the command line as the output (-o OUT, --emit OUT)
  kChosenByTool,  // a default name, a file inside a directory, a temporary
};

struct SafeFileOptions {
  /// fsync the file before the rename and its directory after it (the daemon's textfile: a
  /// crash leaves the old or the new file, never an empty one).
  bool durable = false;
  /// Permission bits of the new file, before the umask.
  unsigned mode = 0666;
};

/// An output file being written. Nothing appears at the target until Commit() succeeds.
class SafeFile {
 public:
  /// Checks the target (links, file type, as in the file comment) and creates the temporary.
  /// Errors: kInvalidArgument for a refused target (a link, not a regular file), naming the
  /// path and why; kNotFound/kIoError when the temporary cannot be created (no such
  /// directory, no permission), naming the directory.
  static Result<std::unique_ptr<SafeFile>> Create(const std::string& path, OutputOrigin origin,
                                                  const SafeFileOptions& options = {});
  /// Unless committed: closes and removes the temporary.
  ~SafeFile();
  SafeFile(const SafeFile&) = delete;
  SafeFile& operator=(const SafeFile&) = delete;

  /// Writes all of `data`. Errors name the output path.
  Status Write(std::string_view data);
  /// Closes the temporary (fsync first when durable) and renames it onto the target. After a
  /// failure the temporary is gone and the target is as it was.
  Status Commit();
  /// Removes the temporary now (as the destructor would).
  void Abandon();

  /// The path as given.
  const std::string& path() const { return path_; }
  /// Where the rename goes: path(), or the file a user-named link points to.
  const std::string& target() const { return target_; }
  const std::string& temp_path() const { return temp_; }

 private:
  SafeFile(std::string path, std::string target, std::string temp, int fd, int slot,
           SafeFileOptions options);

  std::string path_;
  std::string target_;
  std::string temp_;
  int fd_;
  int slot_;  // in the signal handler's table of temporaries; -1 when not registered
  SafeFileOptions options_;
  bool done_ = false;
};

/// Removes every temporary a live SafeFile holds, at once; async-signal-safe. For paths that end
/// the process without unwinding (a fatal signal, running out of memory: common/out_of_memory.h).
void RemoveTemporariesNow();

/// Replaces `path` with `content` through a SafeFile. Errors as SafeFile's.
Status WriteFileSafely(const std::string& path, std::string_view content, OutputOrigin origin,
                       const SafeFileOptions& options = {});

/// What is at `path` now, for messages and checks: OK when nothing or a regular file is there,
/// kInvalidArgument naming a symbolic link (and what it points to) or another kind of file.
/// `what` starts the message ("history"); callers add what to do. Does not follow a link.
Status RefuseLinkOrSpecial(const std::string& path, std::string_view what);

}  // namespace fragscope

#endif  // FRAGSCOPE_COMMON_SAFE_FILE_H_
