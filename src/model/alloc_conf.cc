#include "model/alloc_conf.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "common/did_you_mean.h"
#include "common/terminal_text.h"

namespace fragscope::model {
namespace {

// ---- Constants and the key table ------------------------------------------------------------

constexpr std::string_view kEnvName = "PYTORCH_CUDA_ALLOC_CONF";
// PyTorch up to 2.8 reads most integers with std::stoi: larger values throw out_of_range there.
constexpr std::uint64_t kStoiMax = std::numeric_limits<std::int32_t>::max();
constexpr std::uint64_t kUint64Max = std::numeric_limits<std::uint64_t>::max();
// PyTorch clamps *_mb values to SIZE_MAX / 1 MiB so that the product fits in size_t.
constexpr std::uint64_t kMaxMib = kUint64Max / kMiB;
constexpr std::uint64_t kLargeBufferMib = kLargeBuffer / kMiB;  // 20
constexpr std::uint64_t kMaxRegisterThreads = 128;              // pinned_max_register_threads()
constexpr std::uint64_t kMaxRulesDivisions = std::uint64_t{1} << 31;

enum class Key {
  kBackend,
  kMaxSplitSize,
  kMaxNonSplitRounding,
  kRoundupPower2Divisions,
  kRoundupBypassThreshold,
  kGarbageCollectionThreshold,
  kExpandableSegments,
  kReleaseLockOnCudaMalloc,
  kPinnedUseCudaHostRegister,
  kPinnedNumRegisterThreads,
  kPinnedUseBackgroundThreads,
  kPinnedReserveSegmentSize,
  kPinnedFreeCatchAll,
  kGraphCaptureRecordStreamReuse,
  kPerProcessMemoryFraction,
  kThrowOnCudaMallocOom,
  kExpandableSegmentsReserve,
  kExpandableSegmentsReserveByClass,
};

struct KeyInfo {
  std::string_view name;
  Key key;
  ConfigVersion first;  // oldest modelled version that knows the key
  ConfigVersion last;   // newest modelled version that knows it
  bool alias;           // a ROCm spelling PyTorch also accepts on CUDA; not listed in errors
  std::string_view history;
};

constexpr ConfigVersion k113 = ConfigVersion::kV1_13;
constexpr ConfigVersion k2 = ConfigVersion::kV2;
constexpr ConfigVersion kNew = ConfigVersion::kNewest;

// The order is ToConfString's and the "known keys" list's. Versions in `history` that the
// three ConfigVersions cannot express (e.g. 2.6) are what the sources read for the spec say.
constexpr KeyInfo kKeys[] = {
    {"backend", Key::kBackend, k113, kNew, false, ""},
    {"max_split_size_mb", Key::kMaxSplitSize, k113, kNew, false, ""},
    {"max_non_split_rounding_mb", Key::kMaxNonSplitRounding, kNew, kNew, false,
     "added in PyTorch 2.6"},
    {"roundup_power2_divisions", Key::kRoundupPower2Divisions, k113, kNew, false, ""},
    {"roundup_bypass_threshold_mb", Key::kRoundupBypassThreshold, k113, k113, false,
     "PyTorch 1.13 only; 2.0 replaced it with roundup_power2_divisions:[...]"},
    {"garbage_collection_threshold", Key::kGarbageCollectionThreshold, k113, kNew, false, ""},
    {"expandable_segments", Key::kExpandableSegments, k2, kNew, false, "added in PyTorch 2.1"},
    {"release_lock_on_cudamalloc", Key::kReleaseLockOnCudaMalloc, k2, kNew, false,
     "added in PyTorch 2.x"},
    {"release_lock_on_hipmalloc", Key::kReleaseLockOnCudaMalloc, k2, kNew, true, ""},
    {"pinned_use_cuda_host_register", Key::kPinnedUseCudaHostRegister, k2, kNew, false,
     "added in PyTorch 2.x"},
    {"pinned_use_hip_host_register", Key::kPinnedUseCudaHostRegister, k2, kNew, true, ""},
    {"pinned_num_register_threads", Key::kPinnedNumRegisterThreads, k2, kNew, false,
     "added in PyTorch 2.x"},
    {"pinned_use_background_threads", Key::kPinnedUseBackgroundThreads, kNew, kNew, false,
     "added after PyTorch 2.5"},
    {"pinned_reserve_segment_size_mb", Key::kPinnedReserveSegmentSize, kNew, kNew, false,
     "added after PyTorch 2.5"},
    {"pinned_free_catch_all", Key::kPinnedFreeCatchAll, kNew, kNew, false, "newest PyTorch only"},
    {"graph_capture_record_stream_reuse", Key::kGraphCaptureRecordStreamReuse, kNew, kNew, false,
     "added after PyTorch 2.5"},
    {"per_process_memory_fraction", Key::kPerProcessMemoryFraction, kNew, kNew, false,
     "added in PyTorch 2.9"},
    {"throw_on_cudamalloc_oom", Key::kThrowOnCudaMallocOom, kNew, kNew, false,
     "newest PyTorch only"},
    {"expandable_segments_reserve", Key::kExpandableSegmentsReserve, kNew, kNew, false,
     "newest PyTorch only"},
    {"expandable_segments_reserve_by_class", Key::kExpandableSegmentsReserveByClass, kNew, kNew,
     false, "newest PyTorch only"},
};

bool Knows(const KeyInfo& info, ConfigVersion version) {
  return info.first <= version && version <= info.last;
}

const KeyInfo* FindKey(std::string_view name) {
  for (const KeyInfo& info : kKeys) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

std::string_view CanonicalName(Key key) {
  for (const KeyInfo& info : kKeys) {
    if (info.key == key && !info.alias) return info.name;
  }
  return "?";
}

// ---- Messages ---------------------------------------------------------------------------------

// `text` cut after 48 bytes, with control characters and bytes that are not UTF-8 as \xNN
// (common/terminal_text.h), and quotes and backslashes too: tokens come from untrusted input and
// end up quoted in messages and logs.
std::string Escape(std::string_view text) {
  constexpr std::size_t kMaxShown = 48;
  std::string out;
  AppendTerminalSafe(text.substr(0, kMaxShown), TerminalEscape::kField, &out, "\\'");
  if (text.size() > kMaxShown) out += "...";
  return out;
}

std::string Quote(std::string_view text) { return "'" + Escape(text) + "'"; }

// "<env>: <what> (at offset <n>[; PyTorch: <pytorch>])".
Status Error(std::string_view what, std::size_t offset, std::string_view pytorch = {}) {
  std::string message = fmt::format("{}: {} (at offset {}", kEnvName, what, offset);
  if (!pytorch.empty()) message += fmt::format("; PyTorch: {}", pytorch);
  message += ")";
  return Status::InvalidArgument(std::move(message));
}

std::vector<std::string> KnownKeys(ConfigVersion version) {
  std::vector<std::string> keys;
  for (const KeyInfo& info : kKeys) {
    if (!info.alias && Knows(info, version)) keys.emplace_back(info.name);
  }
  return keys;
}

Status UnrecognizedKey(std::string_view name, std::size_t offset, ConfigVersion version) {
  const std::vector<std::string> known = KnownKeys(version);
  std::string message = fmt::format("{}: unrecognized key {} at offset {}{}", kEnvName, Quote(name),
                                    offset, DidYouMean(name, known));
  if (const KeyInfo* info = FindKey(name); info != nullptr && !info->history.empty()) {
    message += fmt::format(" ({} does not have it: {})", ConfigVersionName(version), info->history);
  }
  message += fmt::format(" (known keys: {}; PyTorch: ", fmt::join(known, ", "));
  if (version == ConfigVersion::kNewest) {
    message += fmt::format("Unrecognized key {} in CUDA allocator config.)", Quote(name));
  } else {
    message += fmt::format("Unrecognized CachingAllocator option: {})", Escape(name));
  }
  return Status::InvalidArgument(std::move(message));
}

// ---- Tokens -----------------------------------------------------------------------------------

enum class TokenKind { kWord, kColon, kComma, kOpen, kClose };

struct Token {
  TokenKind kind = TokenKind::kWord;
  std::string text;        // words: the bytes without whitespace
  std::size_t offset = 0;  // byte offset of the first byte in the conf string
};

bool IsSpace(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\v' || c == '\f' || c == '\r';
}

// PyTorch 2.x's lexer: ',' ':' '[' ']' are tokens of their own, whitespace is dropped
// everywhere (so "max split" reads as "maxsplit"), everything else accumulates into words.
std::vector<Token> Tokenize(std::string_view conf) {
  std::vector<Token> tokens;
  Token word;
  bool in_word = false;
  auto flush = [&] {
    if (in_word) tokens.push_back(std::move(word));
    word = Token();
    in_word = false;
  };
  for (std::size_t i = 0; i < conf.size(); ++i) {
    const char c = conf[i];
    TokenKind kind;
    switch (c) {
      case ':':
        kind = TokenKind::kColon;
        break;
      case ',':
        kind = TokenKind::kComma;
        break;
      case '[':
        kind = TokenKind::kOpen;
        break;
      case ']':
        kind = TokenKind::kClose;
        break;
      default:
        if (!IsSpace(c)) {
          if (!in_word) word.offset = i;
          in_word = true;
          word.text += c;
        }
        continue;
    }
    flush();
    tokens.push_back(Token{kind, std::string(1, c), i});
  }
  flush();
  return tokens;
}

// ---- Values -----------------------------------------------------------------------------------

// A non-negative decimal integer <= max. PyTorch's stoi/stoull also take a sign, leading
// junk-free prefixes ("128MB" reads as 128) and wrap negative numbers; we reject those.
Result<std::uint64_t> ParseUint(std::string_view key, const Token& value, std::uint64_t max) {
  const std::string& text = value.text;
  const bool digits = !text.empty() && std::all_of(text.begin(), text.end(),
                                                   [](char c) { return c >= '0' && c <= '9'; });
  if (!digits) {
    return Error(fmt::format("{}: {} is not a non-negative integer", key, Quote(text)),
                 value.offset);
  }
  std::uint64_t out = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec != std::errc() || out > max) {
    return Error(fmt::format("{}: {} is out of range (at most {})", key, text, max), value.offset);
  }
  return out;
}

// A decimal floating-point number as std::from_chars reads it (no sign '+', no hex).
Result<double> ParseDouble(std::string_view key, const Token& value) {
  const std::string& text = value.text;
  double out = 0.0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (ec == std::errc::result_out_of_range) {
    return Error(fmt::format("{}: {} is out of range", key, Quote(text)), value.offset);
  }
  if (ec != std::errc() || ptr != text.data() + text.size()) {
    return Error(fmt::format("{}: {} is not a number", key, Quote(text)), value.offset);
  }
  return out;
}

// expandable_segments_reserve values: "<fraction>" or "<GiB>G". PyTorch ignores a malformed
// value with a warning (keeping the default) instead of failing, so this returns nullopt.
std::optional<ExpandableSegmentsReserve> ParseReserve(std::string_view text) {
  const bool gib = !text.empty() && (text.back() == 'G' || text.back() == 'g');
  if (gib) text.remove_suffix(1);
  double value = 0.0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || ec != std::errc() || ptr != text.data() + text.size()) return std::nullopt;
  // Also rejects inf and nan, as PyTorch does.
  if (!(value > 0.0 && value <= std::numeric_limits<double>::max())) return std::nullopt;
  return ExpandableSegmentsReserve{!gib, value};
}

// ---- Parser -----------------------------------------------------------------------------------

class Parser {
 public:
  Parser(std::string_view conf, ConfigVersion version, const AllocatorConfig& previous,
         bool load_time)
      : conf_(conf), version_(version), config_(previous), load_time_(load_time) {}

  Result<AllocatorConfig> Run() {
    if (conf_.size() > kMaxAllocatorConfBytes) {
      return Status::LimitExceeded(fmt::format("{}: the string is {} bytes, above the limit of {}",
                                               kEnvName, conf_.size(), kMaxAllocatorConfBytes));
    }
    // Every parse starts by resetting these, whatever the string says: PyTorch's parseArgs does
    // it before it looks at the string, so _set_allocator_settings("") resets them too.
    const AllocatorConfig defaults;
    config_.max_split_size = defaults.max_split_size;
    config_.roundup_power2_divisions = defaults.roundup_power2_divisions;
    config_.roundup_bypass_threshold = defaults.roundup_bypass_threshold;
    config_.garbage_collection_threshold = defaults.garbage_collection_threshold;
    const Status status = version_ == ConfigVersion::kV1_13 ? ParseV113() : ParseTokens();
    if (!status.ok()) return status;
    return std::move(config_);
  }

 private:
  bool Newest() const { return version_ == ConfigVersion::kNewest; }

  // Wording of the 2.x parser's structure checks. The newest ConfigTokenizer does not enforce
  // ':' and ',' (its checkToken result is ignored) and has no such message.
  std::string_view Before29(std::string_view wording) const { return Newest() ? "" : wording; }

  std::string MissingValueWording(Key key) const {
    if (Newest()) return "";  // newest: an out-of-bounds assert or a bare std::stoull error
    const std::string_view name = CanonicalName(key);
    switch (key) {
      case Key::kBackend:
        return "Error parsing backend value";
      case Key::kExpandableSegments:
      case Key::kReleaseLockOnCudaMalloc:
        return fmt::format("Expected a single True/False argument for {}", name);
      default:
        return fmt::format("Error, expecting {} value", name);
    }
  }

  // -- PyTorch 1.13: split on runs of [\s,]+, then each option on runs of ':'. An option with
  // nothing after the colons (or no colon) is ignored, as kv.size() < 2 is there.
  Status ParseV113() {
    std::size_t i = 0;
    while (i < conf_.size()) {
      if (conf_[i] == ',' || IsSpace(conf_[i])) {
        ++i;
        continue;
      }
      std::size_t end = i;
      while (end < conf_.size() && conf_[end] != ',' && !IsSpace(conf_[end])) ++end;
      const std::string_view option = conf_.substr(i, end - i);
      const std::size_t colon = option.find(':');
      const std::size_t value_start =
          colon == std::string_view::npos ? option.size() : option.find_first_not_of(':', colon);
      if (colon != std::string_view::npos && value_start != std::string_view::npos) {
        const Token key{TokenKind::kWord, std::string(option.substr(0, colon)), i};
        const Token value{TokenKind::kWord, std::string(option.substr(value_start)),
                          i + value_start};
        const KeyInfo* info = FindKey(key.text);
        if (info == nullptr || !Knows(*info, version_)) {
          return UnrecognizedKey(key.text, key.offset, version_);
        }
        if (value.text.front() == '[') {
          return Error(fmt::format("{}: list values need PyTorch 2.0 or later", info->name),
                       value.offset);
        }
        FRAGSCOPE_RETURN_IF_ERROR(ApplyScalar(*info, value, /*token_index=*/0));
      }
      i = end;
    }
    return Status::Ok();
  }

  // -- PyTorch 2.x and newest: key ':' value (',' key ':' value)* [','].
  Status ParseTokens() {
    tokens_ = Tokenize(conf_);
    std::size_t i = 0;
    while (i < tokens_.size()) {
      const Token& key = tokens_[i];
      if (key.kind != TokenKind::kWord) {
        return Error(
            fmt::format("expected a key, found {}", Quote(key.text)), key.offset,
            Newest() ? fmt::format("Unrecognized key {} in CUDA allocator config.", Quote(key.text))
                     : fmt::format("Unrecognized CachingAllocator option: {}", Escape(key.text)));
      }
      const KeyInfo* info = FindKey(key.text);
      if (info == nullptr || !Knows(*info, version_)) {
        return UnrecognizedKey(key.text, key.offset, version_);
      }
      if (!Is(i + 1, TokenKind::kColon)) {
        return Error(fmt::format("expected ':' after {}, found {}", info->name, Found(i + 1)),
                     OffsetOf(i + 1),
                     Before29("Error parsing CachingAllocator settings, expected :"));
      }
      Result<std::size_t> next = ApplyValue(*info, i + 2);
      if (!next.ok()) return next.status();
      i = *next;
      if (i < tokens_.size()) {
        // One trailing ',' is fine in every 2.x version ("expandable_segments:False," is in
        // PyTorch's AllocatorConfig_test); ",," is an empty key.
        if (!Is(i, TokenKind::kComma)) {
          return Error(
              fmt::format("expected ',' after the value of {}, found {}", info->name, Found(i)),
              OffsetOf(i), Before29("Error parsing CachingAllocator settings, expected ,"));
        }
        ++i;
      }
    }
    return Status::Ok();
  }

  bool Is(std::size_t i, TokenKind kind) const {
    return i < tokens_.size() && tokens_[i].kind == kind;
  }
  std::size_t OffsetOf(std::size_t i) const {
    return i < tokens_.size() ? tokens_[i].offset : conf_.size();
  }
  std::string Found(std::size_t i) const {
    return i < tokens_.size() ? Quote(tokens_[i].text) : std::string("the end");
  }

  // Parses the value that starts at token `i`; returns the index after it.
  Result<std::size_t> ApplyValue(const KeyInfo& info, std::size_t i) {
    if (info.key == Key::kRoundupPower2Divisions && Is(i, TokenKind::kOpen)) {
      return ApplyDivisionsList(i);
    }
    if (info.key == Key::kExpandableSegmentsReserveByClass) return ApplyReserveByClass(i);
    if (Is(i, TokenKind::kOpen)) {
      return Error(fmt::format("{}: expected a single value, found a list", info.name),
                   OffsetOf(i));
    }
    if (!Is(i, TokenKind::kWord)) {
      return Error(fmt::format("{}: missing value, found {}", info.name, Found(i)), OffsetOf(i),
                   MissingValueWording(info.key));
    }
    FRAGSCOPE_RETURN_IF_ERROR(ApplyScalar(info, tokens_[i], i));
    return i + 1;
  }

  // One scalar value; `token_index` is its index in PyTorch's token list (for its wording).
  Status ApplyScalar(const KeyInfo& info, const Token& value, std::size_t token_index) {
    const std::string_view name = CanonicalName(info.key);
    const std::uint64_t int_max = Newest() ? kUint64Max : kStoiMax;
    switch (info.key) {
      case Key::kBackend: {
        AllocatorBackend backend;
        if (value.text == "native") {
          backend = AllocatorBackend::kNative;
        } else if (value.text == "cudaMallocAsync") {
          backend = AllocatorBackend::kCudaMallocAsync;
        } else {
          return Error(
              fmt::format("backend: {} is not native or cudaMallocAsync", Quote(value.text)),
              value.offset, "Unknown allocator backend, options are native and cudaMallocAsync");
        }
        // PyTorch picks the allocator once, from the environment; a later parse may only
        // repeat that choice.
        if (!load_time_ && backend != config_.backend) {
          return Error(
              fmt::format(
                  "backend: {} differs from the backend chosen at process "
                  "start ({}); it cannot change at run time",
                  Quote(value.text),
                  config_.backend == AllocatorBackend::kNative ? "native" : "cudaMallocAsync"),
              value.offset,
              "Allocator backend parsed at runtime != allocator backend parsed at load "
              "time");
        }
        config_.backend = backend;
        return Status::Ok();
      }
      case Key::kMaxSplitSize:
      case Key::kMaxNonSplitRounding: {
        Result<std::uint64_t> mib = ParseUint(name, value, int_max);
        if (!mib.ok()) return mib.status();
        // Newest PyTorch requires >= 20; up to 2.8 the check was > 20 (its message said ">="
        // in some releases, the comparison did not).
        if (Newest() ? *mib < kLargeBufferMib : *mib <= kLargeBufferMib) {
          const std::string pytorch =
              fmt::format("CachingAllocator option {} too small, must be {} {}", name,
                          Newest() ? ">=" : ">", kLargeBufferMib);
          if (Newest()) {
            return Error(
                fmt::format("{}: {} is below the minimum {}", name, value.text, kLargeBufferMib),
                value.offset, pytorch);
          }
          return Error(
              fmt::format("{}: {} must be greater than {}", name, value.text, kLargeBufferMib),
              value.offset, pytorch);
        }
        const std::uint64_t bytes = std::min(*mib, kMaxMib) * kMiB;
        (info.key == Key::kMaxSplitSize ? config_.max_split_size : config_.max_non_split_rounding) =
            bytes;
        return Status::Ok();
      }
      case Key::kRoundupPower2Divisions: {
        Result<std::uint64_t> divisions = ParseUint(name, value, int_max);
        if (!divisions.ok()) return divisions.status();
        // The single-value form never allowed 0 (unlike list entries).
        if (!std::has_single_bit(*divisions)) {
          return Error(fmt::format("roundup_power2_divisions: {} is not a power of 2", value.text),
                       value.offset,
                       version_ == ConfigVersion::kV1_13
                           ? "For roundups, the divisons has to be power of 2"
                           : "For roundups, the divisions has to be power of 2");
        }
        config_.roundup_power2_divisions.fill(*divisions);
        return Status::Ok();
      }
      case Key::kRoundupBypassThreshold: {
        Result<std::uint64_t> mib = ParseUint(name, value, kStoiMax);
        if (!mib.ok()) return mib.status();
        config_.roundup_bypass_threshold = *mib * kMiB;
        return Status::Ok();
      }
      case Key::kGarbageCollectionThreshold: {
        Result<double> threshold = ParseDouble(name, value);
        if (!threshold.ok()) return threshold.status();
        if (!(*threshold > 0.0 && *threshold < 1.0)) {
          std::string pytorch =
              Newest()           ? "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"
              : *threshold < 1.0 ? "garbage_collect_threshold too small, set it 0.0~1.0"
                                 : "garbage_collect_threshold too big, set it 0.0~1.0";
          return Error(fmt::format("garbage_collection_threshold: {} is not in (0, 1)", value.text),
                       value.offset, pytorch);
        }
        config_.garbage_collection_threshold = *threshold;
        return Status::Ok();
      }
      case Key::kPerProcessMemoryFraction: {
        Result<double> fraction = ParseDouble(name, value);
        if (!fraction.ok()) return fraction.status();
        if (!(*fraction >= 0.0 && *fraction <= 1.0)) {
          return Error(fmt::format("per_process_memory_fraction: {} is not in [0, 1]", value.text),
                       value.offset,
                       "per_process_memory_fraction is invalid, set it in [0.0, 1.0]");
        }
        config_.per_process_memory_fraction = *fraction;
        return Status::Ok();
      }
      case Key::kPinnedNumRegisterThreads: {
        Result<std::uint64_t> threads = ParseUint(name, value, int_max);
        if (!threads.ok()) return threads.status();
        if (!std::has_single_bit(*threads)) {
          return Error(
              fmt::format("pinned_num_register_threads: {} is not a power of 2", value.text),
              value.offset,
              fmt::format("Number of register threads has to be power of 2, got {}", *threads));
        }
        if (*threads > kMaxRegisterThreads) {
          return Error(fmt::format("pinned_num_register_threads: {} is above the maximum {}",
                                   value.text, kMaxRegisterThreads),
                       value.offset,
                       fmt::format("Number of register threads should be less than or equal "
                                   "to {}, got {}",
                                   kMaxRegisterThreads, *threads));
        }
        config_.pinned_num_register_threads = static_cast<std::uint32_t>(*threads);
        return Status::Ok();
      }
      case Key::kPinnedReserveSegmentSize: {
        Result<std::uint64_t> mib = ParseUint(name, value, int_max);
        if (!mib.ok()) return mib.status();
        if (*mib == 0) {
          return Error("pinned_reserve_segment_size_mb: 0 must be greater than 0", value.offset,
                       "Pinned reserve segment size has to be greater than 0");
        }
        config_.pinned_reserve_segment_size_mb = *mib;
        return Status::Ok();
      }
      case Key::kExpandableSegmentsReserve:
        if (auto reserve = ParseReserve(value.text)) config_.expandable_segments_reserve = reserve;
        return Status::Ok();
      case Key::kExpandableSegments:
        return ApplyBool(name, value, token_index, &config_.expandable_segments);
      case Key::kReleaseLockOnCudaMalloc:
        return ApplyBool(name, value, token_index, &config_.release_lock_on_cudamalloc);
      case Key::kPinnedUseCudaHostRegister:
        return ApplyBool(name, value, token_index, &config_.pinned_use_cuda_host_register);
      case Key::kPinnedUseBackgroundThreads:
        return ApplyBool(name, value, token_index, &config_.pinned_use_background_threads);
      case Key::kPinnedFreeCatchAll:
        return ApplyBool(name, value, token_index, &config_.pinned_free_catch_all);
      case Key::kGraphCaptureRecordStreamReuse:
        return ApplyBool(name, value, token_index, &config_.graph_capture_record_stream_reuse);
      case Key::kThrowOnCudaMallocOom:
        return ApplyBool(name, value, token_index, &config_.throw_on_cudamalloc_oom);
      case Key::kExpandableSegmentsReserveByClass:
        break;  // list-only; ApplyValue handles it
    }
    return Status::Internal(fmt::format("{}: no scalar parser for {}", kEnvName, name));
  }

  Status ApplyBool(std::string_view name, const Token& value, std::size_t token_index, bool* out) {
    if (value.text == "True" || value.text == "False") {
      *out = value.text == "True";
      return Status::Ok();
    }
    return Error(fmt::format("{}: {} must be True or False", name, Quote(value.text)), value.offset,
                 Newest() ? fmt::format("Expected 'True' or 'False' at index {} in "
                                        "ConfigTokenizer but got {}",
                                        token_index, Quote(value.text))
                          : fmt::format("Expected a single True/False argument for {}", name));
  }

  // roundup_power2_divisions:[B:D,...,>:D] (§4.1). Entries apply left to right to the table:
  // the first B:D also fills every lower interval; ">:D" fills the intervals after the last
  // explicit one (newest) or from it on, overwriting it (2.x before the c10/core refactor).
  Result<std::size_t> ApplyDivisionsList(std::size_t open) {
    constexpr std::string_view kName = "roundup_power2_divisions";
    auto& table = config_.roundup_power2_divisions;
    bool first = true;
    std::size_t last_index = 0;
    std::size_t i = open + 1;
    while (true) {
      if (i >= tokens_.size()) {
        return Error(
            fmt::format("{}: the list opened at offset {} has no ']'", kName, tokens_[open].offset),
            conf_.size(),
            Newest() ? "Expected closing bracket ']' in ConfigTokenizer but reached end of config"
                     : "");
      }
      if (Is(i, TokenKind::kClose)) return i + 1;
      if (!Is(i, TokenKind::kWord)) {
        return Error(fmt::format("{}: expected an interval (a power of 2 in MiB, or '>'), "
                                 "found {}",
                                 kName, Found(i)),
                     OffsetOf(i));
      }
      const Token& interval = tokens_[i];
      if (!Is(i + 1, TokenKind::kColon)) {
        return Error(fmt::format("{}: expected ':' after interval {}, found {}", kName,
                                 Quote(interval.text), Found(i + 1)),
                     OffsetOf(i + 1),
                     Before29("Error parsing CachingAllocator settings, expected :"));
      }
      if (!Is(i + 2, TokenKind::kWord)) {
        return Error(fmt::format("{}: missing divisions for interval {}, found {}", kName,
                                 Quote(interval.text), Found(i + 2)),
                     OffsetOf(i + 2), Before29("Error parsing roundup_power2_divisions value"));
      }
      const Token& value = tokens_[i + 2];
      // PyTorch checks the divisions before the interval; so do we, for the same first error.
      Result<std::uint64_t> divisions = ParseUint(kName, value, Newest() ? kUint64Max : kStoiMax);
      if (!divisions.ok()) return divisions.status();
      if (*divisions != 0 && !std::has_single_bit(*divisions)) {
        return Error(fmt::format("{}: divisions {} for interval {} must be a power of 2 or 0",
                                 kName, value.text, Quote(interval.text)),
                     value.offset,
                     "For roundups, the divisions has to be power of 2 or 0 to disable roundup");
      }
      if (interval.text == ">") {
        const std::size_t from =
            Newest() ? std::min<std::size_t>(last_index + 1, table.size()) : last_index;
        std::fill(table.begin() + static_cast<std::ptrdiff_t>(from), table.end(), *divisions);
      } else {
        Result<std::uint64_t> mib = ParseUint(kName, interval, kUint64Max);
        if (!mib.ok()) return mib.status();
        if (!std::has_single_bit(*mib)) {
          return Error(fmt::format("{}: interval {} is not a power of 2", kName, interval.text),
                       interval.offset, "For roundups, the intervals have to be power of 2");
        }
        const std::size_t index = std::min<std::size_t>(
            static_cast<std::size_t>(std::countr_zero(*mib)), table.size() - 1);
        if (first) {
          std::fill(table.begin(), table.begin() + static_cast<std::ptrdiff_t>(index), *divisions);
          first = false;
        }
        table[index] = *divisions;
        last_index = index;
      }
      i += 3;
      if (Is(i, TokenKind::kClose)) continue;
      if (!Is(i, TokenKind::kComma)) {
        if (i >= tokens_.size()) continue;  // reported as the missing ']' above
        return Error(
            fmt::format("{}: expected ',' or ']' after an entry, found {}", kName, Found(i)),
            OffsetOf(i), Before29("Error parsing CachingAllocator settings, expected ,"));
      }
      ++i;  // a ',' before ']' is fine, as in PyTorch
    }
  }

  // expandable_segments_reserve_by_class:[class:value,...]: replaces the whole map; malformed
  // values are skipped, as PyTorch skips them with a warning.
  Result<std::size_t> ApplyReserveByClass(std::size_t i) {
    constexpr std::string_view kName = "expandable_segments_reserve_by_class";
    if (!Is(i, TokenKind::kOpen)) {
      return Error(fmt::format("{}: expected a list [class:value,...], found {}", kName, Found(i)),
                   OffsetOf(i));
    }
    const std::size_t open = i++;
    std::map<std::string, ExpandableSegmentsReserve> parsed;
    while (true) {
      if (i >= tokens_.size()) {
        return Error(
            fmt::format("{}: the list opened at offset {} has no ']'", kName, tokens_[open].offset),
            conf_.size(), "Index out of bounds in ConfigTokenizer");
      }
      if (Is(i, TokenKind::kClose)) break;
      if (!Is(i, TokenKind::kWord) || !Is(i + 1, TokenKind::kColon) ||
          !Is(i + 2, TokenKind::kWord)) {
        return Error(fmt::format("{}: expected class:value, found {}", kName, Found(i)),
                     OffsetOf(i));
      }
      if (auto reserve = ParseReserve(tokens_[i + 2].text)) {
        parsed[tokens_[i].text] = *reserve;  // a repeated class: the last one wins
      }
      i += 3;
      if (Is(i, TokenKind::kComma)) {
        ++i;
      } else if (i < tokens_.size() && !Is(i, TokenKind::kClose)) {
        return Error(
            fmt::format("{}: expected ',' or ']' after an entry, found {}", kName, Found(i)),
            OffsetOf(i));
      }
    }
    config_.expandable_segments_reserve_by_class = std::move(parsed);
    return i + 1;
  }

  std::string_view conf_;
  ConfigVersion version_;
  AllocatorConfig config_;
  bool load_time_;
  std::vector<Token> tokens_;
};

}  // namespace

// ---- Public functions -------------------------------------------------------------------------

std::string_view ConfigVersionName(ConfigVersion version) {
  switch (version) {
    case ConfigVersion::kV1_13:
      return "PyTorch 1.13";
    case ConfigVersion::kV2:
      return "PyTorch 2.0-2.5";
    case ConfigVersion::kNewest:
      return "PyTorch 2.9+";
  }
  return "PyTorch ?";
}

AllocatorRules AllocatorConfig::Rules() const {
  AllocatorRules rules;
  rules.max_split_size = max_split_size;
  rules.max_non_split_rounding = max_non_split_rounding;
  rules.expandable_segments = expandable_segments;
  for (std::size_t i = 0; i < roundup_power2_divisions.size(); ++i) {
    std::uint64_t divisions = std::min(roundup_power2_divisions[i], kMaxRulesDivisions);
    // 1.13 skipped power-2 rounding for requests > roundup_bypass_threshold. Interval i starts
    // at 2^(i+20) bytes (interval 0 at the smallest request).
    const std::uint64_t lowest = i == 0 ? 1 : std::uint64_t{1} << (i + 20);
    if (lowest > roundup_bypass_threshold) divisions = 0;
    rules.roundup_power2_divisions[i] = static_cast<std::uint32_t>(divisions);
  }
  return rules;
}

Result<AllocatorConfig> ParseAllocatorConfig(std::string_view conf, ConfigVersion version) {
  return Parser(conf, version, AllocatorConfig(), /*load_time=*/true).Run();
}

Result<AllocatorConfig> ParseAllocatorConfig(std::string_view conf, const AllocatorConfig& previous,
                                             ConfigVersion version) {
  return Parser(conf, version, previous, /*load_time=*/false).Run();
}

std::vector<std::pair<std::string, std::string>> ToSettingPairs(const AllocatorConfig& config) {
  const AllocatorConfig defaults;
  std::vector<std::pair<std::string, std::string>> parts;
  auto add = [&parts](Key key, const std::string& value) {
    parts.emplace_back(std::string(CanonicalName(key)), value);
  };
  auto add_bool = [&add](Key key, bool value, bool default_value) {
    if (value != default_value) add(key, value ? "True" : "False");
  };
  auto reserve = [](const ExpandableSegmentsReserve& r) {
    return r.is_fraction ? fmt::format("{}", r.value) : fmt::format("{}G", r.value);
  };

  if (config.backend != defaults.backend) {
    add(Key::kBackend, config.backend == AllocatorBackend::kNative ? "native" : "cudaMallocAsync");
  }
  if (config.max_split_size != defaults.max_split_size) {
    add(Key::kMaxSplitSize, std::to_string(config.max_split_size / kMiB));
  }
  if (config.max_non_split_rounding != defaults.max_non_split_rounding) {
    add(Key::kMaxNonSplitRounding, std::to_string(config.max_non_split_rounding / kMiB));
  }
  const auto& table = config.roundup_power2_divisions;
  if (table != defaults.roundup_power2_divisions) {
    if (std::all_of(table.begin(), table.end(), [&](std::uint64_t d) { return d == table[0]; })) {
      add(Key::kRoundupPower2Divisions, std::to_string(table[0]));
    } else {
      // The first entry covers the leading run of equal values (it fills the intervals below
      // it), then one entry per other non-zero interval; no ">" so the string means the same
      // in every version.
      std::size_t run_end = 0;
      while (run_end + 1 < table.size() && table[run_end + 1] == table[0]) ++run_end;
      std::string list = fmt::format("[{}:{}", std::uint64_t{1} << run_end, table[0]);
      for (std::size_t i = run_end + 1; i < table.size(); ++i) {
        if (table[i] != 0) list += fmt::format(",{}:{}", std::uint64_t{1} << i, table[i]);
      }
      add(Key::kRoundupPower2Divisions, list + "]");
    }
  }
  if (config.roundup_bypass_threshold != defaults.roundup_bypass_threshold) {
    add(Key::kRoundupBypassThreshold, std::to_string(config.roundup_bypass_threshold / kMiB));
  }
  if (config.garbage_collection_threshold != defaults.garbage_collection_threshold) {
    add(Key::kGarbageCollectionThreshold, fmt::format("{}", config.garbage_collection_threshold));
  }
  add_bool(Key::kExpandableSegments, config.expandable_segments, defaults.expandable_segments);
  add_bool(Key::kReleaseLockOnCudaMalloc, config.release_lock_on_cudamalloc,
           defaults.release_lock_on_cudamalloc);
  add_bool(Key::kPinnedUseCudaHostRegister, config.pinned_use_cuda_host_register,
           defaults.pinned_use_cuda_host_register);
  if (config.pinned_num_register_threads != defaults.pinned_num_register_threads) {
    add(Key::kPinnedNumRegisterThreads, std::to_string(config.pinned_num_register_threads));
  }
  add_bool(Key::kPinnedUseBackgroundThreads, config.pinned_use_background_threads,
           defaults.pinned_use_background_threads);
  if (config.pinned_reserve_segment_size_mb != defaults.pinned_reserve_segment_size_mb) {
    add(Key::kPinnedReserveSegmentSize, std::to_string(config.pinned_reserve_segment_size_mb));
  }
  add_bool(Key::kPinnedFreeCatchAll, config.pinned_free_catch_all, defaults.pinned_free_catch_all);
  add_bool(Key::kGraphCaptureRecordStreamReuse, config.graph_capture_record_stream_reuse,
           defaults.graph_capture_record_stream_reuse);
  if (config.per_process_memory_fraction != defaults.per_process_memory_fraction) {
    add(Key::kPerProcessMemoryFraction, fmt::format("{}", config.per_process_memory_fraction));
  }
  add_bool(Key::kThrowOnCudaMallocOom, config.throw_on_cudamalloc_oom,
           defaults.throw_on_cudamalloc_oom);
  if (config.expandable_segments_reserve) {
    add(Key::kExpandableSegmentsReserve, reserve(*config.expandable_segments_reserve));
  }
  if (!config.expandable_segments_reserve_by_class.empty()) {
    std::string list;
    for (const auto& [name, value] : config.expandable_segments_reserve_by_class) {
      list += fmt::format("{}{}:{}", list.empty() ? "[" : ",", name, reserve(value));
    }
    add(Key::kExpandableSegmentsReserveByClass, list + "]");
  }

  return parts;
}

std::string ToConfString(const AllocatorConfig& config) {
  std::string out;
  for (const auto& [key, value] : ToSettingPairs(config)) {
    if (!out.empty()) out += ',';
    out += key + ":" + value;
  }
  return out;
}

std::string_view StripConfAssignment(std::string_view text, std::size_t* offset) {
  if (offset != nullptr) *offset = 0;
  std::size_t i = 0;
  auto skip_space = [&] {
    while (i < text.size() && IsSpace(text[i])) ++i;
  };
  skip_space();
  if (text.substr(i).starts_with("export") && i + 6 < text.size() && IsSpace(text[i + 6])) {
    i += 6;
    skip_space();
  }
  bool found = false;
  for (std::string_view name :
       {"PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"}) {
    if (text.substr(i).starts_with(name)) {
      std::size_t j = i + name.size();
      while (j < text.size() && IsSpace(text[j])) ++j;
      if (j < text.size() && text[j] == '=') {
        i = j + 1;
        found = true;
        break;
      }
    }
  }
  if (!found) return text;
  skip_space();
  std::size_t end = text.size();
  while (end > i && IsSpace(text[end - 1])) --end;
  if (end - i >= 2 && (text[i] == '"' || text[i] == '\'') && text[end - 1] == text[i]) {
    ++i;
    --end;
  }
  if (offset != nullptr) *offset = i;
  return text.substr(i, end - i);
}

Result<AllocatorConfig> ParseUserAllocatorConf(std::string_view text, ConfigVersion version) {
  std::size_t offset = 0;
  const std::string_view conf = StripConfAssignment(text, &offset);
  Result<AllocatorConfig> parsed = ParseAllocatorConfig(conf, version);
  if (parsed.ok() || offset == 0) return parsed;
  // Offsets in the message count from the value; the user sees the whole line.
  std::string message = parsed.status().message();
  const std::string marker = "at offset ";
  for (std::size_t at = message.find(marker); at != std::string::npos;
       at = message.find(marker, at + marker.size())) {
    const std::size_t digits = at + marker.size();
    std::size_t digits_end = digits;
    while (digits_end < message.size() && message[digits_end] >= '0' &&
           message[digits_end] <= '9') {
      ++digits_end;
    }
    std::uint64_t number = 0;
    std::from_chars(message.data() + digits, message.data() + digits_end, number);
    message.replace(digits, digits_end - digits, std::to_string(number + offset));
  }
  return Status(parsed.status().code(), std::move(message));
}

Result<AllocatorConfig> ParseAllocatorSettings(
    const std::vector<std::pair<std::string, std::string>>& settings, ConfigVersion version) {
  auto trim = [](std::string_view v) {
    while (!v.empty() && IsSpace(v.front())) v.remove_prefix(1);
    while (!v.empty() && IsSpace(v.back())) v.remove_suffix(1);
    return v;
  };
  std::string conf;
  auto add = [&conf](std::string_view key, std::string_view value) {
    if (!conf.empty()) conf += ',';
    conf += fmt::format("{}:{}", key, value);
  };
  const AllocatorConfig defaults;
  for (const auto& [raw_key, raw_value] : settings) {
    const std::string_view key = trim(raw_key);
    std::string value(trim(raw_value));
    if (value == "None" || value == "null" || key == "PYTORCH_CUDA_ALLOC_CONF" ||
        key == "PYTORCH_ALLOC_CONF" || key.starts_with("trace_alloc_")) {
      continue;
    }
    // A JSON object ({"1":0,"2":4}, a header's object form of a snapshot's dict) is the list.
    if (value.size() >= 2 && value.front() == '{' && value.back() == '}') {
      std::string list = "[";
      for (std::size_t i = 1; i + 1 < value.size(); ++i) {
        if (value[i] != '"') list += value[i];
      }
      value = list + "]";
    }
    if (key == "max_split_size" || key == "max_non_split_rounding") {
      // Snapshots record these in bytes; -1 is "unlimited".
      if (value == "-1") continue;
      std::uint64_t bytes = 0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), bytes);
      if (ec != std::errc() || ptr != value.data() + value.size()) {
        return Error(fmt::format("{}: {} is not a byte count (-1 = unlimited)", key, Quote(value)),
                     0);
      }
      const std::string conf_key = fmt::format("{}_mb", key);
      if (key == "max_non_split_rounding" && bytes == defaults.max_non_split_rounding) continue;
      add(conf_key, std::to_string(bytes / kMiB));
      continue;
    }
    if (key == "garbage_collection_threshold") {
      double threshold = -1.0;
      const auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), threshold);
      if (ec == std::errc() && ptr == value.data() + value.size() && threshold == 0.0) continue;
    }
    // A key at its default says nothing (a newer PyTorch's key, recorded off, must not fail an
    // older version's parse).
    const std::string item = fmt::format("{}:{}", key, value);
    if (Result<AllocatorConfig> alone = ParseAllocatorConfig(item);
        alone.ok() && *alone == defaults) {
      continue;
    }
    add(key, value);
  }
  return ParseAllocatorConfig(conf, version);
}

std::string ConfigVersionChoices() {
  return fmt::format(
      "1.13 ({}), 2 ({}), newest ({}); {} releases lie between 2 and newest "
      "(docs/allocator-config.md, Versions)",
      ConfigVersionName(ConfigVersion::kV1_13), ConfigVersionName(ConfigVersion::kV2),
      ConfigVersionName(ConfigVersion::kNewest), "2.6-2.8");
}

}  // namespace fragscope::model
