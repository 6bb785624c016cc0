// WriteTextfile (textfile.h).
#include "sinks/prometheus/textfile.h"

#include <fmt/format.h>

#include "common/safe_file.h"

namespace fragscope::sinks::prometheus {

Status WriteTextfile(const std::string& dir, std::string_view content) {
  // The file name is the daemon's choice, not the user's: a link planted there is refused, and
  // the temporary (a dot name ending in .tmp, which node_exporter does not read) is new each time.
  SafeFileOptions options;
  options.durable = true;
  options.mode = 0644;
  return WriteFileSafely(fmt::format("{}/{}", dir, kTextfileName), content,
                         OutputOrigin::kChosenByTool, options);
}

}  // namespace fragscope::sinks::prometheus
