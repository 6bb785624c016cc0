#include "sources/oom_text/oom_text_scanner.h"

#include <array>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <string_view>

#include <fmt/format.h>

#include "common/utf8.h"
#include "sources/trace/input_stream.h"

namespace fragscope::sources {
namespace {

// ---- Character helpers ------------------------------------------------------------------------

bool IsAlpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\f' || c == '\v'; }
char Lower(char c) { return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c; }

// Case-insensitive find of an ASCII needle; linear in practice (short needles).
std::size_t FindNoCase(std::string_view hay, std::string_view needle, std::size_t from = 0) {
  if (needle.empty() || hay.size() < needle.size()) return std::string_view::npos;
  for (std::size_t i = from; i + needle.size() <= hay.size(); ++i) {
    std::size_t k = 0;
    while (k < needle.size() && Lower(hay[i + k]) == Lower(needle[k])) ++k;
    if (k == needle.size()) return i;
  }
  return std::string_view::npos;
}

// An unsigned decimal of at most 18 digits at text[pos]; *end gets the first index after it.
std::optional<std::int64_t> ParseInt(std::string_view text, std::size_t pos, std::size_t* end) {
  std::int64_t v = 0;
  std::size_t i = pos;
  while (i < text.size() && IsAsciiDigit(text[i]) && i - pos < 18) v = v * 10 + (text[i++] - '0');
  if (i == pos || (i < text.size() && IsAsciiDigit(text[i]))) return std::nullopt;
  *end = i;
  return v;
}

// ---- Triggers -------------------------------------------------------------------------------

struct Trigger {
  std::size_t pos = std::string_view::npos;  // where the message starts (the backend word)
  std::string_view backend;
};

// "CUDA out of memory", "HIP out of memory" (ROCm builds hipify the text), "XPU out of memory",
// and the CUDA runtime's own "CUDA error: out of memory" (no allocator figures).
//
// A message quoted without its first sentence starts at "Tried to allocate {S}" (the figure
// must follow, so prose such as "Tried to allocate memory" is no message): backend "" until
// the text shows which (BackendOfQuoted). `bare` = false skips those starts, for the lines
// that may go on with a message whose own "Tried to allocate" is still to come.
constexpr std::string_view kTried = "Tried to allocate ";

std::optional<std::uint64_t> SizeAfter(std::string_view text, std::size_t pos);

Trigger FindTrigger(std::string_view line, bool bare = true) {
  static constexpr std::array<std::pair<std::string_view, std::string_view>, 4> kTriggers = {{
      {"CUDA out of memory", "CUDA"},
      {"HIP out of memory", "HIP"},
      {"XPU out of memory", "XPU"},
      {"CUDA error: out of memory", "CUDA"},
  }};
  Trigger best;
  for (const auto& [text, backend] : kTriggers) {
    const std::size_t p = line.find(text);
    if (p != std::string_view::npos && p < best.pos) best = {p, backend};
  }
  if (!bare) return best;
  for (std::size_t p = line.find(kTried); p != std::string_view::npos && p < best.pos;
       p = line.find(kTried, p + 1)) {
    // Part of a message begun earlier on the line ("CUDA out of memory. Tried ...") is not a
    // start: only the backend triggers before it decide, and best.pos is the earliest of them.
    if (SizeAfter(line, p + kTried.size())) {
      best = {p, ""};
      break;
    }
  }
  return best;
}

// The backend of a message quoted from "Tried to allocate" on, from what its text names.
std::string_view BackendOfQuoted(std::string_view text) {
  if (text.find("PYTORCH_HIP_ALLOC_CONF") != std::string_view::npos ||
      text.find("notes/hip.html") != std::string_view::npos) {
    return "HIP";
  }
  if (text.find("`empty_cache` to release") != std::string_view::npos) return "XPU";
  return "CUDA";
}

// "[rank3]:", "rank=3", "rank 3", "[default3]:" (torchrun's per-worker prefix) in a line.
std::optional<std::int64_t> FindRank(std::string_view line) {
  for (std::string_view word : {std::string_view("rank"), std::string_view("[default")}) {
    std::size_t p = 0;
    while ((p = FindNoCase(line, word, p)) != std::string_view::npos) {
      const bool word_start = p == 0 || !IsAlpha(line[p - 1]);
      std::size_t i = p + word.size();
      p += word.size();
      if (!word_start) continue;
      if (i < line.size() && line[i] == '"') ++i;  // JSON: "rank": 5
      if (i < line.size() && (line[i] == '=' || line[i] == ':' || line[i] == ' ')) ++i;
      if (i < line.size() && line[i] == ' ') ++i;
      std::size_t end = 0;
      if (std::optional<std::int64_t> v = ParseInt(line, i, &end)) return v;
    }
  }
  return std::nullopt;
}

// The exception name just before the message: the last word of `prefix` that ends in ':' and
// contains "Error" ("torch.OutOfMemoryError:", "RuntimeError:", "torch.cuda.OutOfMemoryError:").
std::string ExceptionName(std::string_view prefix) {
  std::size_t end = prefix.size();
  while (end > 0 && IsSpace(prefix[end - 1])) --end;
  if (end == 0 || prefix[end - 1] != ':') return {};
  std::size_t start = end - 1;
  while (start > 0 && !IsSpace(prefix[start - 1]) && prefix[start - 1] != '"' &&
         prefix[start - 1] != '\'' && prefix[start - 1] != '(' && prefix[start - 1] != ']' &&
         prefix[start - 1] != '>' && prefix[start - 1] != '\\')
    --start;
  // A JSON log's "\n" escape before the name: the 'n' belongs to the escape.
  if (start > 0 && prefix[start - 1] == '\\' && start + 1 < end) ++start;
  std::string_view word = prefix.substr(start, end - 1 - start);
  if (word.find("Error") == std::string_view::npos || word.size() > 80) return {};
  return std::string(word);
}

// Where the next message starts on `line` after the one starting at `pos` (npos: none). A
// message begun by its backend's words owns the first "Tried to allocate" after them; a quoted
// one (`quoted`) starts at its own.
std::size_t NextStart(std::string_view line, std::size_t pos, bool quoted) {
  std::size_t from = pos + 1;
  if (!quoted) {
    const Trigger backend = FindTrigger(line.substr(from), false);
    const std::size_t own = line.find(kTried, from);
    if (own == std::string_view::npos ||
        (backend.pos != std::string_view::npos && from + backend.pos < own)) {
      return backend.pos == std::string_view::npos ? backend.pos : from + backend.pos;
    }
    from = own + 1;
  }
  const Trigger next = FindTrigger(line.substr(from));
  return next.pos == std::string_view::npos ? next.pos : from + next.pos;
}

// ---- Continuation lines ---------------------------------------------------------------------

// A token of date/time characters with a digit ("2024-05-01", "12:00:03,123", "T12:00:03Z").
bool IsTimestampToken(std::string_view token) {
  if (token.size() < 4 || token.size() > 40) return false;
  bool digit = false;
  for (char c : token) {
    if (IsAsciiDigit(c)) {
      digit = true;
    } else if (std::strchr("-:/.,TZ+", c) == nullptr) {
      return false;
    }
  }
  return digit;
}

bool IsLevelToken(std::string_view token) {
  std::string t;
  for (char c : token) {
    if (c != ':' && c != '|' && c != '-') t += Lower(c);
  }
  for (std::string_view level :
       {"error", "err", "warning", "warn", "info", "debug", "critical", "fatal", "e", "w"}) {
    if (t == level) return true;
  }
  return false;
}

// Removes what loggers put in front of each line: whitespace, "[...]" groups ("[rank3]:",
// "[default0]:", "[2024-05-01 12:00:00]"), timestamps, level names, "|", "-", and the "# " /
// "> " of commented or quoted text. Bounded: at most 12 pieces.
std::string_view StripLogPrefix(std::string_view line) {
  for (int round = 0; round < 12; ++round) {
    std::size_t i = 0;
    while (i < line.size() && IsSpace(line[i])) ++i;
    line.remove_prefix(i);
    if (line.empty()) return line;
    if (line[0] == '[') {
      const std::size_t close = line.find(']');
      if (close == std::string_view::npos || close > 64) return line;
      line.remove_prefix(close + 1);
      if (!line.empty() && line[0] == ':') line.remove_prefix(1);
      continue;
    }
    if (line[0] == '#' || line[0] == '>' || line[0] == '|') {
      line.remove_prefix(1);
      continue;
    }
    std::size_t end = 0;
    while (end < line.size() && !IsSpace(line[end])) ++end;
    const std::string_view token = line.substr(0, end);
    // A figure wrapped to the start of the line ("12.44 MiB free; ...") is text, not a
    // timestamp: a size unit follows it.
    if (IsTimestampToken(token)) {
      std::size_t used = 0;
      std::string_view rest = line.substr(end);
      while (!rest.empty() && IsSpace(rest[0])) rest.remove_prefix(1);
      if (!rest.empty() && IsAlpha(rest[0]) &&
          ParsePrintedSize(std::string(token) + " " + std::string(rest.substr(0, 8)), &used)) {
        return line;
      }
    }
    if (IsTimestampToken(token) || IsLevelToken(token) || token == "-") {
      line.remove_prefix(end);
      continue;
    }
    return line;
  }
  return line;
}

// A line that starts something else: a traceback, a new log record's traceback frame, etc.
bool EndsMessage(std::string_view stripped) {
  if (stripped.empty()) return true;
  for (std::string_view start :
       {"Traceback (most recent call last)", "File \"", "During handling of the above exception",
        "The above exception was the direct cause", "Exception raised"}) {
    if (stripped.substr(0, start.size()) == start) return true;
  }
  return false;
}

// ---- Figures ----------------------------------------------------------------------------------

// The size that ends exactly at `end` ("... 7.93 GiB" before " total capacity").
std::optional<std::uint64_t> SizeBefore(std::string_view text, std::size_t end) {
  std::size_t i = end;
  while (i > 0 && IsAlpha(text[i - 1]) && end - i < 6) --i;  // the unit
  if (i == end) return std::nullopt;
  if (i > 0 && text[i - 1] == ' ') --i;
  std::size_t start = i;
  while (start > 0 && (IsAsciiDigit(text[start - 1]) || text[start - 1] == '.') && i - start < 32) {
    --start;
  }
  if (start == i) return std::nullopt;
  std::size_t used = 0;
  std::optional<std::uint64_t> v = ParsePrintedSize(text.substr(start, end - start), &used);
  if (!v || start + used != end) return std::nullopt;
  return v;
}

std::optional<std::uint64_t> SizeAfter(std::string_view text, std::size_t pos) {
  if (pos > text.size()) return std::nullopt;
  std::size_t used = 0;
  return ParsePrintedSize(text.substr(pos), &used);
}

// The size before the first `phrase` in text (from `from`).
std::optional<std::uint64_t> SizeBeforePhrase(std::string_view text, std::string_view phrase,
                                              std::size_t from = 0) {
  const std::size_t p = text.find(phrase, from);
  if (p == std::string_view::npos) return std::nullopt;
  return SizeBefore(text, p);
}

// The size after the first `phrase` in text.
std::optional<std::uint64_t> SizeAfterPhrase(std::string_view text, std::string_view phrase) {
  const std::size_t p = text.find(phrase);
  if (p == std::string_view::npos) return std::nullopt;
  return SizeAfter(text, p + phrase.size());
}

void ReadFigures(OomMessage* m) {
  const std::string_view t = m->text;
  m->tried = SizeAfterPhrase(t, "Tried to allocate ");
  // "GPU 3" of either wording.
  for (std::size_t p = t.find("GPU "); p != std::string_view::npos; p = t.find("GPU ", p + 4)) {
    std::size_t end = 0;
    if (std::optional<std::int64_t> gpu = ParseInt(t, p + 4, &end)) {
      m->gpu = gpu;
      break;
    }
  }
  // Classic: "(GPU 0; 7.93 GiB total capacity; 130.35 MiB already allocated; 47.06 MiB free;
  // [X allowed; ]188.00 MiB reserved in total by PyTorch)".
  const std::size_t classic = t.find(" total capacity;");
  if (classic != std::string_view::npos) {
    m->wording = OomWording::kClassic;
    m->total = SizeBefore(t, classic);
    m->allocated = SizeBeforePhrase(t, " already allocated", classic);
    m->free = SizeBeforePhrase(t, " free;", classic);
    m->reserved = SizeBeforePhrase(t, " reserved in total by PyTorch", classic);
    // 1.0-1.3: "...; {F} free; {M} cached)", M = reserved but unallocated (the cache's free
    // blocks), so reserved = A + M (MessageReserved).
    if (!m->reserved) m->unallocated = SizeBeforePhrase(t, " cached)", classic);
  }
  // Newer: "GPU 0 has a total capacity of T of which F is free. ..." (2.1 printed "capacty").
  const std::size_t capacity_of = t.find(" has a total capac");
  if (capacity_of != std::string_view::npos) {
    m->wording = OomWording::kCapacityOf;
    const std::size_t of = t.find(" of ", capacity_of + 18);
    if (of != std::string_view::npos && of < capacity_of + 30) m->total = SizeAfter(t, of + 4);
    m->free = SizeAfterPhrase(t, " of which ");
    m->this_process = SizeAfterPhrase(t, "this process has ");
    m->allocated = SizeAfterPhrase(t, "Of the allocated memory ");
    m->private_pools = SizeBeforePhrase(t, " allocated in private pools");
    m->unallocated = SizeBeforePhrase(t, " is reserved by PyTorch but unallocated");
    // "Process 1234 has 3.00 GiB memory in use." for each other process NVML lists.
    for (std::size_t p = t.find("Process "); p != std::string_view::npos;
         p = t.find("Process ", p + 8)) {
      std::size_t end = 0;
      std::optional<std::int64_t> pid = ParseInt(t, p + 8, &end);
      if (!pid || t.substr(end, 5) != " has ") continue;
      std::size_t used = 0;
      std::optional<std::uint64_t> bytes = ParsePrintedSize(t.substr(end + 5), &used);
      if (!bytes || t.substr(end + 5 + used, 14) != " memory in use") continue;
      if (m->processes.size() < 256) {
        m->processes.push_back({static_cast<std::uint64_t>(*pid), *bytes});
      }
    }
  }
  m->allowed = SizeBeforePhrase(t, " allowed;");
  m->hint_max_split = t.find("max_split_size_mb") != std::string_view::npos;
  m->hint_expandable = t.find("expandable_segments:True") != std::string_view::npos;
}

}  // namespace

// ---- Sizes ------------------------------------------------------------------------------------

std::optional<std::uint64_t> ParsePrintedSize(std::string_view text, std::size_t* used) {
  std::size_t i = 0;
  std::uint64_t whole = 0;
  std::size_t digits = 0;
  while (i < text.size() && IsAsciiDigit(text[i])) {
    if (++digits > 19) return std::nullopt;
    whole = whole * 10 + static_cast<std::uint64_t>(text[i++] - '0');
  }
  if (digits == 0) return std::nullopt;
  double fraction = 0;
  if (i + 1 < text.size() && text[i] == '.' && IsAsciiDigit(text[i + 1])) {
    double scale = 0.1;
    ++i;
    std::size_t fraction_digits = 0;
    while (i < text.size() && IsAsciiDigit(text[i])) {
      if (++fraction_digits > 12) return std::nullopt;
      fraction += scale * (text[i++] - '0');
      scale /= 10;
    }
  }
  if (i < text.size() && text[i] == ' ') ++i;
  std::size_t u = i;
  while (u < text.size() && IsAlpha(text[u]) && u - i < 6) ++u;
  const std::string_view unit = text.substr(i, u - i);
  if (u < text.size() && IsAlpha(text[u])) return std::nullopt;  // a longer word
  int shift = -1;
  if (unit == "bytes" || unit == "byte" || unit == "B") shift = 0;
  if (unit == "KiB") shift = 10;
  if (unit == "MiB") shift = 20;
  if (unit == "GiB") shift = 30;
  if (unit == "TiB") shift = 40;
  if (unit == "PiB") shift = 50;
  if (shift < 0) return std::nullopt;
  const long double value = (static_cast<long double>(whole) + fraction) * std::ldexp(1.0L, shift);
  // Beyond 1 EiB is not a real figure; the cap also keeps sums of a few figures from
  // overflowing in the verdict's arithmetic.
  if (!(value < std::ldexp(1.0L, 60))) return std::nullopt;
  *used = u;
  return static_cast<std::uint64_t>(std::llround(static_cast<double>(value)));
}

// ---- Scanner ----------------------------------------------------------------------------------

void OomTextScanner::AddLine(std::string_view line) {
  ++scan_.lines;
  scan_.bytes += line.size() + 1;
  if (line.size() > limits_.max_line_bytes) {
    line = line.substr(0, limits_.max_line_bytes);
    ++scan_.cut_lines;
  }
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  // A line may go on with an open message that still lacks its "Tried to allocate" ("CUDA
  // out of memory." wrapped before it): there that phrase continues, not starts, a message.
  const bool bare =
      !open_ || open_->complete || open_->may_end || open_->raw.find(kTried) != std::string::npos;
  const Trigger trigger = FindTrigger(line, bare);
  if (open_) {
    const std::string_view stripped = StripLogPrefix(line);
    const bool continues =
        trigger.pos == std::string_view::npos && !open_->complete && !EndsMessage(stripped) &&
        (!open_->may_end || stripped.substr(0, 3) == "If " || stripped.substr(0, 4) == "See " ||
         stripped.substr(0, 14) == "fragmentation.");
    if (continues && open_->lines < limits_.max_message_lines) {
      Append(stripped);
      ++open_->lines;
      open_->message.last_line = scan_.lines;
      return;
    }
    Close(continues);  // cut at max_message_lines: truncated
  }
  if (trigger.pos == std::string_view::npos) return;
  // Several messages on one line (JSON logs): each from its trigger to the next.
  std::size_t pos = trigger.pos;
  std::string_view backend = trigger.backend;
  while (true) {
    const std::size_t next = NextStart(line, pos, backend.empty());
    if (next == std::string_view::npos) {
      Start(line, pos, backend);
      return;
    }
    Start(line.substr(0, next), pos, backend);
    Close(false);
    pos = next;
    backend = FindTrigger(line.substr(pos)).backend;
  }
}

void OomTextScanner::Start(std::string_view line, std::size_t trigger, std::string_view backend) {
  open_.emplace();
  OomMessage& m = open_->message;
  m.line = scan_.lines;
  m.last_line = scan_.lines;
  m.backend = std::string(backend);
  m.rank = FindRank(line.substr(0, trigger));
  m.exception = ExceptionName(line.substr(0, trigger));
  open_->lines = 1;
  Append(line.substr(trigger));
}

// Appends text with whitespace runs, "\n"/"\t" escapes (JSON logs) and line joins turned into
// one space. A message that reaches its end marker is complete; the rest of the line is kept
// only up to it plus the documentation link.
void OomTextScanner::Append(std::string_view text) {
  std::string& raw = open_->raw;
  bool capped = false;
  if (!raw.empty() && raw.back() != ' ') raw += ' ';
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (raw.size() >= limits_.max_message_bytes) {
      capped = true;
      break;
    }
    char c = text[i];
    if (c == '\\' && i + 1 < text.size() &&
        (text[i + 1] == 'n' || text[i + 1] == 't' || text[i + 1] == 'r')) {
      c = ' ';
      ++i;
    }
    if (IsSpace(c) || c == '\n') {
      if (!raw.empty() && raw.back() != ' ') raw += ' ';
      continue;
    }
    raw += c;
  }
  // The end of the message: the newest wording's documentation link, the classic and 2.1
  // wordings' "PYTORCH_CUDA_ALLOC_CONF" (ROCm builds: "PYTORCH_HIP_ALLOC_CONF"), XPU's
  // empty_cache advice. Anything after it on the line is not part of the message.
  constexpr std::string_view kCudaConfEnd = "Management and PYTORCH_CUDA_ALLOC_CONF";
  constexpr std::string_view kHipConfEnd = "Management and PYTORCH_HIP_ALLOC_CONF";
  // Newer releases link other anchors ("…/notes/cuda.html#optimizing-memory-usage-with-
  // pytorch-cuda-alloc-conf)", docs.pytorch.org): the link in parentheses after "Memory
  // Management" ends the message whatever its address.
  constexpr std::string_view kLinkStart = "See documentation for Memory Management (http";
  const std::size_t link_start = raw.find(kLinkStart);
  const std::size_t link_end = link_start == std::string::npos
                                   ? std::string::npos
                                   : raw.find(')', link_start + kLinkStart.size());
  if (const std::size_t link = raw.find("#environment-variables)"); link != std::string::npos) {
    raw.resize(link + 23);
    open_->complete = true;
  } else if (link_end != std::string::npos) {
    raw.resize(link_end + 1);
    open_->complete = true;
  } else if (const std::size_t conf = raw.find(kCudaConfEnd); conf != std::string::npos) {
    raw.resize(conf + kCudaConfEnd.size());
    open_->complete = true;
  } else if (const std::size_t hip = raw.find(kHipConfEnd); hip != std::string::npos) {
    raw.resize(hip + kHipConfEnd.size());
    open_->complete = true;
  } else if (const std::size_t xpu = raw.find("unoccupied cached memory.");
             xpu != std::string::npos) {
    raw.resize(xpu + 25);
    open_->complete = true;
  }
  if (capped && !open_->complete) {
    open_->message.text_truncated = true;
    open_->complete = true;
  }
  if (raw.find("reserved in total by PyTorch)") != std::string::npos ||
      (raw.find(" total capacity;") != std::string::npos &&
       raw.find(" cached)") != std::string::npos)) {
    open_->may_end = true;  // the classic wording's end (1.0-1.3: "... cached)")
  }
  if (raw.find("CUDA error: out of memory") == 0) open_->complete = true;  // no figures follow
}

void OomTextScanner::Close(bool truncated) {
  if (!open_) return;
  Open open = std::move(*open_);
  open_.reset();
  OomMessage m = std::move(open.message);
  while (!open.raw.empty() && open.raw.back() == ' ') open.raw.pop_back();
  m.text = std::move(open.raw);
  m.text_truncated = m.text_truncated || truncated;
  if (m.backend.empty()) {
    m.quoted = true;
    m.backend = std::string(BackendOfQuoted(m.text));
  }
  ReadFigures(&m);
  std::string key = fmt::format("{}\x1f{}", m.rank ? *m.rank : -1, m.text);
  if (auto it = seen_.find(key); it != seen_.end()) {
    OomMessage& first = scan_.messages[it->second];
    ++first.repeats;
    if (first.repeat_lines.size() < 20) first.repeat_lines.push_back(m.line);
    return;
  }
  if (scan_.messages.size() >= limits_.max_messages) {
    ++scan_.dropped_messages;
    return;
  }
  seen_.emplace(std::move(key), scan_.messages.size());
  scan_.messages.push_back(std::move(m));
}

OomTextScan OomTextScanner::Finish() {
  if (open_) Close(!open_->complete && !open_->may_end);
  return std::move(scan_);
}

OomTextScan ScanOomText(std::string_view text, const OomTextLimits& limits) {
  OomTextScanner scanner(limits);
  while (!text.empty()) {
    const std::size_t nl = text.find('\n');
    scanner.AddLine(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return scanner.Finish();
}

Result<OomTextScan> ReadOomText(const std::string& path, const OomTextLimits& limits,
                                const std::function<void(std::string_view)>& also) {
  // "-", FIFOs and pipes as every input (OpenFileSource): read once, bounded by
  // --max-input-bytes.
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource(path);
  if (!source.ok()) return source.status();
  const std::string name = path == "-" ? std::string("standard input") : path;
  OomTextScanner scanner(limits);
  std::string line;  // the current line, at most max_line_bytes + 1 kept
  bool cut = false;
  std::vector<char> buffer(64 * 1024);
  while (true) {
    Result<std::size_t> n = (*source)->Read(buffer.data(), buffer.size());
    if (!n.ok()) return n.status().WithPrefix(name);
    if (*n == 0) break;
    std::string_view chunk(buffer.data(), *n);
    while (!chunk.empty()) {
      const std::size_t nl = chunk.find('\n');
      const std::string_view part = chunk.substr(0, nl);
      if (!cut) {
        const std::size_t room = limits.max_line_bytes + 1 - line.size();
        line.append(part.substr(0, room));
        // Keep one byte more than the limit so the scanner counts the line as cut.
        cut = line.size() > limits.max_line_bytes;
      }
      if (nl == std::string_view::npos) break;
      scanner.AddLine(line);
      if (also) also(line);
      line.clear();
      cut = false;
      chunk.remove_prefix(nl + 1);
    }
  }
  if (!line.empty()) {  // a last line without '\n'
    scanner.AddLine(line);
    if (also) also(line);
  }
  return scanner.Finish();
}

}  // namespace fragscope::sources
