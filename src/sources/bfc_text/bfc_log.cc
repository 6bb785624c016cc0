#include "sources/bfc_text/bfc_log.h"

#include <algorithm>
#include <limits>

#include <fmt/format.h>

#include "sources/oom_text/oom_text_scanner.h"

namespace fragscope::sources {
namespace {

// Figures beyond 2^60 bytes are not real (PyTorch and fragscope's traces use the same guard);
// the cap also keeps sums of a few figures from overflowing.
constexpr std::uint64_t kBfcMaxFigure = std::uint64_t{1} << 60;
constexpr std::uint64_t kBfcNoNext = std::numeric_limits<std::uint64_t>::max();
constexpr std::size_t kBfcMaxNotes = 20;
constexpr std::size_t kBfcMaxText = 256;  // op names, shapes, allocator names
constexpr std::size_t kBfcMaxSettings = 16;
constexpr std::size_t kBfcMaxStats = 16;
constexpr std::size_t kBfcMaxBins = 64;

bool BfcIsDigit(char c) { return c >= '0' && c <= '9'; }
bool BfcIsSpace(char c) { return c == ' ' || c == '\t'; }
bool BfcIsHex(char c) { return BfcIsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool BfcIsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

std::string_view BfcTrim(std::string_view s) {
  while (!s.empty() && (BfcIsSpace(s.front()) || s.front() == '\r')) s.remove_prefix(1);
  while (!s.empty() && (BfcIsSpace(s.back()) || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

std::string BfcCapped(std::string_view s) { return std::string(s.substr(0, kBfcMaxText)); }

// Decimal digits at `pos` (after spaces); nullopt without digits or beyond 2^64.
std::optional<std::uint64_t> BfcNumberAt(std::string_view s, std::size_t pos,
                                         std::size_t* end = nullptr) {
  while (pos < s.size() && BfcIsSpace(s[pos])) ++pos;
  std::uint64_t v = 0;
  std::size_t digits = 0;
  while (pos < s.size() && BfcIsDigit(s[pos])) {
    const std::uint64_t d = static_cast<std::uint64_t>(s[pos] - '0');
    if (v > (std::numeric_limits<std::uint64_t>::max() - d) / 10) return std::nullopt;
    v = v * 10 + d;
    ++pos;
    ++digits;
  }
  if (digits == 0) return std::nullopt;
  if (end != nullptr) *end = pos;
  return v;
}

// A byte figure at `pos`: "1.17GiB", "512B", "20.00 MiB" (as TensorFlow's HumanReadableNumBytes
// prints it) or plain digits ("1258291200"). nullopt if neither, or 2^60 or more.
std::optional<std::uint64_t> BfcSizeAt(std::string_view s, std::size_t pos) {
  while (pos < s.size() && BfcIsSpace(s[pos])) ++pos;
  if (pos >= s.size()) return std::nullopt;
  std::size_t used = 0;
  if (std::optional<std::uint64_t> v = ParsePrintedSize(s.substr(pos), &used)) return v;
  std::optional<std::uint64_t> v = BfcNumberAt(s, pos);
  if (!v || *v >= kBfcMaxFigure) return std::nullopt;
  return v;
}

// The figure right after the first `phrase` in `s`.
std::optional<std::uint64_t> BfcSizeAfter(std::string_view s, std::string_view phrase) {
  const std::size_t p = s.find(phrase);
  if (p == std::string_view::npos) return std::nullopt;
  return BfcSizeAt(s, p + phrase.size());
}

std::optional<std::uint64_t> BfcNumberAfter(std::string_view s, std::string_view phrase) {
  const std::size_t p = s.find(phrase);
  if (p == std::string_view::npos) return std::nullopt;
  return BfcNumberAt(s, p + phrase.size());
}

// A hexadecimal address at `pos` ("7f3a00000000", "0x7f3a00000000", "0000000600F80000").
std::optional<std::uint64_t> BfcHexAt(std::string_view s, std::size_t pos) {
  while (pos < s.size() && BfcIsSpace(s[pos])) ++pos;
  if (pos + 1 < s.size() && s[pos] == '0' && (s[pos + 1] == 'x' || s[pos + 1] == 'X')) pos += 2;
  std::uint64_t v = 0;
  std::size_t digits = 0;
  while (pos < s.size() && BfcIsHex(s[pos])) {
    if (++digits > 16) return std::nullopt;
    const char c = s[pos++];
    const int d = BfcIsDigit(c) ? c - '0' : (c >= 'a' ? c - 'a' : c - 'A') + 10;
    v = (v << 4) | static_cast<std::uint64_t>(d);
  }
  if (digits == 0) return std::nullopt;
  return v;
}

// The word (up to a space, ',' or ')') after `phrase`.
std::string_view BfcWordAfter(std::string_view s, std::string_view phrase) {
  const std::size_t p = s.find(phrase);
  if (p == std::string_view::npos) return {};
  std::size_t b = p + phrase.size();
  while (b < s.size() && BfcIsSpace(s[b])) ++b;
  std::size_t e = b;
  while (e < s.size() && !BfcIsSpace(s[e]) && s[e] != ',' && s[e] != ')' && s[e] != '(') ++e;
  return s.substr(b, e - b);
}

// The source file of a glog-style prefix: "tensorflow/core/common_runtime/bfc_allocator.cc".
std::string BfcSourceFileOf(std::string_view s) {
  const std::size_t p = s.find(".cc:");
  if (p == std::string_view::npos) return "";
  std::size_t b = p;
  while (b > 0 && !BfcIsSpace(s[b - 1])) --b;
  return BfcCapped(s.substr(b, p + 3 - b));
}

// The text after glog's "file.cc:123] " (or the whole line without such a prefix).
std::string_view BfcPayload(std::string_view s) {
  const std::size_t p = s.find(".cc:");
  if (p != std::string_view::npos) {
    const std::size_t close = s.find("] ", p);
    if (close != std::string_view::npos && close < p + 12) return BfcTrim(s.substr(close + 2));
  }
  return BfcTrim(s);
}

// "Name: 1234" (a Stats line); false if the text is not of that form.
bool BfcStatLine(std::string_view text, std::string* name, std::uint64_t* value) {
  text = BfcTrim(text);
  std::size_t i = 0;
  while (i < text.size() && BfcIsAlpha(text[i])) ++i;
  if (i == 0 || i + 1 >= text.size() || text[i] != ':') return false;
  // TensorFlow 2.21 prints byte counts as "64.00MiB", earlier versions as plain integers.
  std::size_t start = i + 1;
  while (start < text.size() && BfcIsSpace(text[start])) ++start;
  std::size_t used = 0;
  std::optional<std::uint64_t> v = ParsePrintedSize(text.substr(start), &used);
  std::size_t end = start + used;
  if (!v) v = BfcNumberAt(text, start, &end);
  if (!v || BfcTrim(text.substr(end)).size() != 0) return false;
  *name = std::string(text.substr(0, i));
  *value = *v;
  return true;
}

// Settings that bound or shape the allocator, named as users write them.
constexpr std::string_view kBfcSettings[] = {
    "XLA_PYTHON_CLIENT_MEM_FRACTION",
    "XLA_CLIENT_MEM_FRACTION",
    "XLA_PYTHON_CLIENT_PREALLOCATE",
    "XLA_PYTHON_CLIENT_ALLOCATOR",
    "TF_GPU_ALLOCATOR",
    "TF_FORCE_GPU_ALLOW_GROWTH",
    "per_process_gpu_memory_fraction",
    "TF_ENABLE_GPU_GARBAGE_COLLECTION",
    "allow_growth",
    "set_memory_growth",
};

void BfcReadSettings(std::string_view line, BfcLogContext* c) {
  for (std::string_view name : kBfcSettings) {
    const std::size_t p = line.find(name);
    if (p == std::string_view::npos || c->settings.size() >= kBfcMaxSettings) continue;
    std::size_t i = p + name.size();
    while (i < line.size() && (BfcIsSpace(line[i]) || line[i] == '=' || line[i] == ':' ||
                               line[i] == '"' || line[i] == '\'' || line[i] == '(')) {
      ++i;
    }
    std::size_t e = i;
    while (e < line.size() && e - i < 32 &&
           (BfcIsAlpha(line[e]) || BfcIsDigit(line[e]) || line[e] == '.' || line[e] == '_' ||
            line[e] == '-')) {
      ++e;
    }
    if (e == i) continue;
    const std::string value(line.substr(i, e - i));
    bool seen = false;
    for (auto& [k, v] : c->settings) {
      if (k == name) {
        v = value;  // the last word wins, as the last assignment does
        seen = true;
      }
    }
    if (!seen) c->settings.emplace_back(std::string(name), value);
  }
}

}  // namespace

// ---- The scanner ------------------------------------------------------------------------------

namespace {

// Sets the map figures of `r` from its chunks (before they are dropped).
void BfcSummarize(BfcReport& r) {
  r.map_in_use = r.map_free = r.map_largest_free = r.map_region_bytes = 0;
  r.map_regions = r.regions.size();
  bool complete = !r.regions.empty() && !r.chunks_dropped;
  for (const BfcRegion& g : r.regions) {
    for (const BfcChunk& c : g.chunks) {
      if (c.in_use) {
        r.map_in_use += c.size;
      } else {
        r.map_free += c.size;
        r.map_largest_free = std::max(r.map_largest_free, c.size);
      }
    }
    const std::uint64_t covered = g.ChunkBytes();
    r.map_region_bytes += g.size != 0 ? g.size : covered;
    const bool ended =
        g.chunks.empty() || !g.chunks.back().next_printed || g.chunks.back().last_in_region;
    if (g.chunks.empty() || g.size == 0 || covered != g.size || !ended) {
      complete = false;
    }
  }
  r.map_complete = complete;
}

}  // namespace

BfcReport* BfcLogScanner::Current() {
  return open_ && !scan_.reports.empty() ? &scan_.reports.back() : nullptr;
}

void BfcLogScanner::Note(BfcReport& r, std::string text) {
  if (r.notes.size() < kBfcMaxNotes) r.notes.push_back(std::move(text));
}

BfcReport& BfcLogScanner::Begin(BfcReportKind kind) {
  if (!scan_.reports.empty()) {
    BfcReport& prev = scan_.reports.back();
    BfcSummarize(prev);
    prev.regions.clear();  // only the last report keeps its map (bounded memory)
    prev.regions.shrink_to_fit();
    kept_chunks_ = 0;
  }
  if (scan_.reports.size() >= limits_.max_reports && !scan_.reports.empty()) {
    scan_.reports.erase(scan_.reports.begin());  // the last ones matter: keep them
    ++scan_.dropped_reports;
  }
  scan_.reports.emplace_back();
  BfcReport& r = scan_.reports.back();
  r.kind = kind;
  r.line = r.last_line = scan_.lines;
  open_ = true;
  stats_lines_ = 0;
  return r;
}

void BfcLogScanner::ChunkLine(std::string_view text, bool in_use) {
  BfcReport* cur = Current();
  if (cur == nullptr || cur->kind != BfcReportKind::kBfc) {
    cur = &Begin(BfcReportKind::kBfc);
    Note(*cur, fmt::format("line {}: a chunk map without the lines that start a dump before it "
                           "(the log was cut, or interleaved)",
                           scan_.lines));
  }
  BfcReport& r = *cur;
  r.dump_started = true;
  ++r.chunks;
  const std::size_t at = text.find(" at ");
  const std::optional<std::uint64_t> addr = BfcHexAt(text, at + 4);
  const std::optional<std::uint64_t> size = BfcNumberAfter(text, " of size ");
  if (!addr || !size || *size == 0 || *size >= kBfcMaxFigure) {
    Note(r, fmt::format("line {}: a chunk line without a readable address or size: skipped",
                        scan_.lines));
    return;
  }
  if (kept_chunks_ >= limits_.max_chunks) {
    if (!r.chunks_dropped) {
      Note(r, fmt::format("line {}: more than {} chunks: the rest of the map is not kept",
                          scan_.lines, limits_.max_chunks));
    }
    r.chunks_dropped = true;
    return;
  }
  if (r.regions.empty()) {
    BfcRegion g;
    g.line = scan_.lines;
    r.regions.push_back(std::move(g));
    Note(r, fmt::format("line {}: a chunk before any \"Next region of size\" line", scan_.lines));
  }
  BfcRegion& g = r.regions.back();
  if (!g.chunks.empty()) {
    const BfcChunk& prev = g.chunks.back();
    if (prev.last_in_region || prev.addr + prev.size != *addr) {
      // A chunk that does not follow its predecessor: lines are missing (a "..." cut) or the
      // region header was; either way this starts a new run of chunks.
      if (r.regions.size() >= limits_.max_regions) {
        r.chunks_dropped = true;
        return;
      }
      Note(r, fmt::format("line {}: the chunk at {:#x} does not follow the one before it (lines "
                          "missing from the map?)",
                          scan_.lines, *addr));
      BfcRegion next;
      next.line = scan_.lines;
      r.regions.push_back(std::move(next));
    }
  }
  BfcChunk c;
  c.addr = *addr;
  c.size = *size;
  c.in_use = in_use;
  c.line = scan_.lines;
  const std::optional<std::uint64_t> next = BfcNumberAfter(text, " next ");
  c.last_in_region = next && *next == kBfcNoNext;
  c.next_printed = next.has_value();
  const std::string_view tag = BfcWordAfter(text, " tag ");
  if (!tag.empty()) c.tag = BfcCapped(tag);
  r.regions.back().chunks.push_back(std::move(c));
  ++kept_chunks_;
  r.last_line = scan_.lines;
}

void BfcLogScanner::AddLine(std::string_view line) {
  ++scan_.lines;
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (line.size() > limits_.max_line_bytes) {
    ++scan_.cut_lines;
    line = line.substr(0, limits_.max_line_bytes);
  }
  // No line this scanner reads is this short (a Stats line is at least "InUse: 0"), and
  // endless short lines (`yes | fragscope explain -`) must cost no more than counting them.
  if (line.size() < 8 && stats_lines_ == 0) return;
  BfcLogContext& ctx = scan_.context;

  // A Stats block's "Name: value" lines carry no logger prefix (one record, several lines).
  if (stats_lines_ > 0) {
    std::string name;
    std::uint64_t value = 0;
    if (BfcStatLine(line, &name, &value)) {
      --stats_lines_;
      if (BfcReport* r = Current(); r != nullptr && r->stats.size() < kBfcMaxStats) {
        r->stats.emplace_back(std::move(name), value);
        r->last_line = scan_.lines;
      }
      return;
    }
    stats_lines_ = 0;
  }
  if (buffer_stats_) {
    if (const std::optional<std::uint64_t> total = BfcSizeAfter(line, "total allocation:")) {
      if (BfcReport* r = Current()) r->buffer_total = total;
      buffer_stats_ = false;
      return;
    }
  }

  // Context: which framework, which settings, the device's size.
  if (line.find("jax") != std::string_view::npos ||
      line.find("XlaRuntimeError") != std::string_view::npos ||
      line.find("external/xla/") != std::string_view::npos ||
      line.find("tensorflow/compiler/xla/python") != std::string_view::npos) {
    ctx.framework = "jax";
  } else if (ctx.framework.empty() &&
             (line.find("tensorflow") != std::string_view::npos ||
              line.find("TensorFlow") != std::string_view::npos ||
              line.find("OOM when allocating tensor") != std::string_view::npos ||
              line.find("local_xla/") != std::string_view::npos ||
              line.find("local_tsl/") != std::string_view::npos)) {
    ctx.framework = "tensorflow";
  }
  BfcReadSettings(line, &ctx);
  if (const std::optional<std::uint64_t> total = BfcSizeAfter(line, "totalMemory: ")) {
    ctx.device_total = total;
  }
  if (line.find("Created device") != std::string_view::npos) {
    if (const std::optional<std::uint64_t> mb = BfcNumberAfter(line, " with "))
      ctx.tf_device_mb = mb;
  }
  if (line.find("from device: CUDA_ERROR_OUT_OF_MEMORY") != std::string_view::npos) {
    ++ctx.driver_failures;
  }
  if (line.find("Garbage collection: deallocate free memory regions") != std::string_view::npos) {
    ++ctx.garbage_collections;
  }

  // ---- The BFC allocator's failure and its dump
  std::size_t p = line.find("an out of memory trying to allocate ");  // "Ran" or "ran"
  if (p != std::string_view::npos && p > 0) {
    if (line.find("not a failure") != std::string_view::npos) {
      ++ctx.soft_failures;  // a scratch allocation with a fallback: no dump follows
      return;
    }
    // TensorFlow before 1.3 printed the dump first and "Ran out of memory trying to allocate X.
    // See logs for memory state." after it: that line ends the dump it follows.
    BfcReport* last = scan_.reports.empty() ? nullptr : &scan_.reports.back();
    const bool after_dump = line.find("See logs for memory state") != std::string_view::npos &&
                            last != nullptr && last->kind == BfcReportKind::kBfc &&
                            last->dump_started && !last->request;
    BfcReport& r = after_dump ? *last : Begin(BfcReportKind::kBfc);
    if (after_dump) {
      const auto unknown_request = [](const std::string& n) {
        return n.find("the request is not known") != std::string::npos;
      };
      r.notes.erase(std::remove_if(r.notes.begin(), r.notes.end(), unknown_request), r.notes.end());
      r.last_line = scan_.lines;
    }
    if (r.source_file.empty()) r.source_file = BfcSourceFileOf(line);
    const std::string_view name = BfcWordAfter(line, "Allocator (");
    if (!name.empty()) r.allocator = BfcCapped(name);
    r.request = BfcSizeAt(line, p + 36);
    if (const std::optional<std::uint64_t> rounded = BfcNumberAfter(line, "(rounded to ")) {
      if (*rounded < kBfcMaxFigure) r.rounded = rounded;
    }
    if (const std::size_t op = line.find("requested by op "); op != std::string_view::npos) {
      r.op = BfcCapped(BfcTrim(line.substr(op + 16)));
    }
    return;
  }
  if ((p = line.find("BFCAllocator dump for ")) != std::string_view::npos) {
    BfcReport* r = Current();
    if (r == nullptr || r->kind != BfcReportKind::kBfc || r->dump_started) {
      r = &Begin(BfcReportKind::kBfc);
      Note(*r, fmt::format("line {}: a dump without its \"ran out of memory\" line: the request "
                           "is not known",
                           scan_.lines));
    }
    r->dump_started = true;
    if (r->allocator.empty()) r->allocator = BfcCapped(BfcTrim(line.substr(p + 22)));
    if (r->source_file.empty()) r->source_file = BfcSourceFileOf(line);
    r->last_line = scan_.lines;
    return;
  }
  if ((p = line.find("Bin (")) != std::string_view::npos &&
      line.find("Total Chunks:") != std::string_view::npos) {
    BfcReport* r = Current();
    const std::optional<std::uint64_t> bin_size = BfcNumberAt(line, p + 5);
    const bool first_bin = bin_size && *bin_size == kBfcMinAllocation;
    if (r == nullptr || r->kind != BfcReportKind::kBfc ||
        (first_bin && !r->bins.empty())) {  // a second dump without its first line
      r = &Begin(BfcReportKind::kBfc);
      Note(*r, fmt::format("line {}: a dump without its \"ran out of memory\" line: the request "
                           "is not known",
                           scan_.lines));
    }
    r->dump_started = true;
    if (r->source_file.empty()) r->source_file = BfcSourceFileOf(line);
    if (bin_size && r->bins.size() < kBfcMaxBins) {
      BfcBin b;
      b.bin_size = *bin_size;
      b.chunks = BfcNumberAfter(line, "Total Chunks:").value_or(0);
      b.chunks_in_use = BfcNumberAfter(line, "Chunks in use:").value_or(0);
      // "N allocated for chunks": the figure before the phrase, after "in use: b." / "b ".
      const std::size_t use = line.find("Chunks in use:");
      std::size_t after = use == std::string_view::npos ? line.size() : use + 14;
      BfcNumberAt(line, after, &after);
      if (after < line.size() && line[after] == '.') ++after;
      b.bytes = BfcSizeAt(line, after).value_or(0);
      const std::size_t in_bin = line.find(" in use in bin");
      if (in_bin != std::string_view::npos) {
        std::size_t s = in_bin;
        while (s > 0 && !BfcIsSpace(line[s - 1])) --s;
        b.bytes_in_use = BfcSizeAt(line, s).value_or(0);
      }
      r->bins.push_back(b);
    }
    r->last_line = scan_.lines;
    return;
  }
  if (line.find("Next region of size ") != std::string_view::npos) {
    BfcReport* r = Current();
    if (r == nullptr || r->kind != BfcReportKind::kBfc) {
      r = &Begin(BfcReportKind::kBfc);
      Note(*r, fmt::format("line {}: a chunk map without the lines that start a dump before it "
                           "(the log was cut, or interleaved)",
                           scan_.lines));
    }
    r->dump_started = true;
    if (r->regions.size() >= limits_.max_regions) {
      r->chunks_dropped = true;
      return;
    }
    BfcRegion g;
    g.size = BfcNumberAfter(line, "Next region of size ").value_or(0);
    if (g.size >= kBfcMaxFigure) g.size = 0;
    g.line = scan_.lines;
    r->regions.push_back(std::move(g));
    r->last_line = scan_.lines;
    return;
  }
  if (line.find(" of size ") != std::string_view::npos) {
    std::size_t q = line.find("InUse at ");
    if (q == std::string_view::npos) q = line.find("Chunk at ");
    if (q != std::string_view::npos) {
      ChunkLine(line.substr(q), true);
      return;
    }
    if (line.find("Free  at ") != std::string_view::npos ||
        line.find("Free at ") != std::string_view::npos) {
      ChunkLine(line.substr(line.find("Free")), false);
      return;
    }
  }
  if (const std::optional<std::uint64_t> sum = BfcSizeAfter(line, "Sum Total of in-use chunks: ")) {
    if (BfcReport* r = Current()) {
      r->sum_in_use = sum;
      r->last_line = scan_.lines;
    }
    return;
  }
  // "total_region_allocated_bytes_: N memory_limit_: N available bytes: ..." (to TF 2.20), "Total
  // size in pool: 64.00MiB memory_limit_: 64.00MiB available size: 0B ..." (TF 2.21).
  if (line.find("total_region_allocated_bytes_: ") != std::string_view::npos ||
      line.find("Total size in pool: ") != std::string_view::npos) {
    if (BfcReport* r = Current()) {
      r->region_bytes = BfcSizeAfter(line, "total_region_allocated_bytes_: ");
      if (!r->region_bytes) r->region_bytes = BfcSizeAfter(line, "Total size in pool: ");
      r->memory_limit = BfcSizeAfter(line, "memory_limit_: ");
      r->next_region = BfcSizeAfter(line, "curr_region_allocation_bytes_: ");
      r->last_line = scan_.lines;
    }
    return;
  }
  if (line.find("Allocator memory summary:") != std::string_view::npos) {
    if (BfcReport* r = Current()) {
      if (!r->rounded) r->rounded = BfcSizeAfter(line, "rounded request ");
      r->summary_free = BfcSizeAfter(line, "total free in pool ");
      if (const std::size_t l = line.find("largest free chunk usable by ");
          l != std::string_view::npos) {
        const std::size_t end = line.find(" end ", l);
        if (end != std::string_view::npos) r->summary_largest = BfcSizeAt(line, end + 5);
      }
      if (!r->region_bytes) r->region_bytes = BfcSizeAfter(line, "pool size ");
      if (!r->memory_limit) r->memory_limit = BfcSizeAfter(line, "pool limit ");
      r->last_line = scan_.lines;
    }
    return;
  }
  if (line.find("region growth hint") != std::string_view::npos) {
    if (BfcReport* r = Current()) {
      r->next_region = BfcSizeAfter(line, "allocation target ");
      if (line.find("growth enabled") != std::string_view::npos) r->growth = true;
      if (line.find("growth disabled") != std::string_view::npos) r->growth = false;
      r->last_line = scan_.lines;
    }
    return;
  }
  if ((p = line.find("Stats:")) != std::string_view::npos) {
    if (Current() != nullptr) {
      stats_lines_ = 16;
      std::string name;
      std::uint64_t value = 0;
      // cuda_malloc_async prints "Stats: Limit:   0" on one line.
      if (BfcStatLine(line.substr(p + 6), &name, &value)) {
        Current()->stats.emplace_back(std::move(name), value);
        --stats_lines_;
      }
      Current()->last_line = scan_.lines;
    }
    return;
  }
  const std::string_view payload = BfcPayload(line);
  if (payload.size() >= 50 && payload.find_first_not_of("*x_") == std::string_view::npos) {
    if (BfcReport* r = Current(); r != nullptr && r->kind == BfcReportKind::kBfc) {
      r->occupancy = true;
      r->last_line = scan_.lines;
      BfcSummarize(*r);
    }
    return;
  }
  if ((p = line.find("OOM when allocating tensor with shape")) != std::string_view::npos) {
    if (!scan_.reports.empty() && scan_.reports.back().kind == BfcReportKind::kBfc &&
        scan_.reports.back().tensor_shape.empty()) {
      const std::string_view rest = line.substr(p + 32);
      scan_.reports.back().tensor_shape = BfcCapped(rest.substr(0, rest.find(" on /")));
    }
    return;
  }

  // ---- XLA's "Out of memory while trying to allocate N bytes."
  p = line.find("ut of memory while trying to allocate ");
  if (p == std::string_view::npos) p = line.find("ut of memory allocating ");
  if (p != std::string_view::npos && p > 0) {
    const std::size_t at = line.find(' ', line.find("allocat", p)) + 1;
    const std::optional<std::uint64_t> bytes = BfcNumberAt(line, at);
    // The error that follows a BFC dump names the same request, unrounded: it belongs to it.
    if (!scan_.reports.empty()) {
      BfcReport& last = scan_.reports.back();
      if (last.kind == BfcReportKind::kBfc && last.dump_started && bytes &&
          (!last.rounded || *last.rounded == BfcRoundedBytes(*bytes)) && !last.request_exact) {
        last.request = bytes;
        last.request_exact = true;
        open_ = false;
        return;
      }
      if (last.kind == BfcReportKind::kJaxOom && bytes && last.request == bytes &&
          scan_.lines - last.last_line <= 2) {
        return;  // the same error printed twice (log line and exception)
      }
    }
    BfcReport& r = Begin(BfcReportKind::kJaxOom);
    if (bytes && *bytes < kBfcMaxFigure) {
      r.request = bytes;
      r.request_exact = true;
    }
    return;
  }
  if (line.find("BufferAssignment stats:") != std::string_view::npos) {
    buffer_stats_ = Current() != nullptr;
    return;
  }

  // ---- cuda_malloc_async
  if ((p = line.find("cuMemAllocAsync failed to allocate ")) != std::string_view::npos) {
    BfcReport& r = Begin(BfcReportKind::kCudaMallocAsync);
    r.source_file = BfcSourceFileOf(line);
    std::size_t b = p;
    while (b > 0 && BfcIsSpace(line[b - 1])) --b;
    std::size_t a = b;
    while (a > 0 && !BfcIsSpace(line[a - 1]) && line[a - 1] != ']') --a;
    if (a < b) r.allocator = BfcCapped(line.substr(a, b - a));
    const std::optional<std::uint64_t> bytes = BfcNumberAt(line, p + 35);
    if (bytes && *bytes < kBfcMaxFigure) {
      r.request = bytes;
      r.request_exact = true;
    }
    return;
  }
  if ((p = line.find("Free memory/Total memory: ")) != std::string_view::npos) {
    if (BfcReport* r = Current()) {
      std::size_t end = 0;
      r->device_free = BfcNumberAt(line, p + 26, &end);
      if (r->device_free && end < line.size() && line[end] == '/') {
        r->device_total = BfcNumberAt(line, end + 1);
      }
      r->last_line = scan_.lines;
    }
    return;
  }
  if (BfcReport* r = Current(); r != nullptr && r->kind == BfcReportKind::kCudaMallocAsync) {
    if (const auto v = BfcNumberAfter(line, "CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT: ")) {
      r->pool_reserved = v;
      r->last_line = scan_.lines;
    } else if (const auto u = BfcNumberAfter(line, "CU_MEMPOOL_ATTR_USED_MEM_CURRENT: ")) {
      r->pool_used = u;
      r->last_line = scan_.lines;
    }
  }
}

BfcLogScan BfcLogScanner::Finish() {
  if (!scan_.reports.empty()) BfcSummarize(scan_.reports.back());
  open_ = false;
  return std::move(scan_);
}

Result<BfcLogScan> ReadBfcLog(const std::string& path, const BfcLogLimits& limits) {
  BfcLogScanner scanner(limits);
  OomTextLimits text_limits;
  text_limits.max_line_bytes = limits.max_line_bytes;
  const auto feed = [&](std::string_view line) { scanner.AddLine(line); };
  Result<OomTextScan> read = ReadOomText(path, text_limits, feed);
  if (!read.ok()) return read.status();
  return scanner.Finish();
}

BfcLogScan ScanBfcLog(std::string_view text, const BfcLogLimits& limits) {
  BfcLogScanner scanner(limits);
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    scanner.AddLine(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return scanner.Finish();
}

}  // namespace fragscope::sources
