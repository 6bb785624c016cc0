// node_exporter's textfile collector mode: the exposition written to DIR/fragscope.prom so a
// node_exporter started with --collector.textfile.directory=DIR publishes it. The file is
// replaced atomically (a new temporary file in DIR, fsync, rename, fsync of DIR: SafeFile,
// common/safe_file.h), so a reader never sees a half-written file and a crash leaves the
// previous one. A symbolic link at DIR/fragscope.prom is refused, never written through.
//
// Thread safety: one writer per directory.
#ifndef FRAGSCOPE_SINKS_PROMETHEUS_TEXTFILE_H_
#define FRAGSCOPE_SINKS_PROMETHEUS_TEXTFILE_H_

#include <string>
#include <string_view>

#include "fragscope/status.h"

namespace fragscope::sinks::prometheus {

inline constexpr char kTextfileName[] = "fragscope.prom";

/// Replaces `dir`/fragscope.prom with `content`. Errors name the file and the system's reason;
/// a link or a non-regular file there is kInvalidArgument.
Status WriteTextfile(const std::string& dir, std::string_view content);

}  // namespace fragscope::sinks::prometheus

#endif  // FRAGSCOPE_SINKS_PROMETHEUS_TEXTFILE_H_
