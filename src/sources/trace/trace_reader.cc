// TraceReader for the fragscope trace format v1 (docs/formats.md).
//
// Line 1, the header, is parsed with nlohmann::json (once per file, so convenience wins).
// Every other line goes through a hand-written scanner (json_scan.h) that records where each
// known key's value lies and converts only the fields the line's action uses: no allocation
// per line, no copy of a line that lies inside the read buffer.
#include <algorithm>
#include <charconv>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/keyed_hash.h"
#include "fragscope/trace.h"
#include "sources/budget.h"
#include "sources/call_site.h"
#include "sources/trace/input_stream.h"
#include "sources/trace/json_scan.h"

namespace fragscope {

namespace {

using sources::BudgetMessage;
using sources::JsonScanner;
using sources::JsonToken;
using sources::JsonType;
using sources::MemoryBudgetFor;
using sources::ProcessBudget;
using sources::TraceEventBudgetFor;
using Json = nlohmann::ordered_json;  // ordered: settings and labels keep their file order

// Shown in messages; longer values are cut.
constexpr std::size_t kMaxQuotedValueBytes = 48;

std::string Shorten(std::string_view text) {
  if (text.size() <= kMaxQuotedValueBytes) return std::string(text);
  std::size_t cut = kMaxQuotedValueBytes;
  // Cut before a UTF-8 continuation byte's sequence, so the message stays valid UTF-8.
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
  return std::string(text.substr(0, cut)) + "...";
}

// ---- Header ---------------------------------------------------------------------------------

std::string Dump(const Json& value) {
  // replace: never throw on bad UTF-8 (the line was validated, but be safe).
  return Shorten(value.dump(-1, ' ', false, Json::error_handler_t::replace));
}

// A non-negative integer that fits in 64 bits. nlohmann stores non-negative integers as
// unsigned, negative ones as signed and anything else (including overflow) as float.
bool GetUint64(const Json& value, std::uint64_t* out) {
  if (const auto* u = value.get_ptr<const Json::number_unsigned_t*>()) {
    *out = *u;
    return true;
  }
  return false;
}

Status HeaderError(std::string msg) { return Status::Corruption(std::move(msg)); }

// Builds the header's ordered_json tree in time linear in the line. nlohmann's own parser
// inserts each object key with ordered_map::operator[], a linear search for a duplicate, so a
// header with n labels cost O(n^2) (100k labels: 35 s; issue 24 item 2). Here keys go to the
// back of the object's vector and duplicates are found with a hash index; the result is what
// nlohmann would build: a repeated key keeps its first position and its last value.
// REQUIRES: the line was validated by JsonScanner (syntax and depth), so errors are not expected.
class HeaderBuilder {
 public:
  using string_t = Json::string_t;

  bool null() { return Put(Json(nullptr)); }
  bool boolean(bool b) { return Put(Json(b)); }
  bool number_integer(Json::number_integer_t i) { return Put(Json(i)); }
  bool number_unsigned(Json::number_unsigned_t u) { return Put(Json(u)); }
  bool number_float(Json::number_float_t d, const string_t&) { return Put(Json(d)); }
  bool string(string_t& s) { return Put(Json(std::move(s))); }
  bool binary(Json::binary_t&) { return false; }
  bool start_object(std::size_t) { return Open(Json::object()); }
  bool start_array(std::size_t) { return Open(Json::array()); }
  bool end_object() { return Close(); }
  bool end_array() { return Close(); }
  bool key(string_t& k) {
    Level& level = open_.back();
    auto& object = level.value->get_ref<Json::object_t&>();
    auto [it, inserted] = level.keys.try_emplace(k, object.size());
    if (inserted) {
      object.Container::emplace_back(std::move(k), nullptr);
      next_ = &object.back().second;
    } else {
      next_ = &object.Container::operator[](it->second).second;  // repeated: the last value wins
      *next_ = nullptr;
    }
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    return false;
  }

  Json& root() { return root_; }

 private:
  struct Level {
    Json* value;
    KeyedStringMap<std::size_t> keys;  // objects: key -> index
  };
  // Where the next value goes: the root, behind the open array, or at the key just read.
  Json* Slot() {
    if (open_.empty()) return &root_;
    Json* parent = open_.back().value;
    if (parent->is_array()) {
      parent->get_ref<Json::array_t&>().emplace_back();
      return &parent->back();
    }
    return next_;
  }
  bool Put(Json value) {
    *Slot() = std::move(value);
    return true;
  }
  // Open containers are never moved: their parent gains no element while they are open.
  bool Open(Json empty) {
    Json* slot = Slot();
    *slot = std::move(empty);
    open_.push_back(Level{slot, {}});
    return true;
  }
  bool Close() {
    open_.pop_back();
    return true;
  }

  Json root_;
  Json* next_ = nullptr;
  std::vector<Level> open_;
};

Status ParseDevices(const Json& devices, const TraceLimits& limits, TraceHeader* header) {
  if (!devices.is_array()) {
    return HeaderError("\"devices\" is " + Dump(devices) + ", expected an array of objects");
  }
  if (devices.size() > limits.max_devices) {
    return Status::LimitExceeded("\"devices\" lists " + std::to_string(devices.size()) +
                                 " devices, more than the limit of " +
                                 std::to_string(limits.max_devices) + " (max_devices)");
  }
  std::unordered_set<std::int32_t> seen;  // device numbers listed so far
  for (std::size_t i = 0; i < devices.size(); ++i) {
    const Json& d = devices[i];
    std::string where = "devices[" + std::to_string(i) + "]";
    if (!d.is_object()) return HeaderError(where + " is " + Dump(d) + ", expected an object");
    DeviceInfo info;
    auto it = d.find("device");
    std::uint64_t number = 0;
    if (it == d.end()) return HeaderError(where + " has no \"device\" key");
    if (!GetUint64(*it, &number) || number > INT32_MAX) {
      return HeaderError(where + ".device is " + Dump(*it) +
                         ", expected an integer from 0 to 2147483647");
    }
    info.device = static_cast<std::int32_t>(number);
    if (!seen.insert(info.device).second) {
      return HeaderError(where + ": device " + std::to_string(info.device) + " is listed twice");
    }
    if (auto name = d.find("name"); name != d.end()) {
      const auto* s = name->get_ptr<const Json::string_t*>();
      if (s == nullptr)
        return HeaderError(where + ".name is " + Dump(*name) + ", expected a string");
      info.name = *s;
    }
    for (const char* key : {"capacity_bytes", "used_by_others_bytes"}) {
      auto field = d.find(key);
      if (field == d.end()) continue;
      if (!GetUint64(*field, &number)) {
        return HeaderError(where + "." + key + " is " + Dump(*field) +
                           ", expected a non-negative integer");
      }
      if (std::strcmp(key, "capacity_bytes") == 0) {
        info.capacity_bytes = number;
      } else {
        info.used_by_others_bytes = number;
      }
    }
    header->devices.push_back(std::move(info));
  }
  return Status::Ok();
}

// "k:v,k:v" as PYTORCH_CUDA_ALLOC_CONF writes it: whitespace ignored, commas inside [...]
// (roundup_power2_divisions:[256:1,512:2]) do not split.
Status ParseSettingsString(std::string_view conf, TraceHeader* header) {
  auto trim = [](std::string_view s) {
    while (!s.empty() && JsonScanner::IsJsonSpace(s.front())) s.remove_prefix(1);
    while (!s.empty() && JsonScanner::IsJsonSpace(s.back())) s.remove_suffix(1);
    return s;
  };
  KeyedStringMap<std::size_t> index;  // key -> its pair in allocator_settings
  for (std::size_t i = 0; i < header->allocator_settings.size(); ++i) {
    index.try_emplace(header->allocator_settings[i].first, i);
  }
  std::size_t start = 0;
  int brackets = 0;
  for (std::size_t i = 0; i <= conf.size(); ++i) {
    if (i < conf.size()) {
      if (conf[i] == '[') ++brackets;
      if (conf[i] == ']' && brackets > 0) --brackets;
      if (conf[i] != ',' || brackets > 0) continue;
    }
    std::string_view item = trim(conf.substr(start, i - start));
    start = i + 1;
    if (item.empty()) continue;
    std::size_t colon = item.find(':');
    if (colon == std::string_view::npos) {
      return HeaderError("\"allocator_settings\": item \"" + Shorten(item) + "\" is not key:value");
    }
    std::string key(trim(item.substr(0, colon)));
    std::string value(trim(item.substr(colon + 1)));
    if (key.empty()) {
      return HeaderError("\"allocator_settings\": item \"" + Shorten(item) + "\" has no key");
    }
    // A repeated key overrides the earlier value, as in PyTorch's own parser; keeping one
    // pair per key matches the object form, where JSON keys are unique. The index keeps this
    // linear in the number of items (a search of the pairs was quadratic).
    auto& pairs = header->allocator_settings;
    auto [it, inserted] = index.try_emplace(key, pairs.size());
    if (inserted) {
      pairs.emplace_back(std::move(key), std::move(value));
    } else {
      pairs[it->second].second = std::move(value);
    }
  }
  return Status::Ok();
}

Status ParseSettings(const Json& settings, TraceHeader* header) {
  if (const auto* s = settings.get_ptr<const Json::string_t*>()) {
    return ParseSettingsString(*s, header);
  }
  if (!settings.is_object()) {
    return HeaderError("\"allocator_settings\" is " + Dump(settings) +
                       ", expected an object or a \"key:value,...\" string");
  }
  for (const auto& [key, value] : settings.items()) {
    std::string text;
    if (value.is_null()) continue;  // "not set"
    if (const auto* s = value.get_ptr<const Json::string_t*>()) {
      text = *s;
    } else if (value.is_boolean()) {
      // PYTORCH_CUDA_ALLOC_CONF's spelling, so the pairs can be joined into a conf string.
      text = value.get<bool>() ? "True" : "False";
    } else {
      // Numbers, and lists/dicts such as roundup_power2_divisions, as their JSON text.
      text = value.dump(-1, ' ', false, Json::error_handler_t::replace);
    }
    header->allocator_settings.emplace_back(key, std::move(text));
  }
  return Status::Ok();
}

Status ParseLabels(const Json& labels, TraceHeader* header) {
  if (!labels.is_object()) {
    return HeaderError("\"labels\" is " + Dump(labels) + ", expected an object");
  }
  for (const auto& [key, value] : labels.items()) {
    if (const auto* s = value.get_ptr<const Json::string_t*>()) {
      header->labels.emplace_back(key, *s);
    } else if (value.is_number() || value.is_boolean()) {
      header->labels.emplace_back(key, value.dump());
    } else {
      return HeaderError("label \"" + Shorten(key) + "\" is " + Dump(value) +
                         ", expected a string or a number");
    }
  }
  return Status::Ok();
}

constexpr std::string_view kHeaderExample = R"({"format": "fragscope-trace", "version": 1, ...})";

Status ParseHeader(std::string_view line, const TraceLimits& limits, TraceHeader* header) {
  // Tolerate a UTF-8 byte order mark, which some Windows editors add.
  if (line.substr(0, 3) == "\xEF\xBB\xBF") line.remove_prefix(3);
  JsonScanner scanner(line);
  scanner.SkipWhitespace();
  if (scanner.AtEnd()) {
    return HeaderError("the first line is empty; a trace starts with the header line " +
                       std::string(kHeaderExample));
  }
  if (scanner.Peek() != '{') {
    scanner.Expected("'{'");
    return HeaderError("not a fragscope trace: the first line is not a JSON object (" +
                       scanner.error().message() + ")");
  }
  // Validate with our own scanner first: it bounds the nesting depth and says where a syntax
  // error is; nlohmann then only builds the tree of a line known to be good.
  JsonToken token;
  // + 1: the header object itself, so nesting below it is limited as on event lines.
  if (!scanner.ScanValue(&token, sources::kMaxJsonDepth + 1)) return scanner.error();
  scanner.SkipWhitespace();
  if (!scanner.AtEnd()) {
    scanner.Expected("the end of the line after the header object");
    return scanner.error();
  }
  HeaderBuilder builder;
  if (!Json::sax_parse(line.begin(), line.end(), &builder)) {
    return HeaderError("the header is not valid JSON (a number too large for a double?)");
  }
  const Json& json = builder.root();

  auto format = json.find("format");
  if (format == json.end()) {
    if (json.contains("action")) {
      return HeaderError("the first line is an event, not the header; a trace starts with " +
                         std::string(kHeaderExample));
    }
    return HeaderError("the header has no \"format\" key; expected " + std::string(kHeaderExample));
  }
  const auto* format_name = format->get_ptr<const Json::string_t*>();
  if (format_name == nullptr || *format_name != "fragscope-trace") {
    return HeaderError("not a fragscope trace: \"format\" is " + Dump(*format) +
                       ", expected \"fragscope-trace\"");
  }
  auto version = json.find("version");
  if (version == json.end()) return HeaderError("the header has no \"version\" key");
  std::uint64_t version_number = 0;
  if (!GetUint64(*version, &version_number) || version_number != 1) {
    return HeaderError("unsupported trace \"version\" " + Dump(*version) +
                       " (this reader reads version 1)");
  }
  header->version = 1;

  if (auto kind = json.find("kind"); kind != json.end()) {
    const auto* s = kind->get_ptr<const Json::string_t*>();
    if (s != nullptr && *s == "request") {
      header->kind = TraceKind::kRequest;
    } else if (s != nullptr && *s == "allocator") {
      header->kind = TraceKind::kAllocator;
    } else {
      return HeaderError("\"kind\" is " + Dump(*kind) + ", expected \"request\" or \"allocator\"");
    }
  }
  if (auto producer = json.find("producer"); producer != json.end()) {
    const auto* s = producer->get_ptr<const Json::string_t*>();
    if (s == nullptr)
      return HeaderError("\"producer\" is " + Dump(*producer) + ", expected a string");
    header->producer = *s;
  }
  if (auto devices = json.find("devices"); devices != json.end()) {
    FRAGSCOPE_RETURN_IF_ERROR(ParseDevices(*devices, limits, header));
  }
  if (auto settings = json.find("allocator_settings"); settings != json.end()) {
    FRAGSCOPE_RETURN_IF_ERROR(ParseSettings(*settings, header));
  }
  if (auto labels = json.find("labels"); labels != json.end()) {
    FRAGSCOPE_RETURN_IF_ERROR(ParseLabels(*labels, header));
  }
  // Any other key is ignored: newer writers may add some (docs/formats.md, "Versioning").
  return Status::Ok();
}

// ---- Event lines: the keys we know ----------------------------------------------------------

enum Field : std::uint8_t {
  // Read on every event line.
  kAction,
  kAddr,
  kSize,
  kStream,
  kDevice,
  kTimeUs,
  kFrame,
  // Read for one action each.
  kBlockSize,
  kStep,
  kDeviceFree,
  kPool,
  kFraction,
  kConf,
  // Frame definition lines.
  kId,
  kName,
  kFilename,
  kLine,
  // PyTorch's stack on an event (innermost first): read when `frame` is absent.
  kFrames,
  kNumFields,
  kUnknownField = kNumFields,
};
constexpr std::string_view kFieldNames[kNumFields] = {
    "action", "addr",       "size", "stream",      "device", "time_us",
    "frame",  "block_size", "step", "device_free", "pool",   "fraction",
    "conf",   "id",         "name", "filename",    "line",   "frames"};

using FieldMask = std::uint32_t;
constexpr FieldMask Bit(Field f) { return FieldMask{1} << f; }

Field LookupField(std::string_view key) {
  // By length first, then memcmp of a constant length, which compilers turn into one or two
  // loads and compares: this runs for every key of every line.
  const char* k = key.data();
  auto is = [k]<std::size_t N>(const char(&name)[N]) { return std::memcmp(k, name, N - 1) == 0; };
  switch (key.size()) {
    case 2:
      return is("id") ? kId : kUnknownField;
    case 4:
      if (is("addr")) return kAddr;
      if (is("size")) return kSize;
      if (is("step")) return kStep;
      if (is("pool")) return kPool;
      if (is("conf")) return kConf;
      if (is("name")) return kName;
      if (is("line")) return kLine;
      return kUnknownField;
    case 5:
      return is("frame") ? kFrame : kUnknownField;
    case 6:
      if (is("action")) return kAction;
      if (is("stream")) return kStream;
      if (is("device")) return kDevice;
      if (is("frames")) return kFrames;
      return kUnknownField;
    case 7:
      return is("time_us") ? kTimeUs : kUnknownField;
    case 8:
      if (is("fraction")) return kFraction;
      if (is("filename")) return kFilename;
      return kUnknownField;
    case 10:
      return is("block_size") ? kBlockSize : kUnknownField;
    case 11:
      return is("device_free") ? kDeviceFree : kUnknownField;
    default:
      return kUnknownField;
  }
}

// The action of a line. The three that make up nearly every line of a real trace are tested
// inline first, before the general lookup.
std::optional<Action> LookupAction(std::string_view name) {
  const char* k = name.data();
  if (name.size() == 5 && std::memcmp(k, "alloc", 5) == 0) return Action::kAlloc;
  if (name.size() == 14) {
    if (std::memcmp(k, "free_completed", 14) == 0) return Action::kFreeCompleted;
    if (std::memcmp(k, "free_requested", 14) == 0) return Action::kFreeRequested;
  }
  return ParseActionName(name);
}

// Fields each action requires; see the table in docs/formats.md.
constexpr FieldMask kRequired[kNumActions] = {
    Bit(kAddr) | Bit(kSize),                    // alloc
    Bit(kAddr),                                 // free_requested
    Bit(kAddr),                                 // free_completed
    Bit(kAddr) | Bit(kSize),                    // segment_alloc
    Bit(kAddr),                                 // segment_free
    Bit(kAddr) | Bit(kSize),                    // segment_map
    Bit(kAddr) | Bit(kSize),                    // segment_unmap
    Bit(kSize),                                 // oom
    0,                                          // snapshot
    Bit(kStep),                                 // step
    Bit(kAddr) | Bit(kStream),                  // record_stream
    0,                                          // stream_sync
    0,                                          // empty_cache
    Bit(kFraction),                             // set_memory_fraction
    Bit(kConf),                                 // set_allocator_settings
    Bit(kAddr) | Bit(kSize) | Bit(kBlockSize),  // block
};

std::string ValidActionList() {
  std::string list;
  for (int i = 0; i < kNumActions; ++i) {
    list += ActionName(static_cast<Action>(i));
    list += ", ";
  }
  return list + "frame";
}

// ---- The reader -----------------------------------------------------------------------------

class TraceReaderImpl final : public TraceReader {
 public:
  TraceReaderImpl(std::unique_ptr<sources::LineReader> lines, std::string name,
                  const TraceLimits& limits)
      : lines_(std::move(lines)), name_(std::move(name)), limits_(limits) {
    // Budgets (issue 24 item 1) follow the file as stored; 0 = not known (a pipe): the floors.
    const std::uint64_t input_size = lines_->input().raw_bytes_total();
    memory_user_set_ = limits_.max_memory_bytes != 0 || ProcessBudget().max_memory_bytes != 0;
    memory_budget_ =
        limits_.max_memory_bytes != 0 ? limits_.max_memory_bytes : MemoryBudgetFor(input_size);
    events_user_set_ = limits_.max_events != 0 || ProcessBudget().max_events != 0;
    max_events_ = limits_.max_events != 0 ? limits_.max_events : TraceEventBudgetFor(input_size);
  }

  Status ReadHeader() {
    std::string_view line;
    Result<bool> got = lines_->Next(&line);
    if (!got.ok()) return Located(got.status());
    if (!*got) return Status::Corruption(name_ + ": empty file (no header line)");
    return Located(ParseHeader(line, limits_, &header_));
  }

  const TraceHeader& header() const override { return header_; }
  const std::vector<Frame>& frames() const override { return frames_; }
  std::string Where() const override { return name_ + ":" + std::to_string(line_number()); }
  std::uint64_t line_number() const override { return lines_->line_number(); }
  std::uint64_t input_bytes_consumed() const override {
    return lines_->input().raw_bytes_consumed();
  }
  std::uint64_t input_bytes_total() const override { return lines_->input().raw_bytes_total(); }

  Result<bool> Next(Event* event) override {
    if (!failure_.ok()) return failure_;  // errors are sticky: the stream is out of step
    for (;;) {
      std::string_view line;
      Result<bool> got = lines_->Next(&line);
      if (!got.ok()) return Fail(got.status());
      if (!*got) return false;
      bool is_frame = false;
      if (!ParseLine(line, event, &is_frame)) return Fail(error_);
      if (is_frame) continue;
      if (++events_ > max_events_) [[unlikely]] {
        return Fail(Status::LimitExceeded(BudgetMessage(
            "more events than the trace's size justifies (a compressed file that decodes "
            "to far more than it holds?)",
            "event", max_events_, events_, events_user_set_, "--max-events", /*bytes=*/false)));
      }
      return true;
    }
  }

 private:
  Status Located(const Status& status) const {
    if (status.ok()) return status;
    return status.WithPrefix(Where());
  }
  Status Fail(const Status& status) {
    failure_ = Located(status);
    return failure_;
  }

  // -- One line. Functions return false on error and leave it in error_ (a Status per call
  // -- would cost more than the parsing on this path).

  bool Corrupt(std::string message) {
    error_ = Status::Corruption(std::move(message));
    return false;
  }
  bool Limit(std::string message) {
    error_ = Status::LimitExceeded(std::move(message));
    return false;
  }
  bool ScannerError(const JsonScanner& scanner) {
    error_ = scanner.error();
    return false;
  }

  // Scans the line's object, recording the token of each known key in tokens_/present_.
  bool ScanObject(JsonScanner& scanner) {
    present_ = 0;
    scanner.SkipWhitespace();
    if (scanner.AtEnd())
      return Corrupt("empty line (blank lines are not allowed after the header)");
    if (!scanner.Consume('{')) {
      scanner.Expected("'{' (each line is one JSON object)");
      return ScannerError(scanner);
    }
    scanner.SkipWhitespace();
    if (scanner.Consume('}')) return ExpectEnd(scanner);
    for (;;) {
      scanner.SkipWhitespace();
      if (scanner.Peek() != '"' || scanner.AtEnd()) {
        scanner.Expected("a key string");
        return ScannerError(scanner);
      }
      JsonToken key;
      if (!scanner.ScanString(&key)) return ScannerError(scanner);
      std::string_view key_text = scanner.StringBody(key);
      if (key.has_escapes) {
        sources::DecodeJsonString(key_text, &scratch_);
        key_text = scratch_;
      }
      const Field field = LookupField(key_text);
      scanner.SkipWhitespace();
      if (!scanner.Consume(':')) {
        scanner.Expected("':' after the key");
        return ScannerError(scanner);
      }
      scanner.SkipWhitespace();
      if (field == kUnknownField) {
        JsonToken ignored;
        if (!scanner.ScanValue(&ignored)) return ScannerError(scanner);
      } else {
        if ((present_ & Bit(field)) != 0) {
          return Corrupt("column " + std::to_string(key.begin + 1) + ": duplicate key \"" +
                         std::string(kFieldNames[field]) + "\"");
        }
        present_ |= Bit(field);
        if (!scanner.ScanValue(&tokens_[field])) return ScannerError(scanner);
      }
      scanner.SkipWhitespace();
      if (scanner.Consume(',')) continue;
      if (scanner.Consume('}')) return ExpectEnd(scanner);
      scanner.Expected("',' or '}'");
      return ScannerError(scanner);
    }
  }

  bool ExpectEnd(JsonScanner& scanner) {
    scanner.SkipWhitespace();
    if (scanner.AtEnd()) return true;
    scanner.Expected("the end of the line after the object");
    return ScannerError(scanner);
  }

  bool ParseLine(std::string_view line, Event* event, bool* is_frame) {
    line_ = line;
    JsonScanner scanner(line);
    if (!ScanObject(scanner)) return false;
    if (!Has(kAction)) {
      return Corrupt(
          "no \"action\" key (every line after the header is an event or a frame definition)");
    }
    std::string_view action_name;
    if (!GetString(kAction, &action_name)) return false;
    std::optional<Action> action = LookupAction(action_name);
    if (!action) {
      if (action_name == "frame") {
        *is_frame = true;
        return ParseFrame();
      }
      std::string msg =
          "unknown action \"" + Shorten(action_name) + "\" (valid: " + ValidActionList() + ")";
      if (action_name == "free") {
        // PyTorch's memory viewer merges free_requested+free_completed into "free"; which one
        // the producer meant is not knowable, so we do not guess.
        msg += "; write PyTorch's free_requested and free_completed instead of \"free\"";
      }
      return Corrupt(std::move(msg));
    }
    FieldMask missing = kRequired[static_cast<int>(*action)] & ~present_;
    if (missing != 0) return Missing(ActionName(*action), missing);

    // Reset every field so a reused Event carries nothing over (conf keeps its capacity).
    event->action = *action;
    event->device = 0;
    event->stream = 0;
    event->addr = 0;
    event->size = 0;
    event->block_size = 0;
    event->time_us = -1;
    event->step = 0;
    event->device_free.reset();
    event->pool = Pool::kUnknown;
    event->fraction = 0.0;
    event->has_stream = false;
    event->frame = -1;
    event->conf.clear();

    if (Has(kAddr) && !GetUint64(kAddr, &event->addr)) return false;
    // What a program asks for may be any 64-bit size: PyTorch answers 1 EiB or more with its
    // own OOM ("Tried to allocate more than 1EB memory."), which a replay must show too.
    if (Has(kSize) &&
        !(IsRequest(*action) ? GetUint64(kSize, &event->size) : GetSize(kSize, &event->size))) {
      return false;
    }
    if (Has(kStream) && !GetUint64(kStream, &event->stream)) return false;
    if (Has(kDevice)) {
      std::int64_t device = 0;
      if (!GetInt(kDevice, 0, INT32_MAX, &device)) return false;
      event->device = static_cast<std::int32_t>(device);
    }
    // -1 is accepted as an explicit "unknown", the same as leaving time_us out.
    if (Has(kTimeUs) && !GetInt(kTimeUs, -1, INT64_MAX, &event->time_us)) return false;
    if (Has(kFrame)) {
      if (!GetFrameRef(&event->frame)) return false;
    } else if (Has(kFrames) && !SiteOfFrames(&event->frame)) {
      return false;
    }

    switch (*action) {
      case Action::kAlloc:
      case Action::kBlock:
        return !Has(kBlockSize) || GetSize(kBlockSize, &event->block_size);
      case Action::kOom:
        if (Has(kDeviceFree)) {
          std::uint64_t free_bytes = 0;
          if (!GetSize(kDeviceFree, &free_bytes)) return false;
          event->device_free = free_bytes;
        }
        return true;
      case Action::kStep:
        return GetInt(kStep, 0, INT64_MAX, &event->step);
      case Action::kSegmentAlloc:
      case Action::kSegmentMap:
        return !Has(kPool) || GetPool(&event->pool);
      case Action::kStreamSync:
        event->has_stream = Has(kStream);
        return true;
      case Action::kSetMemoryFraction:
        return GetFraction(&event->fraction);
      case Action::kSetAllocatorSettings: {
        std::string_view conf;
        if (!GetString(kConf, &conf)) return false;
        event->conf.assign(conf);
        return true;
      }
      default:
        return true;
    }
  }

  bool ParseFrame() {
    FieldMask missing = (Bit(kId) | Bit(kName)) & ~present_;
    if (missing != 0) return Missing("frame", missing);
    std::int64_t id = 0;
    if (!GetInt(kId, 0, INT32_MAX, &id)) return false;
    if (static_cast<std::uint64_t>(id) >= limits_.max_frames) {
      return Limit("frame id " + std::to_string(id) + " is not below the limit of " +
                   std::to_string(limits_.max_frames) + " (max_frames)");
    }
    std::size_t index = static_cast<std::size_t>(id);
    if (index < defined_.size() && defined_[index]) {
      if (const auto found = site_line_.find(index); found != site_line_.end()) {
        return Corrupt("frame id " + std::to_string(id) +
                       " is taken by the call site read from the frames of line " +
                       std::to_string(found->second) +
                       " (frame lines come before the events whose frames are read, or use "
                       "another id)");
      }
      return Corrupt("frame id " + std::to_string(id) + " is defined twice");
    }
    Frame frame;
    frame.id = static_cast<std::int32_t>(id);
    std::string_view text;
    if (!GetString(kName, &text)) return false;
    frame.name.assign(text);
    if (Has(kFilename)) {
      if (!GetString(kFilename, &text)) return false;
      frame.filename.assign(text);
    }
    if (Has(kLine) && !GetInt(kLine, 0, INT64_MAX, &frame.line)) return false;
    // Call sites are the one thing a trace reader keeps: their bytes count against the memory
    // budget, before they are stored (issue 24 item 1).
    const std::uint64_t slots = index >= frames_.size() ? index + 1 - frames_.size() : 0;
    frame_bytes_ += slots * (sizeof(Frame) + 1) + frame.name.size() + frame.filename.size();
    if (frame_bytes_ > memory_budget_) {
      return Limit(BudgetMessage("the call sites (frame lines) outgrew the memory budget", "memory",
                                 memory_budget_, frame_bytes_, memory_user_set_, "--max-memory",
                                 /*bytes=*/true));
    }
    if (index >= frames_.size()) {
      // Slots of ids not (yet) defined keep id == index and an empty name.
      std::size_t old_size = frames_.size();
      frames_.resize(index + 1);
      defined_.resize(index + 1, false);
      for (std::size_t i = old_size; i < index; ++i) frames_[i].id = static_cast<std::int32_t>(i);
    }
    frames_[index] = std::move(frame);
    defined_[index] = true;
    return true;
  }

  // -- Field conversions; errors name the field and show the offending value --

  bool Has(Field f) const { return (present_ & Bit(f)) != 0; }

  std::string_view Text(Field f) const {
    const JsonToken& t = tokens_[f];
    return line_.substr(t.begin, t.end - t.begin);
  }
  std::string Shown(Field f) const { return Shorten(Text(f)); }
  bool FieldError(Field f, const std::string& what) {
    return Corrupt("field " + std::string(kFieldNames[f]) + ": " + what);
  }

  bool Missing(std::string_view action, FieldMask missing) {
    int f = 0;
    while ((missing & Bit(static_cast<Field>(f))) == 0) ++f;
    return Corrupt(std::string(action) + ": missing required field \"" +
                   std::string(kFieldNames[f]) + "\"");
  }

  // Why token f is not a plain integer in range (not a number, a fraction, too big).
  bool NotAnInteger(Field f) {
    const JsonToken& t = tokens_[f];
    if (t.type != JsonType::kNumber) return FieldError(f, "expected an integer, found " + Shown(f));
    if (!t.is_integer) {
      return FieldError(f, "expected an integer, found " + Shown(f) +
                               " (fractions and exponents are not allowed here)");
    }
    return FieldError(f, Shown(f) + " does not fit in 64 bits");
  }

  bool GetUint64(Field f, std::uint64_t* out) {
    const JsonToken& t = tokens_[f];
    if (t.type != JsonType::kNumber || !t.is_integer || t.overflow) return NotAnInteger(f);
    if (t.negative && t.magnitude != 0) return FieldError(f, "negative value " + Shown(f));
    *out = t.magnitude;  // "-0" is 0
    return true;
  }

  // Actions whose size is what the program asked for, not what an allocator holds.
  static bool IsRequest(Action a) {
    return a == Action::kAlloc || a == Action::kFreeRequested || a == Action::kFreeCompleted;
  }

  // A byte count: also below limits.max_size_bytes (PyTorch's own sanity bound).
  bool GetSize(Field f, std::uint64_t* out) {
    if (!GetUint64(f, out)) return false;
    if (*out < limits_.max_size_bytes) return true;
    return Limit("field " + std::string(kFieldNames[f]) + ": absurd size " + std::to_string(*out) +
                 " (max_size_bytes is " + std::to_string(limits_.max_size_bytes) + ")");
  }

  // A signed integer in [min, max].
  bool GetInt(Field f, std::int64_t min, std::int64_t max, std::int64_t* out) {
    const JsonToken& t = tokens_[f];
    if (t.type != JsonType::kNumber || !t.is_integer || t.overflow) return NotAnInteger(f);
    const bool negative = t.negative && t.magnitude != 0;
    if (negative && min >= 0) return FieldError(f, "negative value " + Shown(f));
    // Compare magnitudes: |min| and max may both exceed what the other sign can hold.
    std::uint64_t limit =
        negative ? 0 - static_cast<std::uint64_t>(min) : static_cast<std::uint64_t>(max);
    if (t.magnitude > limit) {
      return FieldError(f, Shown(f) + " is out of range (" + std::to_string(min) + " to " +
                               std::to_string(max) + ")");
    }
    *out = negative ? static_cast<std::int64_t>(0 - t.magnitude)
                    : static_cast<std::int64_t>(t.magnitude);
    return true;
  }

  bool GetString(Field f, std::string_view* out) {
    const JsonToken& t = tokens_[f];
    if (t.type != JsonType::kString) return FieldError(f, "expected a string, found " + Shown(f));
    *out = line_.substr(t.begin + 1, t.end - t.begin - 2);  // between the quotes
    if (t.has_escapes) {
      // One scratch string per field, so two decoded fields of a line can coexist.
      std::string& decoded = decoded_[f];
      sources::DecodeJsonString(*out, &decoded);
      *out = decoded;
    }
    return true;
  }

  bool GetPool(Pool* pool) {
    std::string_view name;
    if (!GetString(kPool, &name)) return false;
    if (name == "small") {
      *pool = Pool::kSmall;
    } else if (name == "large") {
      *pool = Pool::kLarge;
    } else {
      return FieldError(kPool, Shown(kPool) + " is not \"small\" or \"large\"");
    }
    return true;
  }

  bool GetFraction(double* out) {
    const JsonToken& t = tokens_[kFraction];
    if (t.type != JsonType::kNumber) {
      return FieldError(kFraction, "expected a number, found " + Shown(kFraction));
    }
    std::string_view text = Text(kFraction);
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *out);
    if (ec != std::errc() || end != text.data() + text.size()) {
      return FieldError(kFraction, Shown(kFraction) + " is not representable as a double");
    }
    if (!(*out >= 0.0 && *out <= 1.0)) {
      return FieldError(kFraction, Shown(kFraction) + " is outside [0, 1]");
    }
    return true;
  }

  bool GetFrameRef(std::int32_t* out) {
    std::int64_t id = 0;
    if (!GetInt(kFrame, 0, INT32_MAX, &id)) return false;
    std::size_t index = static_cast<std::size_t>(id);
    if (index >= defined_.size() || !defined_[index]) {
      return FieldError(kFrame, "call site " + std::to_string(id) +
                                    " is not defined (a {\"action\":\"frame\",\"id\":" +
                                    std::to_string(id) + ",...} line must come first)");
    }
    *out = static_cast<std::int32_t>(id);
    return true;
  }

  // The call site of the event's `frames` (PyTorch's stack, innermost first), chosen as a
  // snapshot's (sources/call_site.h) and read as the snapshot decoder reads one: items that
  // are not objects are left out, a name or filename that is not a string reads as "", a line
  // that is not an integer as 0; -1 when nothing is left. The site becomes a frame of its own
  // with the next id after those in use, shared by every event whose stack chooses it.
  bool SiteOfFrames(std::int32_t* out) {
    *out = -1;
    if (tokens_[kFrames].type != JsonType::kArray) return true;
    const std::string_view text = Text(kFrames);
    if (const auto found = site_of_stack_.find(text); found != site_of_stack_.end()) {
      *out = found->second;
      return true;
    }
    std::size_t n = 0;
    sources::JsonScanner array(text);  // the line's scan validated it
    array.Consume('[');
    for (;;) {
      array.SkipWhitespace();
      if (array.AtEnd() || array.Consume(']')) break;
      JsonToken item;
      if (!array.ScanValue(&item)) return ScannerError(array);
      if (item.type == JsonType::kObject) {
        if (n == stack_.size()) stack_.emplace_back();
        if (!ReadStackFrame(text.substr(item.begin, item.end - item.begin), &stack_[n])) {
          return false;
        }
        ++n;
      }
      array.SkipWhitespace();
      array.Consume(',');
    }
    std::int32_t site = -1;
    if (n > 0) {
      std::vector<sources::FrameText> texts;
      texts.reserve(n);
      for (std::size_t i = 0; i < n; ++i) texts.push_back({stack_[i].name, stack_[i].filename});
      sources::CallSite chosen = sources::ChooseCallSite(texts);
      Frame frame;
      if (chosen.frame >= 0) {
        frame = stack_[static_cast<std::size_t>(chosen.frame)];
      } else {
        frame.name = std::move(chosen.label);
      }
      if (!frame.name.empty() || !frame.filename.empty()) {
        if (!InternSite(std::move(frame), &site)) return false;
      }
    }
    frame_bytes_ += text.size() + sizeof(std::int32_t);
    if (frame_bytes_ > memory_budget_) return FramesOverBudget();
    site_of_stack_.emplace(std::string(text), site);
    *out = site;
    return true;
  }

  // One item of `frames`: {"name": ..., "filename": ..., "line": ...}, other keys ignored.
  bool ReadStackFrame(std::string_view object, Frame* frame) {
    frame->name.clear();
    frame->filename.clear();
    frame->line = 0;
    sources::JsonScanner scanner(object);
    scanner.Consume('{');
    for (;;) {
      scanner.SkipWhitespace();
      if (scanner.AtEnd() || scanner.Consume('}')) return true;
      JsonToken key;
      if (!scanner.ScanString(&key)) return ScannerError(scanner);
      std::string_view key_text = scanner.StringBody(key);
      if (key.has_escapes) {
        sources::DecodeJsonString(key_text, &scratch_);
        key_text = scratch_;
      }
      scanner.SkipWhitespace();
      scanner.Consume(':');
      scanner.SkipWhitespace();
      JsonToken value;
      if (!scanner.ScanValue(&value)) return ScannerError(scanner);
      std::string* target = key_text == "name"       ? &frame->name
                            : key_text == "filename" ? &frame->filename
                                                     : nullptr;
      if (target != nullptr) {
        target->clear();
        if (value.type == JsonType::kString) {
          const std::string_view body = scanner.StringBody(value);
          if (value.has_escapes) {
            sources::DecodeJsonString(body, target);
          } else {
            target->assign(body);
          }
        }
      } else if (key_text == "line") {
        frame->line = 0;
        if (value.type == JsonType::kNumber && value.is_integer && !value.overflow &&
            value.magnitude <= static_cast<std::uint64_t>(INT64_MAX)) {
          const auto magnitude = static_cast<std::int64_t>(value.magnitude);
          frame->line = value.negative ? -magnitude : magnitude;
        }
      }
      scanner.SkipWhitespace();
      scanner.Consume(',');
    }
  }

  // The id of a call site chosen from a stack: the same frame (name, file, line) has one id.
  bool InternSite(Frame frame, std::int32_t* id) {
    std::string key = frame.name;
    key += '\0';
    key += frame.filename;
    key += '\0';
    key += std::to_string(frame.line);
    if (const auto found = id_of_site_.find(key); found != id_of_site_.end()) {
      *id = found->second;
      return true;
    }
    const std::size_t index = frames_.size();
    if (index >= limits_.max_frames) {
      return Limit("the call site chosen from this event's frames would be frame id " +
                   std::to_string(index) + ", not below the limit of " +
                   std::to_string(limits_.max_frames) + " (max_frames)");
    }
    // The frame, its key, and the two map entries.
    frame_bytes_ += sizeof(Frame) + 1 + frame.name.size() + frame.filename.size() + key.size() +
                    4 * sizeof(std::size_t);
    if (frame_bytes_ > memory_budget_) return FramesOverBudget();
    *id = static_cast<std::int32_t>(index);
    frame.id = *id;
    frames_.push_back(std::move(frame));
    defined_.push_back(true);
    site_line_.emplace(index, line_number());
    id_of_site_.emplace(std::move(key), *id);
    return true;
  }

  bool FramesOverBudget() {
    return Limit(BudgetMessage(
        "the call sites (frame lines and events' frames) outgrew the "
        "memory budget",
        "memory", memory_budget_, frame_bytes_, memory_user_set_, "--max-memory", /*bytes=*/true));
  }

  std::unique_ptr<sources::LineReader> lines_;
  std::string name_;
  TraceLimits limits_;
  TraceHeader header_;
  std::vector<Frame> frames_;
  std::vector<bool> defined_;  // defined_[id]: a frame line or an event's frames defined id
  // Call sites chosen from events' frames: by the text of the `frames` array, and by the
  // chosen frame ("name\0filename\0line"); the line that defined each such id.
  struct TextHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view text) const {
      return std::hash<std::string_view>{}(text);
    }
  };
  std::unordered_map<std::string, std::int32_t, TextHash, std::equal_to<>> site_of_stack_;
  std::unordered_map<std::string, std::int32_t> id_of_site_;
  std::unordered_map<std::size_t, std::uint64_t> site_line_;
  std::vector<Frame> stack_;  // the current event's frames, reused
  std::uint64_t memory_budget_ = 0;
  bool memory_user_set_ = false;
  std::uint64_t frame_bytes_ = 0;  // what frames_ holds, as counted against memory_budget_
  std::uint64_t max_events_ = 0;
  bool events_user_set_ = false;
  std::uint64_t events_ = 0;
  Status failure_;  // sticky: the first error, with its location

  // Per-line state, reused so a line costs no allocation.
  Status error_;           // the current line's error, without location
  FieldMask present_ = 0;  // which known keys the line has
  JsonToken tokens_[kNumFields];
  std::string_view line_;            // the current line; tokens_ point into it
  std::string scratch_;              // a decoded key
  std::string decoded_[kNumFields];  // decoded string values
};

Result<std::unique_ptr<TraceReader>> OpenStream(std::unique_ptr<sources::ByteSource> source,
                                                std::string name, const TraceLimits& limits) {
  if (limits.max_line_bytes == 0) return Status::InvalidArgument("max_line_bytes must be > 0");
  Result<std::unique_ptr<sources::InputStream>> input =
      sources::InputStream::Open(std::move(source));
  if (!input.ok()) return input.status().WithPrefix(name);
  auto lines = std::make_unique<sources::LineReader>(std::move(*input), limits.max_line_bytes);
  auto reader = std::make_unique<TraceReaderImpl>(std::move(lines), std::move(name), limits);
  FRAGSCOPE_RETURN_IF_ERROR(reader->ReadHeader());
  return std::unique_ptr<TraceReader>(std::move(reader));
}

}  // namespace

Result<std::unique_ptr<TraceReader>> TraceReader::Open(const std::string& path,
                                                       const TraceLimits& limits) {
  Result<std::unique_ptr<sources::ByteSource>> source = sources::OpenFileSource(path);
  if (!source.ok()) return source.status();
  return OpenStream(std::move(*source), path, limits);
}

Result<std::unique_ptr<TraceReader>> TraceReader::FromBytes(std::string bytes, std::string name,
                                                            const TraceLimits& limits) {
  return OpenStream(sources::MemorySource(std::move(bytes)), std::move(name), limits);
}

}  // namespace fragscope
