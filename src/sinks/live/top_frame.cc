// TopFrame (top_frame.h): sorting, column layout, rows, sparklines and the one-process map.
#include "sinks/live/top_frame.h"

#include <algorithm>
#include <cmath>
#include <functional>

#include <fmt/format.h>

#include "common/terminal_text.h"

namespace fragscope::sinks::live {
namespace {

// ---- Text cells -------------------------------------------------------------------------

// Columns a terminal-safe string takes, counted as code points (top_frame.h).
std::size_t Columns(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

// `s` cut to `width` columns (an ellipsis marks a cut) and padded to it.
std::string Fit(std::string_view s, std::size_t width, bool right, bool utf8) {
  std::string out;
  if (Columns(s) > width) {
    if (width == 0) return out;
    std::size_t kept = 0;
    for (std::size_t i = 0; i < s.size(); ++i) {
      const bool lead = (static_cast<unsigned char>(s[i]) & 0xc0) != 0x80;
      if (lead && ++kept > width - 1) break;
      out += s[i];
    }
    out += utf8 ? "\u2026" : "~";
    return out;
  }
  const std::string pad(width - Columns(s), ' ');
  return right ? pad + std::string(s) : std::string(s) + pad;
}

// SGR codes.
constexpr std::string_view kBold = "1", kDim = "2", kReverse = "7", kRed = "31", kGreen = "32",
                           kYellow = "33", kCyan = "36", kBoldRed = "1;31";

std::string Paint(std::string_view text, std::string_view sgr, bool color) {
  if (!color || sgr.empty()) return std::string(text);
  return fmt::format("\x1b[{}m{}\x1b[0m", sgr, text);
}

std::string_view LevelColor(RiskLevel level) {
  switch (level) {
    case RiskLevel::kCritical:
      return kBoldRed;
    case RiskLevel::kWarning:
      return kRed;
    case RiskLevel::kWatch:
      return kYellow;
    case RiskLevel::kOk:
      return kGreen;
    case RiskLevel::kUnknown:
      break;
  }
  return kDim;
}

std::string Safe(std::string_view s) { return TerminalSafe(s); }

std::string Percent(std::optional<double> v) {
  if (!v) return "-";
  if (*v > 0 && *v < 0.01) return "<1%";
  return fmt::format("{:.0f}%", *v * 100);
}

// ---- Sorting ----------------------------------------------------------------------------

// Worst first: level, then P(OOM), then fewest steps to OOM, then most reserved.
bool WorseThan(const ProcessRow& a, const ProcessRow& b) {
  if (a.level != b.level) return a.level > b.level;
  if (a.oom_risk.value_or(-1) != b.oom_risk.value_or(-1)) {
    return a.oom_risk.value_or(-1) > b.oom_risk.value_or(-1);
  }
  if (a.steps_to_oom.has_value() != b.steps_to_oom.has_value()) return a.steps_to_oom.has_value();
  if (a.steps_to_oom && *a.steps_to_oom != *b.steps_to_oom) {
    return *a.steps_to_oom < *b.steps_to_oom;
  }
  if (a.reserved_bytes != b.reserved_bytes) return a.reserved_bytes > b.reserved_bytes;
  return a.id < b.id;
}

double SortValue(const ProcessRow& r, TopSort sort) {
  switch (sort) {
    case TopSort::kReserved:
      return static_cast<double>(r.reserved_bytes);
    case TopSort::kAllocated:
      return static_cast<double>(r.allocated_bytes);
    case TopSort::kFragmentation:
      return r.fragmentation_ratio.value_or(-1);
    case TopSort::kRisk:
      return r.oom_risk.value_or(-1);
    case TopSort::kLevel:
      break;
  }
  return 0;
}

// ---- Columns ------------------------------------------------------------------------------

struct Column {
  std::string_view header;
  std::size_t width;  // the minimum; the job column and the sparkline grow
  bool right;
  int drop;  // dropped in increasing order when the width is short; 0: never
};

enum ColumnId {
  kJob,
  kRank,
  kPid,
  kHost,
  kGpu,
  kStep,
  kRes,
  kAlloc,
  kFrag,
  kFreeReq,
  kRisk,
  kLevel,
  kSteps,
  kTrend,
  kColumnCount
};

constexpr Column kColumns[kColumnCount] = {
    {"JOB", 6, false, 0},  {"RANK", 4, true, 7},      {"PID", 7, true, 6},  {"HOST", 10, false, 1},
    {"GPU", 3, true, 2},   {"STEP", 7, true, 3},      {"RESV", 4, true, 0}, {"ALLOC", 5, true, 5},
    {"FRAG", 4, true, 10}, {"FREE/REQ", 10, true, 9}, {"P100", 4, true, 0}, {"LEVEL", 8, false, 0},
    {"STEPS", 5, true, 8}, {"TREND", 8, false, 4},
};

constexpr std::size_t kReadableJobWidth = 12;
constexpr std::size_t kMaxJobWidth = 24;
constexpr std::size_t kMaxTrendWidth = 32;

// Widths of the shown columns (0: dropped) for `width` terminal columns; the first two columns
// of a line are the selection mark and a space.
std::vector<std::size_t> Layout(int width) {
  std::vector<std::size_t> w(kColumnCount);
  for (int c = 0; c < kColumnCount; ++c) w[static_cast<std::size_t>(c)] = kColumns[c].width;
  const auto total = [&w] {
    std::size_t t = 2, shown = 0;
    for (std::size_t x : w) {
      t += x;
      shown += x > 0;
    }
    return t + (shown > 0 ? shown - 1 : 0);
  };
  const std::size_t room = static_cast<std::size_t>(std::max(width, 1));
  for (int drop = 1; total() > room && drop <= 10; ++drop) {
    for (int c = 0; c < kColumnCount; ++c) {
      if (kColumns[c].drop == drop) w[static_cast<std::size_t>(c)] = 0;
    }
  }
  // Room left over: job names readable first, then a longer trend, then longer job names.
  const auto grow = [&](std::size_t column, std::size_t up_to) {
    if (w[column] > 0 && total() < room && w[column] < up_to) {
      w[column] += std::min(room - total(), up_to - w[column]);
    }
  };
  grow(kJob, kReadableJobWidth);
  grow(kTrend, kMaxTrendWidth);
  grow(kJob, kMaxJobWidth);
  return w;
}

std::string Sparkline(const ProcessRow& r, std::size_t width, bool utf8) {
  static constexpr std::string_view kBlocks[] = {"\u2581", "\u2582", "\u2583", "\u2584",
                                                 "\u2585", "\u2586", "\u2587", "\u2588"};
  static constexpr std::string_view kAscii = "_.:-=+*#";
  const std::size_t n = std::min(width, r.history.size());
  std::uint64_t top = 0;
  for (std::size_t i = r.history.size() - n; i < r.history.size(); ++i) {
    top = std::max({top, r.history[i].reserved_bytes, r.history[i].allocated_bytes});
  }
  std::string out(width - n, ' ');
  for (std::size_t i = r.history.size() - n; i < r.history.size(); ++i) {
    // Allocated against the most reserved in the window: how full the process keeps its cache.
    const double f =
        top == 0 ? 0 : static_cast<double>(r.history[i].allocated_bytes) / static_cast<double>(top);
    const auto k = static_cast<std::size_t>(std::clamp(std::lround(f * 7), 0L, 7L));
    if (utf8) {
      out += kBlocks[k];
    } else {
      out += kAscii[k];
    }
  }
  return out;
}

std::string Cell(const ProcessRow& r, int column, std::size_t width, bool utf8) {
  switch (column) {
    case kJob:
      return Safe(r.job.empty() ? "-" : r.job);
    case kRank:
      return r.rank >= 0 ? fmt::format("{}", r.rank) : "-";
    case kPid:
      return fmt::format("{}", r.pid);
    case kHost:
      return Safe(r.host);
    case kGpu:
      return r.device_index >= 0 ? fmt::format("{}", r.device_index) : "-";
    case kStep:
      return r.step >= 0 ? fmt::format("{}", r.step) : "-";
    case kRes:
      return CompactBytes(r.reserved_bytes);
    case kAlloc:
      return CompactBytes(r.allocated_bytes);
    case kFrag:
      return Percent(r.fragmentation_ratio);
    case kFreeReq: {
      const std::string free =
          r.largest_free_block_bytes ? CompactBytes(*r.largest_free_block_bytes) : "-";
      const std::string req =
          r.largest_request_bytes ? CompactBytes(*r.largest_request_bytes) : "-";
      // '!': the largest request would not fit in the largest free block.
      const bool short_block = r.largest_free_block_bytes && r.largest_request_bytes &&
                               *r.largest_request_bytes > *r.largest_free_block_bytes;
      return fmt::format("{}/{}{}", free, req, short_block ? "!" : "");
    }
    case kRisk:
      return Percent(r.oom_risk);
    case kLevel:
      return std::string(RiskLevelName(r.level));
    case kSteps:
      if (!r.steps_to_oom) return "-";
      return *r.steps_to_oom < 100000 ? fmt::format("{}", *r.steps_to_oom)
                                      : fmt::format("{}k", *r.steps_to_oom / 1000);
    case kTrend:
      return Sparkline(r, width, utf8);
    default:
      return "";
  }
}

std::string Title(const ProcessList& list, const TopView& view, std::size_t shown) {
  std::string title = "fragscope top - ";
  if (!list.host.empty()) title += Safe(list.host) + " - ";  // empty: nothing read yet
  title +=
      fmt::format("{} process{}", list.processes.size(), list.processes.size() == 1 ? "" : "es");
  if (shown != list.processes.size()) title += fmt::format(" ({} shown)", shown);
  title += fmt::format(" - sort: {}", TopSortName(view.sort));
  if (!view.job_filter.empty() || view.editing_filter) {
    title += fmt::format(" - job: {}{}", Safe(view.job_filter), view.editing_filter ? "_" : "");
  }
  if (!view.clock.empty()) title += " - " + view.clock;
  return title;
}

// ---- The one-process map ----------------------------------------------------------------

std::string OptBytes(const std::optional<std::uint64_t>& v) {
  return v ? CompactBytes(*v) : std::string("-");
}

void MapLines(const ProcessRow& r, const FrameOptions& o, std::vector<std::string>* out) {
  const auto width = static_cast<std::size_t>(std::max(o.width, 1));
  auto add = [&](const std::string& text, std::string_view sgr = {}) {
    out->push_back(Paint(Fit(text, width, false, o.utf8), sgr, o.color));
  };
  add(fmt::format("process {} - job {} - rank {} - on {}", r.pid, Safe(r.job.empty() ? "-" : r.job),
                  r.rank >= 0 ? fmt::format("{}", r.rank) : "-", Safe(r.host)),
      kBold);
  add(fmt::format("device {}{}{}", Safe(r.device_uuid.empty() ? "-" : r.device_uuid),
                  r.device_index >= 0 ? fmt::format(" (cuda:{})", r.device_index) : "",
                  r.connected ? "" : " - disconnected, last sample kept"));
  out->push_back(
      Paint(Fit(fmt::format("step {}  level {}  P(OOM within {} steps) {}  steps to OOM {}",
                            r.step >= 0 ? fmt::format("{}", r.step) : "-", RiskLevelName(r.level),
                            kRiskHorizonSteps, Percent(r.oom_risk),
                            r.steps_to_oom ? fmt::format("{}", *r.steps_to_oom) : "-"),
                width, false, o.utf8),
            LevelColor(r.level), o.color));
  add(fmt::format("reserved {}  allocated {}  cached free {}  stranded {}  fragmentation {}",
                  CompactBytes(r.reserved_bytes), CompactBytes(r.allocated_bytes),
                  OptBytes(r.cached_free_bytes), OptBytes(r.stranded_bytes),
                  Percent(r.fragmentation_ratio)));
  add(fmt::format("largest free block {}  largest request {}  max allocatable {}",
                  OptBytes(r.largest_free_block_bytes), OptBytes(r.largest_request_bytes),
                  OptBytes(r.max_allocatable_bytes)));
  add("");
  // Reserved memory as one bar: allocated, the largest free block, the other free blocks.
  const std::string_view full = o.utf8 ? "\u2588" : "#", big = o.utf8 ? "\u2593" : "=",
                         rest = o.utf8 ? "\u2591" : ".";
  const std::size_t bar = width > 12 ? std::min<std::size_t>(width - 12, 64) : 0;
  if (bar > 0 && r.reserved_bytes > 0) {
    const double scale = static_cast<double>(bar) / static_cast<double>(r.reserved_bytes);
    const auto part = [&](std::uint64_t bytes) {
      return std::min(bar,
                      static_cast<std::size_t>(std::lround(static_cast<double>(bytes) * scale)));
    };
    const std::size_t a = part(r.allocated_bytes);
    const std::size_t l = std::min(bar - a, part(r.largest_free_block_bytes.value_or(0)));
    std::string line = "reserved [";
    for (std::size_t i = 0; i < a; ++i) line += Paint(full, kCyan, o.color);
    for (std::size_t i = 0; i < l; ++i) line += Paint(big, kGreen, o.color);
    for (std::size_t i = a + l; i < bar; ++i) line += rest;
    line += "]";
    out->push_back(line);
    add(fmt::format("          {} allocated  {} largest free block  {} other free", full, big,
                    rest));
  }
  add("");
  add("free blocks by size (the daemon is sent sizes, not addresses):", kBold);
  if (r.free_blocks.empty()) add("  none reported");
  std::uint64_t most = 0;
  for (const FreeBucket& b : r.free_blocks) most = std::max(most, b.bytes);
  for (const FreeBucket& b : r.free_blocks) {
    std::string line =
        fmt::format("  {:>5}-{:<5} {:>6} block{} {:>5} ", CompactBytes(b.min_bytes),
                    b.min_bytes == 0 ? std::string("2B") : CompactBytes(b.min_bytes * 2), b.count,
                    b.count == 1 ? " " : "s", CompactBytes(b.bytes));
    if (Columns(line) >= width || most == 0) {
      add(line);
      continue;
    }
    const auto room = static_cast<double>(std::min<std::size_t>(width - Columns(line), 40));
    const auto n = static_cast<std::size_t>(
        std::ceil(static_cast<double>(b.bytes) * room / static_cast<double>(most)));
    for (std::size_t i = 0; i < n; ++i) line += rest;
    out->push_back(line);
  }
}

}  // namespace

std::string_view TopSortName(TopSort sort) {
  switch (sort) {
    case TopSort::kReserved:
      return "reserved";
    case TopSort::kAllocated:
      return "allocated";
    case TopSort::kFragmentation:
      return "fragmentation";
    case TopSort::kRisk:
      return "risk";
    case TopSort::kLevel:
      break;
  }
  return "level";
}

std::optional<TopSort> ParseTopSort(std::string_view name) {
  for (TopSort s : {TopSort::kLevel, TopSort::kReserved, TopSort::kAllocated,
                    TopSort::kFragmentation, TopSort::kRisk}) {
    if (TopSortName(s) == name) return s;
  }
  return std::nullopt;
}

std::string CompactBytes(std::uint64_t bytes) {
  if (bytes < 1000) return fmt::format("{}B", bytes);
  static constexpr char kUnits[] = "KMGTPE";
  double x = static_cast<double>(bytes);
  for (char unit : std::string_view(kUnits)) {
    x /= 1024;
    if (x < 9.95) return fmt::format("{:.1f}{}", x, unit);
    if (x < 999.5) return fmt::format("{:.0f}{}", x, unit);
  }
  return fmt::format("{:.0f}E", x);
}

std::vector<std::size_t> VisibleRows(const ProcessList& list, const TopView& view) {
  std::vector<std::size_t> rows;
  for (std::size_t i = 0; i < list.processes.size(); ++i) {
    if (list.processes[i].job.find(view.job_filter) != std::string::npos) rows.push_back(i);
  }
  const auto order = [&](std::size_t x, std::size_t y) {
    const ProcessRow& a = list.processes[x];
    const ProcessRow& b = list.processes[y];
    const double va = SortValue(a, view.sort), vb = SortValue(b, view.sort);
    if (va != vb) return va > vb;
    return WorseThan(a, b);
  };
  std::stable_sort(rows.begin(), rows.end(), order);
  return rows;
}

std::vector<std::string> RenderTopFrame(const ProcessList& list, const TopView& view,
                                        const FrameOptions& options) {
  const auto width = static_cast<std::size_t>(std::max(options.width, 1));
  const bool color = options.color;
  std::vector<std::string> lines;
  const std::vector<std::size_t> rows = VisibleRows(list, view);
  lines.push_back(Paint(Fit(Title(list, view, rows.size()), width, false, options.utf8),
                        std::string(kBold) + ";" + std::string(kReverse), color));
  if (!view.status.empty()) {
    lines.push_back(Paint(Fit(Safe(view.status), width, false, options.utf8), kBoldRed, color));
  } else {
    lines.push_back(Fit(fmt::format("from {}", Safe(view.source)), width, false, options.utf8));
  }
  std::vector<std::string> help_lines;
  if (view.interactive) {
    help_lines.push_back(Paint(
        Fit(view.map ? "Enter/Esc back to the list   q quit"
            : view.editing_filter
                ? "type a job name (substring), Enter apply, Esc cancel"
                : "q quit  up/dn select  Enter map  / job  l level r resv a alloc f frag p risk",
            width, false, options.utf8),
        kDim, color));
  }
  const std::size_t budget =
      options.height > 0 ? static_cast<std::size_t>(options.height) -
                               std::min<std::size_t>(static_cast<std::size_t>(options.height),
                                                     lines.size() + help_lines.size())
                         : SIZE_MAX;
  std::vector<std::string> body;
  if (view.map) {
    MapLines(*view.map, options, &body);
  } else {
    const std::vector<std::size_t> w = Layout(options.width);
    std::string header = "  ";
    bool first = true;
    for (int c = 0; c < kColumnCount; ++c) {
      const std::size_t cw = w[static_cast<std::size_t>(c)];
      if (cw == 0) continue;
      if (!first) header += ' ';
      first = false;
      header += Fit(kColumns[c].header, cw, kColumns[c].right, options.utf8);
    }
    body.push_back(Paint(Fit(header, width, false, options.utf8), kBold, color));
    if (rows.empty()) {
      body.push_back(
          Fit(list.processes.empty()
                  ? "  no training process reports to this daemon"
                  : fmt::format("  no process of a job matching \"{}\"", Safe(view.job_filter)),
              width, false, options.utf8));
    }
    // The selected row (the first when none or gone), kept on screen.
    std::size_t selected = 0;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      if (list.processes[rows[i]].id == view.selected_id) selected = i;
    }
    const std::size_t room = budget > 1 ? budget - 1 : 0;
    std::size_t first_row = 0;
    if (rows.size() > room && room > 0) {
      first_row = selected >= room ? selected - room + 1 : 0;
      // The last line says how many rows are below; keep the selection above it.
      if (first_row + room < rows.size() && selected >= first_row + room - 1 && room > 1) {
        ++first_row;
      }
    }
    for (std::size_t i = first_row; i < rows.size() && body.size() < budget; ++i) {
      if (body.size() + 1 == budget && i + 1 < rows.size()) {
        body.push_back(Paint(
            Fit(fmt::format("  ... {} more (filter with / or widen the terminal)", rows.size() - i),
                width, false, options.utf8),
            kDim, color));
        break;
      }
      const ProcessRow& r = list.processes[rows[i]];
      const bool is_selected = view.interactive && i == selected;
      std::string line = is_selected ? "> " : "  ";
      first = true;
      for (int c = 0; c < kColumnCount; ++c) {
        const std::size_t cw = w[static_cast<std::size_t>(c)];
        if (cw == 0) continue;
        if (!first) line += ' ';
        first = false;
        const std::string cell =
            Fit(Cell(r, c, cw, options.utf8), cw, kColumns[c].right, options.utf8);
        line += c == kLevel && !is_selected ? Paint(cell, LevelColor(r.level), color) : cell;
      }
      if (!r.connected && !is_selected) line = Paint(line, kDim, color);
      body.push_back(is_selected ? Paint(line, kReverse, color) : line);
    }
  }
  if (body.size() > budget) body.resize(budget);
  for (std::string& l : body) lines.push_back(std::move(l));
  if (options.height > 0) {
    while (lines.size() + help_lines.size() < static_cast<std::size_t>(options.height)) {
      lines.emplace_back();
    }
  }
  for (std::string& l : help_lines) lines.push_back(std::move(l));
  if (options.height > 0 && lines.size() > static_cast<std::size_t>(options.height)) {
    lines.resize(static_cast<std::size_t>(options.height));
  }
  return lines;
}

}  // namespace fragscope::sinks::live
