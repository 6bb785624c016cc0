// DecodeSnapshot: Document -> Snapshot, and ReadSnapshotFile / ReadSnapshotBytes, the streaming
// decode (issue 34): the Decoder is also the pickle reader's PickleListSink, so a device trace
// list is taken at its first APPENDS (its items are all dicts with an "action") and its entries
// become compact records (TraceHistory) while the file is read; the Document keeps only the rest
// (segments, blocks, settings, annotations), decoded at the end, when Traces() finds which
// device each taken list is and places it (Place). Until then a taken list's errors and
// warnings wait with "device_traces[?]" for their prefix. See snapshot.h for the rules.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>

#include "common/keyed_hash.h"
#include "sources/budget.h"
#include "sources/document/json_document.h"
#include "sources/snapshot/snapshot.h"

namespace fragscope::sources {
namespace {

// A value's kind for messages: "str", "int", ...
std::string_view KindOf(Value v) { return ValueKindName(v.kind()); }

// What a trace entry's dict holds, gathered in one pass over its keys (from the Document, or
// from the pairs a PickleListSink receives).
struct EntryFields {
  std::optional<Value> action, addr, size, stream, time_us, frames, device_free, user_metadata;
  std::uint8_t keys = 0;  // the kKey* flags below: what Generation() looks for
};
constexpr std::uint8_t kKeyTime = 1, kKeyCompile = 2, kKeyMetadata = 4, kKeyPoolId = 8;

// The placeholder for "device_traces[D]" in what a taken list's entries say while it is read:
// which device a list is becomes known only when it is put into device_traces, at the end.
constexpr std::string_view kStreamWhere = "device_traces[?]";

class Decoder final : public PickleListSink {
 public:
  // Over a Document already built.
  Decoder(const Document& doc, const SnapshotDecodeOptions& options, Snapshot* out)
      : doc_(&doc),
        options_(options),
        out_(*out),
        events_user_set_(options.max_events != 0 || ProcessBudget().max_events != 0),
        max_events_(options.max_events != 0 ? options.max_events
                                            : EventBudgetFor(doc.input_bytes())),
        meter_(options.max_memory_bytes, doc.input_bytes(), doc.used_bytes()) {}
  // Streaming (issue 34): the sink of the pickle reader, then Run() over the Document it left.
  // `input_bytes` is the input's size as the budgets take it (0 = not known).
  Decoder(const SnapshotDecodeOptions& options, std::uint64_t input_bytes, Snapshot* out)
      : doc_(nullptr),
        options_(options),
        out_(*out),
        events_user_set_(options.max_events != 0 || ProcessBudget().max_events != 0),
        max_events_(options.max_events != 0 ? options.max_events : EventBudgetFor(input_bytes)),
        meter_(options.max_memory_bytes, input_bytes, 0) {}

  Status Run(const Document& doc) {
    doc_ = &doc;
    if (options_.max_events == 0) {
      max_events_ = std::max(max_events_, EventBudgetFor(doc.input_bytes()));
    }
    FRAGSCOPE_RETURN_IF_ERROR(Run());
    if (!streams_.empty() || took_frames_) Renumber();
    return Status::Ok();
  }

  // ---- PickleListSink: device trace lists taken while the pickle is read.

  Status TakeItems(const Document& doc, Value list, bool taken, std::span<const Value> items,
                   std::uint64_t offset, bool* take) override {
    doc_ = &doc;
    *take = false;
    if (taken && Interned(list) >= 0) return TakeFrames(list, items, take);
    if (!taken) {
      // A list is taken when its first items are all trace entries (dicts with an "action");
      // nothing else in a snapshot looks like that. A list of frame dicts is a stack.
      if (items.empty()) return Status::Ok();
      if (TakeFirstFrames(list, items)) {
        *take = true;
        return memory_status_;
      }
      for (const Value item : items) {
        if (item.kind() != ValueKind::kDict || !doc.Find(item, "action")) return Status::Ok();
      }
    }
    *take = true;
    Stream& stream = StreamOf(list);
    const std::uint64_t first = stream.count;
    stream.count += items.size();
    if (!stream.error.ok()) return Status::Ok();  // reported when the list is placed
    if (options_.max_events == 0) {
      max_events_ = std::max(max_events_, EventBudgetFor(offset));
    }
    Status status = CountEvents(items.size(), kStreamWhere);
    warn_into_ = &stream;
    for (std::size_t i = 0; i < items.size() && status.ok(); ++i) {
      status = StreamEntry(stream, items[i], first + i);
    }
    warn_into_ = nullptr;
    if (!status.ok()) {
      // Kept for when the list is placed (or dropped with it if never placed); its entries are
      // not needed any more.
      stream.error = std::move(status);
      history_bytes_ -= stream.entries.bytes();
      stream.entries = TraceHistory();
    }
    return memory_status_;  // the memory budget stops the reading at once
  }

  void DictItems(const Document& doc, Value dict, std::span<const Value> pairs) override {
    doc_ = &doc;
    Pending& p = PendingOf(*doc.Id(dict));
    for (std::size_t i = 0; i + 1 < pairs.size(); i += 2) AddField(pairs[i], pairs[i + 1], &p.f);
  }

  // A stack's frame dicts stay in the Document: TakeFrames reads them whole.
  bool RoutesDictItems(const Document& doc, Value list) override {
    doc_ = &doc;
    return Interned(list) < 0;
  }

  std::uint64_t used_bytes() const override {
    return history_bytes_ + pending_.capacity() * sizeof(Pending) +
           streams_.size() * sizeof(Stream) + interned_of_object_.capacity() * 4 +
           reached_.capacity() / 8 + meter_.used();
  }

  Status Run() {
    const Value root = doc_->root();
    if (root.kind() == ValueKind::kList) {
      out_.layout = SnapshotLayout::kSegmentList;
      FRAGSCOPE_RETURN_IF_ERROR(Segments(root, "[]"));
      out_.generation = GenerationFromSegments();
      return memory_status_;
    }
    if (root.kind() != ValueKind::kDict) {
      return Status::Corruption(
          fmt::format("not a memory snapshot: the top-level object is a {}, expected a dict with "
                      "\"segments\" or a list of segments",
                      KindOf(root)));
    }
    const std::optional<Value> segments = doc_->Find(root, "segments");
    if (!segments) {
      return Status::Corruption(
          "not a memory snapshot: the top-level dict has no \"segments\" key (keys: " +
          KeyList(root) + ")");
    }
    if (segments->kind() != ValueKind::kList) {
      return Status::Corruption(
          fmt::format("segments: expected a list, found {}", KindOf(*segments)));
    }
    FRAGSCOPE_RETURN_IF_ERROR(Segments(*segments, "segments"));
    // _memory_viz.py wraps a bare list as {"segments": ..., "traces": []}: accept that too.
    std::optional<Value> traces = doc_->Find(root, "device_traces");
    if (!traces) traces = doc_->Find(root, "traces");
    if (traces) FRAGSCOPE_RETURN_IF_ERROR(Traces(*traces));
    if (const std::optional<Value> settings = doc_->Find(root, "allocator_settings")) {
      Settings(*settings);
    }
    if (const std::optional<Value> annotations = doc_->Find(root, "external_annotations")) {
      Annotations(*annotations);
    }
    FRAGSCOPE_RETURN_IF_ERROR(memory_status_);
    out_.generation = Generation(root);
    return Status::Ok();
  }

 private:
  // ---- Fields.

  std::string KeyList(Value dict) const {
    std::string keys;
    std::size_t n = 0;
    for (const auto& [k, v] : doc_->Entries(dict)) {
      if (n == 8) {
        keys += ", ...";
        break;
      }
      if (n++ > 0) keys += ", ";
      const auto s = doc_->AsString(k);
      keys += s ? std::string(*s) : std::string("<") + std::string(KindOf(k)) + ">";
    }
    return keys.empty() ? "none" : keys;
  }

  // A required unsigned integer field.
  Status RequiredUint(Value dict, std::string_view key, const std::string& where,
                      std::uint64_t* out) const {
    const std::optional<Value> v = doc_->Find(dict, key);
    if (!v)
      return Status::Corruption(fmt::format("{}: the required key \"{}\" is missing", where, key));
    const std::optional<std::uint64_t> u = doc_->AsUint(*v);
    if (!u) {
      const std::optional<std::int64_t> i = doc_->AsInt(*v);
      if (i) {
        return Status::Corruption(
            fmt::format("{}.{}: expected a non-negative int, found {}", where, key, *i));
      }
      return Status::Corruption(
          fmt::format("{}.{}: expected an int, found {}", where, key, KindOf(*v)));
    }
    *out = *u;
    return Status::Ok();
  }

  // An optional unsigned integer; a wrong type warns and reads as absent.
  std::optional<std::uint64_t> OptionalUint(Value dict, std::string_view key,
                                            const std::string_view where, std::size_t index) {
    const std::optional<Value> v = doc_->Find(dict, key);
    if (!v || v->is_none()) return std::nullopt;
    const std::optional<std::uint64_t> u = doc_->AsUint(*v);
    if (!u)
      Warn(fmt::format("{}[{}].{}: expected an int, found {}; ignored", where, index, key,
                       KindOf(*v)));
    return u;
  }

  void Warn(std::string message) {
    if (warn_into_ != nullptr) {
      // A taken list's: kept until the list is placed, then warned in order.
      if (warn_into_->warnings.size() < options_.max_warnings) {
        warn_into_->warnings.push_back(std::move(message));
      } else {
        ++warn_into_->more_warnings;
      }
      return;
    }
    if (out_.warnings.size() < options_.max_warnings) {
      out_.warnings.push_back(std::move(message));
    } else {
      Suppress(1);
    }
  }
  // Counts `n` warnings beyond the cap.
  void Suppress(std::uint64_t n) {
    if (n == 0) return;
    suppressed_warnings_ += n;
    if (out_.warnings.size() == options_.max_warnings) {
      out_.warnings.push_back("");  // replaced by the count at the end
    }
    out_.warnings.back() = fmt::format("... and {} more warnings", suppressed_warnings_);
  }

  // ---- Budgets (issue 24 item 1).

  // Counts `n` more segments, blocks or trace entries, before they are decoded.
  Status CountEvents(std::uint64_t n, std::string_view where) {
    if (n <= max_events_ - std::min(events_, max_events_)) {
      events_ += n;
      return Status::Ok();
    }
    return Status::LimitExceeded(BudgetMessage(
        fmt::format("{}: {} more segments, blocks or trace entries after {}", where, n, events_),
        "event", max_events_, events_ + n, events_user_set_, "--max-events", /*bytes=*/false));
  }

  // PyTorch builds every segment, block and trace entry dict, and every blocks and trace list,
  // afresh; only frames and frame lists are shared (spec §4). A file that reaches one of these
  // twice through a memo reference is refused: sharing them is how a small file describes
  // billions of events.
  Status Once(Value v, std::string_view where) {
    return FirstVisit(v) ? Status::Ok() : SharedError(v, where);
  }
  // False when container `v` was reached before. Other kinds are not tracked: equal short
  // strings may share one object (the JSON reader interns them), and a string where a dict
  // belongs gets its own error.
  bool FirstVisit(Value v) {
    const ValueKind kind = v.kind();
    if (kind != ValueKind::kDict && kind != ValueKind::kList && kind != ValueKind::kTuple) {
      return true;
    }
    const std::optional<ObjectId> id = doc_->Id(v);
    if (!id) return true;
    if (*id >= reached_.size()) {
      reached_.resize(std::max<std::size_t>({*id + 1, doc_->object_count(), reached_.size() * 2}),
                      false);
    }
    if (reached_[*id]) return false;
    reached_[*id] = true;
    return true;
  }
  Status SharedError(Value v, std::string_view where) const {
    return Status::Corruption(fmt::format(
        "{}: this {} is the same object as one read before (a pickle memo reference); PyTorch "
        "never shares segments, blocks or trace entries, and such a file can stand for billions "
        "of events, so it is refused",
        where, KindOf(v)));
  }

  // ---- Stacks.

  // What an object of the Document was interned as (a text, frame or stack index; an object is
  // only ever one of the three kinds): a dense table over the object ids, kUnseen = not yet.
  static constexpr std::int32_t kUnseen = -2;
  std::int32_t Interned(Value v) const {
    const std::optional<ObjectId> id = doc_->Id(v);
    if (!id || *id >= interned_of_object_.size()) return kUnseen;
    return interned_of_object_[*id];
  }
  void SetInterned(Value v, std::int32_t index) {
    const std::optional<ObjectId> id = doc_->Id(v);
    if (!id) return;
    if (*id >= interned_of_object_.size()) {
      // Geometric: while a pickle is read, the object count grows with the file.
      interned_of_object_.resize(
          std::max<std::size_t>({*id + 1, doc_->object_count(), interned_of_object_.size() * 2}),
          kUnseen);
    }
    interned_of_object_[*id] = index;
  }

  // A string of the document as text the Snapshot keeps: at most kMaxTextBytes of it (a cut
  // text ends in "..."), interned by the document's object identity, then by content, so a
  // string a memo references from a million places is looked at, hashed and copied once
  // (issue 30 item 4). -1 for a value that is not a string.
  std::int32_t Text(Value v) {
    if (v.kind() != ValueKind::kString) return -1;
    if (const std::int32_t known = Interned(v); known != kUnseen) return known;
    std::string_view text = *doc_->AsString(v);
    std::string cut;
    if (text.size() > kMaxTextBytes) {
      cut.assign(text.substr(0, kMaxTextBytes));
      cut += "...";
      text = cut;
    }
    auto [it, inserted] =
        text_by_content_.try_emplace(std::string(text), static_cast<std::int32_t>(texts_.size()));
    if (inserted) {
      texts_.push_back(&it->first);
      Charge(it->first.size() + kStringOverhead);
    }
    SetInterned(v, it->second);
    return it->second;
  }
  std::int32_t EmptyText() {
    auto [it, inserted] =
        text_by_content_.try_emplace(std::string(), static_cast<std::int32_t>(texts_.size()));
    if (inserted) texts_.push_back(&it->first);
    return it->second;
  }
  const std::string& TextOf(std::int32_t id) const {
    static const std::string kEmpty;
    return id < 0 ? kEmpty : *texts_[static_cast<std::size_t>(id)];
  }
  // Charges the memory budget for a copy the Snapshot keeps; the first refusal sticks and
  // ends the decoding at the next check (Run, the list loops).
  void Charge(std::uint64_t bytes) {
    if (!memory_status_.ok()) return;
    memory_status_ = meter_.Charge(
        bytes, "the snapshot's strings (call sites, allocator settings, annotations)");
  }

  std::int32_t Frame(Value frame) {
    if (const std::int32_t known = Interned(frame); known != kUnseen) return known;
    std::int32_t name = -1, file = -1;
    std::int64_t line = 0;
    if (auto v = doc_->Find(frame, "name")) name = Text(*v);
    if (auto v = doc_->Find(frame, "filename")) file = Text(*v);
    if (auto v = doc_->Find(frame, "line")) line = doc_->AsInt(*v).value_or(0);
    // An absent or non-string name reads as "", the same frame as one whose name is "".
    if (name < 0) name = EmptyText();
    if (file < 0) file = EmptyText();
    // The key is the interned texts' ids and the line: fixed size, hashed in constant time.
    char key[16];
    std::memcpy(key, &name, 4);
    std::memcpy(key + 4, &file, 4);
    std::memcpy(key + 8, &line, 8);
    auto [it, inserted] = frame_by_content_.try_emplace(
        std::string(key, sizeof key), static_cast<std::int32_t>(out_.frames.size()));
    if (inserted) {
      SnapshotFrame f;
      f.name = TextOf(name);
      f.filename = TextOf(file);
      f.line = line;
      Charge(f.name.size() + f.filename.size() + sizeof(SnapshotFrame) + 2 * kStringOverhead);
      out_.frames.push_back(std::move(f));
    }
    SetInterned(frame, it->second);
    return it->second;
  }

  // A stack (list of frame dicts) as an index into out_.stacks; -1 when absent or empty.
  std::int32_t Stack(std::optional<Value> frames) {
    if (!frames || !frames->is_sequence()) return -1;
    if (const std::int32_t known = Interned(*frames); known != kUnseen) return known;
    const auto items = doc_->Items(*frames);
    // Lists with equal items share their storage in the Document: a fresh list with the frames
    // of a known stack (PyTorch makes many) is found by where its items are, in one lookup.
    const RunKey run{doc_->ItemsOffset(*frames), items.size()};
    if (!items.empty()) {
      if (const std::int32_t* found = stack_by_run_.Find(run)) {
        SetInterned(*frames, *found);
        return *found;
      }
    }
    std::int32_t result = -1;
    if (!items.empty()) {
      std::vector<std::uint32_t> stack;
      stack.reserve(items.size());
      for (const Value f : items) {
        if (f.kind() != ValueKind::kDict) continue;
        stack.push_back(static_cast<std::uint32_t>(Frame(f)));
      }
      if (!stack.empty()) {
        result = static_cast<std::int32_t>(out_.stacks.size());
        out_.stacks.push_back(std::move(stack));
      }
    }
    if (!items.empty()) stack_by_run_.Insert(run, result);
    SetInterned(*frames, result);
    return result;
  }

  // ---- Stacks while the pickle is read (issue 34): a list of frame dicts becomes a stack at
  // its first APPENDS and the Document keeps no items for it (8 bytes a frame: most of what a
  // file of many distinct stacks left there); Stack() then finds it by the list's identity like
  // any list it interned. Frame dicts stay whole in the Document. Which lists share a stack
  // follows the Document path, whose lists share their items' storage (and so a stack) when
  // their first items are the same objects: a stack is found by the frame dicts' identities
  // (their hash, then the content), and a list grown by a later APPENDS gets a stack of its own.

  // Takes the first items of `list` as its stack when they are all frame dicts: dicts interned
  // as frames before (a dict is interned only as a frame), or with a "filename" and no
  // "action". One pass: frames met before a non-frame item stay interned, unused (Renumber
  // drops them).
  bool TakeFirstFrames(Value list, std::span<const Value> items) {
    std::vector<std::uint32_t>& frames = frames_scratch_;
    std::vector<std::uint32_t>& ids = ids_scratch_;
    frames.clear();
    ids.clear();
    for (const Value item : items) {
      if (item.kind() != ValueKind::kDict) return false;
      const ObjectId id = *doc_->Id(item);
      std::int32_t frame = id < interned_of_object_.size() ? interned_of_object_[id] : kUnseen;
      if (frame == kUnseen) {
        if (!doc_->Find(item, "filename") || doc_->Find(item, "action")) return false;
        frame = Frame(item);
      }
      frames.push_back(static_cast<std::uint32_t>(frame));
      ids.push_back(id);
    }
    took_frames_ = true;
    SetInterned(list, InternStack(frames, ids));
    return true;
  }

  // Takes more `items` into the stack of `list`, taken before, as Stack() would read them
  // (non-dict items are skipped), into the list's own stack.
  Status TakeFrames(Value list, std::span<const Value> items, bool* take) {
    *take = true;
    const auto known = static_cast<std::size_t>(Interned(list));
    std::size_t index = known;
    if (index >= own_stack_.size() || !own_stack_[index]) {
      index = out_.stacks.size();
      out_.stacks.push_back(out_.stacks[known]);
      own_stack_.resize(index + 1, false);
      own_stack_[index] = true;
      Charge(out_.stacks.back().size() * 4 + sizeof(std::vector<std::uint32_t>));
      SetInterned(list, static_cast<std::int32_t>(index));
    }
    for (const Value f : items) {
      if (f.kind() != ValueKind::kDict) continue;
      const auto frame = static_cast<std::uint32_t>(Frame(f));
      out_.stacks[index].push_back(frame);
      Charge(4);
    }
    return memory_status_;
  }

  // The index in out_.stacks of the stack whose frame dicts are the objects `ids` (and whose
  // frames are `frames`), added when new.
  std::int32_t InternStack(std::span<const std::uint32_t> frames,
                           std::span<const std::uint32_t> ids) {
    // Seeded per process; a crafted file that still made one long cluster only loses sharing
    // past kMaxStackProbes (issue 24 item 2: every reader linear in its input).
    const std::uint64_t hash = HashIds(ids);
    if ((stacks_by_content_used_ + 1) * 2 > stack_by_content_.size()) GrowStackTable();
    const std::size_t mask = stack_by_content_.size() - 1;
    std::size_t i = hash & mask;
    for (std::size_t probes = 0; stack_by_content_[i].stack >= 0; i = (i + 1) & mask) {
      if (++probes > kMaxStackProbes) {
        out_.stacks.emplace_back(frames.begin(), frames.end());
        Charge(frames.size_bytes() + sizeof(std::vector<std::uint32_t>));
        return static_cast<std::int32_t>(out_.stacks.size() - 1);
      }
      const StackSlot& slot = stack_by_content_[i];
      if (slot.hash != hash) continue;
      const std::vector<std::uint32_t>& known = out_.stacks[static_cast<std::size_t>(slot.stack)];
      if (std::equal(known.begin(), known.end(), frames.begin(), frames.end())) return slot.stack;
    }
    const auto stack = static_cast<std::int32_t>(out_.stacks.size());
    out_.stacks.emplace_back(frames.begin(), frames.end());
    Charge(frames.size_bytes() + sizeof(std::vector<std::uint32_t>) + sizeof(StackSlot) * 2);
    stack_by_content_[i] = StackSlot{hash, stack};
    ++stacks_by_content_used_;
    return stack;
  }
  // Two ids a word, two words a step in independent lanes: the multiply's latency, not the
  // work, bounds a single chain (a third of the time taking stacks).
  std::uint64_t HashIds(std::span<const std::uint32_t> ids) const {
    constexpr std::uint64_t kMul0 = 0x9E3779B97F4A7C15ull, kMul1 = 0xC2B2AE3D27D4EB4Full;
    std::uint64_t a = stack_hash_seed_ ^ ids.size(), b = ~stack_hash_seed_;
    std::size_t i = 0;
    const auto pair = [&](std::size_t at) { return ids[at] | std::uint64_t{ids[at + 1]} << 32; };
    for (; i + 4 <= ids.size(); i += 4) {
      a = (a ^ pair(i)) * kMul0;
      b = (b ^ pair(i + 2)) * kMul1;
      a ^= a >> 31;
      b ^= b >> 29;
    }
    for (; i < ids.size(); ++i) a = (a ^ ids[i]) * kMul1;
    std::uint64_t h = (a ^ (b >> 17) ^ (b << 47)) * kMul0;
    return h ^ (h >> 32);
  }
  void GrowStackTable() {
    std::vector<StackSlot> old(std::max<std::size_t>(64, stack_by_content_.size() * 2));
    old.swap(stack_by_content_);
    const std::size_t mask = stack_by_content_.size() - 1;
    for (const StackSlot& slot : old) {
      if (slot.stack < 0) continue;
      std::size_t i = slot.hash & mask;
      while (stack_by_content_[i].stack >= 0) i = (i + 1) & mask;
      stack_by_content_[i] = slot;
    }
  }

  // ---- Segments and blocks.

  Status Segments(Value list, std::string_view where) {
    FRAGSCOPE_RETURN_IF_ERROR(NotStream(list, where));
    const auto items = doc_->Items(list);
    FRAGSCOPE_RETURN_IF_ERROR(CountEvents(items.size(), where));
    out_.segments.reserve(items.size());
    for (std::size_t i = 0; i < items.size(); ++i) {
      FRAGSCOPE_RETURN_IF_ERROR(memory_status_);
      FRAGSCOPE_RETURN_IF_ERROR(Once(items[i], fmt::format("{}[{}]", where, i)));
      FRAGSCOPE_RETURN_IF_ERROR(Segment(items[i], fmt::format("{}[{}]", where, i)));
    }
    return Status::Ok();
  }

  Status Segment(Value seg, const std::string& where) {
    if (seg.kind() != ValueKind::kDict) {
      return Status::Corruption(
          fmt::format("{}: expected a segment dict, found {}", where, KindOf(seg)));
    }
    SnapshotSegment s;
    FRAGSCOPE_RETURN_IF_ERROR(RequiredUint(seg, "address", where, &s.addr));
    FRAGSCOPE_RETURN_IF_ERROR(RequiredUint(seg, "total_size", where, &s.total_size));
    const std::size_t index = out_.segments.size();
    if (auto device = doc_->Find(seg, "device")) {
      const std::optional<std::int64_t> d = doc_->AsInt(*device);
      if (!d || *d < 0 || *d > 65535) {
        return Status::Corruption(fmt::format("{}.device: expected a device ordinal, found {}",
                                              where, d ? std::to_string(*d) : KindOf(*device)));
      }
      s.device = static_cast<std::int32_t>(*d);
    }
    s.stream = OptionalUint(seg, "stream", "segments", index).value_or(0);
    if (auto type = doc_->Find(seg, "segment_type")) {
      const auto t = doc_->AsString(*type);
      if (t == "small") {
        s.pool = Pool::kSmall;
      } else if (t == "large") {
        s.pool = Pool::kLarge;
      } else {
        Warn(fmt::format("{}.segment_type: expected \"small\" or \"large\"; ignored", where));
      }
    }
    if (auto exp = doc_->Find(seg, "is_expandable"))
      s.expandable = doc_->AsBool(*exp).value_or(false);
    if (auto pool_id = doc_->Find(seg, "segment_pool_id")) {
      const auto ids = doc_->Items(*pool_id);
      if (ids.size() == 2) {
        s.pool_id = {doc_->AsInt(ids[0]).value_or(0), doc_->AsInt(ids[1]).value_or(0)};
      }
    }
    s.stack = Stack(doc_->Find(seg, "frames"));
    s.allocated_size = OptionalUint(seg, "allocated_size", "segments", index);
    s.active_size = OptionalUint(seg, "active_size", "segments", index);
    s.requested_size = OptionalUint(seg, "requested_size", "segments", index);

    const std::optional<Value> blocks = doc_->Find(seg, "blocks");
    if (!blocks)
      return Status::Corruption(fmt::format("{}: the required key \"blocks\" is missing", where));
    if (!blocks->is_sequence()) {
      return Status::Corruption(
          fmt::format("{}.blocks: expected a list, found {}", where, KindOf(*blocks)));
    }
    FRAGSCOPE_RETURN_IF_ERROR(Once(*blocks, where + ".blocks"));
    FRAGSCOPE_RETURN_IF_ERROR(NotStream(*blocks, where + ".blocks"));
    s.first_block = static_cast<std::uint32_t>(out_.blocks.size());
    std::uint64_t offset = 0;
    const auto items = doc_->Items(*blocks);
    FRAGSCOPE_RETURN_IF_ERROR(CountEvents(items.size(), where + ".blocks"));
    for (std::size_t b = 0; b < items.size(); ++b) {
      SnapshotBlock block;
      const std::string block_where = fmt::format("{}.blocks[{}]", where, b);
      FRAGSCOPE_RETURN_IF_ERROR(Once(items[b], block_where));
      FRAGSCOPE_RETURN_IF_ERROR(Block(items[b], block_where, s.addr + offset, &block));
      offset += block.size;
      out_.blocks.push_back(block);
    }
    s.num_blocks = static_cast<std::uint32_t>(items.size());
    if (offset != s.total_size) {
      Warn(fmt::format("{}: its blocks add up to {} bytes, not total_size {}", where, offset,
                       s.total_size));
    } else {
      for (std::uint32_t b = 0; b < s.num_blocks; ++b) {
        const SnapshotBlock& block = out_.blocks[s.first_block + b];
        const std::uint64_t expected = b == 0 ? s.addr
                                              : out_.blocks[s.first_block + b - 1].addr +
                                                    out_.blocks[s.first_block + b - 1].size;
        if (block.addr != expected) {
          Warn(fmt::format("{}.blocks[{}]: address {:#x} leaves a gap or overlap (expected {:#x})",
                           where, b, block.addr, expected));
          break;
        }
      }
    }
    if (s.pool == Pool::kUnknown) {
      // G0 files have no segment_type: small segments are exactly 2 MiB (spec §3).
      s.pool =
          s.total_size == (std::uint64_t{2} << 20) && !s.expandable ? Pool::kSmall : Pool::kLarge;
    }
    out_.segments.push_back(s);
    return Status::Ok();
  }

  Status Block(Value value, const std::string& where, std::uint64_t running_addr,
               SnapshotBlock* b) {
    if (value.kind() != ValueKind::kDict) {
      return Status::Corruption(
          fmt::format("{}: expected a block dict, found {}", where, KindOf(value)));
    }
    FRAGSCOPE_RETURN_IF_ERROR(RequiredUint(value, "size", where, &b->size));
    const std::optional<Value> state = doc_->Find(value, "state");
    if (!state)
      return Status::Corruption(fmt::format("{}: the required key \"state\" is missing", where));
    const std::optional<std::string_view> s = doc_->AsString(*state);
    if (s == "active_allocated") {
      b->state = model::BlockState::kAllocated;
    } else if (s == "active_pending_free" || s == "active_awaiting_free") {
      b->state = model::BlockState::kPendingFree;
    } else if (s == "inactive") {
      b->state = model::BlockState::kFree;
    } else {
      return Status::Corruption(fmt::format(
          "{}.state: expected \"active_allocated\", \"active_pending_free\" or \"inactive\", "
          "found {}",
          where, s ? fmt::format("\"{}\"", *s) : std::string(KindOf(*state))));
    }
    b->addr = running_addr;
    if (auto addr = doc_->Find(value, "address")) {
      if (const auto a = doc_->AsUint(*addr)) {
        b->addr = *a;
        saw_block_address_ = true;
      }
    }
    // Spec §7: requested_size, else history[0].real_size, else size.
    std::optional<Value> history_first;
    if (auto history = doc_->Find(value, "history")) {
      const auto h = doc_->Items(*history);
      if (!h.empty() && h[0].kind() == ValueKind::kDict) history_first = h[0];
    }
    if (history_first) FRAGSCOPE_RETURN_IF_ERROR(Once(*history_first, where + ".history[0]"));
    b->requested = b->size;
    if (auto req = doc_->Find(value, "requested_size"); req && doc_->AsUint(*req)) {
      b->requested = *doc_->AsUint(*req);
    } else if (history_first) {
      if (auto real = doc_->Find(*history_first, "real_size"); real && doc_->AsUint(*real)) {
        b->requested = *doc_->AsUint(*real);
      }
    }
    if (b->state != model::BlockState::kFree) {
      std::optional<Value> frames = doc_->Find(value, "frames");
      if (!frames && history_first) frames = doc_->Find(*history_first, "frames");
      b->stack = Stack(frames);
    }
    return Status::Ok();
  }

  // ---- Traces.

  Status Traces(Value traces) {
    if (!traces.is_sequence()) {
      Warn(
          fmt::format("device_traces: expected a list, found {}; no history read", KindOf(traces)));
      return Status::Ok();
    }
    const auto devices = doc_->Items(traces);
    if (devices.size() > 65536) {
      return Status::Corruption(
          fmt::format("device_traces: {} device lists (more than 65536)", devices.size()));
    }
    out_.device_traces.resize(devices.size());
    first_keys_.resize(devices.size());
    for (std::size_t d = 0; d < devices.size(); ++d) {
      if (!devices[d].is_sequence()) {
        Warn(fmt::format("device_traces[{}]: expected a list, found {}; ignored", d,
                         KindOf(devices[d])));
        continue;
      }
      const std::string list_where = fmt::format("device_traces[{}]", d);
      FRAGSCOPE_RETURN_IF_ERROR(Once(devices[d], list_where));
      if (Stream* stream = FindStream(devices[d])) {
        FRAGSCOPE_RETURN_IF_ERROR(Place(stream, d, list_where));
        continue;
      }
      if (took_frames_ && Interned(devices[d]) >= 0) return FramesError(list_where);
      const auto entries = doc_->Items(devices[d]);
      if (entries.size() > 0xffffffffu) {
        return Status::Corruption(fmt::format("device_traces[{}]: too many entries", d));
      }
      FRAGSCOPE_RETURN_IF_ERROR(CountEvents(entries.size(), list_where));
      auto& out = out_.device_traces[d];
      for (std::size_t i = 0; i < entries.size(); ++i) {
        if (!FirstVisit(entries[i])) [[unlikely]] {  // the hot loop: no message unless needed
          return SharedError(entries[i], fmt::format("{}[{}]", list_where, i));
        }
        if (!memory_status_.ok()) [[unlikely]] {
          return memory_status_.WithPrefix(fmt::format("{}[{}]", list_where, i));
        }
        EntryFields f;
        if (entries[i].kind() == ValueKind::kDict) {
          for (const auto& [k, v] : doc_->Entries(entries[i])) AddField(k, v, &f);
        }
        FRAGSCOPE_RETURN_IF_ERROR(
            Entry(entries[i], f, list_where, i, &out, &out_.trace_annotations, &first_keys_[d]));
      }
      for (std::size_t a = annotations_placed_; a < out_.trace_annotations.size(); ++a) {
        out_.trace_annotations[a].device = static_cast<std::int32_t>(d);
      }
      annotations_placed_ = out_.trace_annotations.size();
      out_.trace_entries += entries.size();
    }
    return Status::Ok();
  }

  // One key of a trace entry's dict. Entries are small dicts and this is the hot loop.
  void AddField(Value k, Value v, EntryFields* f) const {
    const std::optional<std::string_view> key = doc_->AsString(k);
    if (!key) return;
    if (*key == "action") {
      f->action = v;
    } else if (*key == "addr") {
      f->addr = v;
    } else if (*key == "size") {
      f->size = v;
    } else if (*key == "stream") {
      f->stream = v;
    } else if (*key == "time_us") {
      f->time_us = v;
      f->keys |= kKeyTime;
    } else if (*key == "frames") {
      f->frames = v;
    } else if (*key == "device_free") {
      f->device_free = v;
    } else if (*key == "user_metadata") {
      f->user_metadata = v;
      f->keys |= kKeyMetadata;
    } else if (*key == "compile_context") {
      f->keys |= kKeyCompile;
    } else if (*key == "pool_id") {
      f->keys |= kKeyPoolId;
    }
  }

  // Entry `index` of a device's list, `e` with the fields `f`; `list_where` names the list.
  // Annotations go to *annotations (their device is set by the caller), the keys of the
  // list's first entries to *first_keys (for Generation()).
  Status Entry(Value e, const EntryFields& f, std::string_view list_where, std::uint64_t index,
               TraceHistory* out, std::vector<SnapshotTraceAnnotation>* annotations,
               std::vector<std::uint8_t>* first_keys) {
    const auto where = [&] { return fmt::format("{}[{}]", list_where, index); };
    if (e.kind() != ValueKind::kDict) {
      return Status::Corruption(
          fmt::format("{}: expected a trace entry dict, found {}", where(), KindOf(e)));
    }
    if (first_keys->size() < kGenerationEntries) first_keys->push_back(f.keys);
    if (!f.action) return Status::Corruption(where() + ": the required key \"action\" is missing");
    const std::optional<std::string_view> name = doc_->AsString(*f.action);
    if (!name) {
      return Status::Corruption(
          fmt::format("{}.action: expected a str, found {}", where(), KindOf(*f.action)));
    }
    SnapshotTraceEntry t;
    t.entry = static_cast<std::uint32_t>(index);
    bool merged_free = false;
    if (*name == "free") {  // old files: one merged event (spec §4)
      t.action = Action::kFreeRequested;
      merged_free = true;
    } else if (const std::optional<Action> a = ParseActionName(*name);
               a && *a <= Action::kSnapshot) {
      t.action = *a;
    } else {
      // annotate and anything newer: not part of the memory history.
      ++out_.ignored_entries;
      if (*name == "annotate") {
        Annotate(f, index, out->size(), annotations);
      } else {
        Warn(fmt::format("{}: unknown action \"{}\"; ignored", where(), *name));
      }
      return Status::Ok();
    }
    const bool needs_addr = t.action != Action::kOom && t.action != Action::kSnapshot;
    if (needs_addr) {
      if (!f.addr) return Status::Corruption(where() + ": the required key \"addr\" is missing");
      const auto a = doc_->AsUint(*f.addr);
      if (!a) {
        return Status::Corruption(
            fmt::format("{}.addr: expected an int, found {}", where(), KindOf(*f.addr)));
      }
      t.addr = *a;
    }
    if (t.action != Action::kSnapshot) {
      if (!f.size) return Status::Corruption(where() + ": the required key \"size\" is missing");
      const auto s = doc_->AsUint(*f.size);
      if (!s) {
        return Status::Corruption(
            fmt::format("{}.size: expected an int, found {}", where(), KindOf(*f.size)));
      }
      t.size = *s;
    }
    if (f.stream) t.stream = doc_->AsUint(*f.stream).value_or(0);
    if (f.time_us) t.time_us = doc_->AsInt(*f.time_us).value_or(-1);
    if (f.device_free) t.device_free = doc_->AsUint(*f.device_free).value_or(0);
    t.stack = Stack(f.frames);
    out->push_back(t);
    if (merged_free) {
      t.action = Action::kFreeCompleted;
      out->push_back(t);
    }
    return Status::Ok();
  }

  // An annotate entry: where it stands among the entries kept, and its text (user_metadata).
  void Annotate(const EntryFields& f, std::uint64_t index, std::size_t before,
                std::vector<SnapshotTraceAnnotation>* annotations) {
    SnapshotTraceAnnotation a;
    a.before = static_cast<std::uint32_t>(before);
    a.entry = static_cast<std::uint32_t>(index);
    if (f.user_metadata) a.text = TextOf(Text(*f.user_metadata));
    Charge(a.text.size() + sizeof(SnapshotTraceAnnotation) + kStringOverhead);
    annotations->push_back(std::move(a));
  }

  // ---- Streaming: the device lists the pickle reader hands over (issue 34).

  // A list of trace entries where segments or blocks belong.
  Status NotStream(Value list, std::string_view where) {
    if (took_frames_ && Interned(list) >= 0) return FramesError(where);
    if (FindStream(list) == nullptr) return Status::Ok();
    return Status::Corruption(fmt::format(
        "{}: expected a list of {}, found a list of trace entries (dicts with an \"action\")",
        where, where.ends_with(".blocks") ? "blocks" : "segments"));
  }

  // A stack where segments, blocks or trace entries belong (its items are not in the Document).
  static Status FramesError(std::string_view where) {
    return Status::Corruption(fmt::format(
        "{}: expected a list of {}, found a list of stack frames (dicts with a \"filename\")",
        where,
        where.ends_with(".blocks") ? "blocks"
        : where.ends_with("]")     ? "trace entries"
                                   : "segments"));
  }

  // A list taken while the pickle is read: its entries decoded as they came, and what they
  // said, until Traces() finds which device it is (Place).
  struct Stream {
    std::uint64_t count = 0;  // items taken: the index of the next
    TraceHistory entries;
    std::vector<SnapshotTraceAnnotation> annotations;
    std::vector<std::uint8_t> first_keys;
    std::vector<std::string> warnings;  // each begins with kStreamWhere
    std::uint64_t more_warnings = 0;
    Status error;  // the first error, beginning with kStreamWhere; entries are dropped then
  };
  // A dict of a taken list's frame whose pairs came before the dict itself.
  struct Pending {
    ObjectId id = 0;
    bool done = false;
    EntryFields f;
  };

  Stream& StreamOf(Value list) {
    const ObjectId id = *doc_->Id(list);
    auto [it, inserted] = stream_of_list_.try_emplace(id, streams_.size());
    if (inserted) streams_.emplace_back();
    return streams_[it->second];
  }
  Stream* FindStream(Value list) {
    const std::optional<ObjectId> id = doc_->Id(list);
    if (!id || stream_of_list_.empty()) return nullptr;
    const auto it = stream_of_list_.find(*id);
    return it == stream_of_list_.end() ? nullptr : &streams_[it->second];
  }
  static std::string Placed(std::string_view message, std::string_view list_where) {
    if (message.substr(0, kStreamWhere.size()) != kStreamWhere) return std::string(message);
    return std::string(list_where) + std::string(message.substr(kStreamWhere.size()));
  }

  // The pending fields of dict `id`, made if new. Dicts are filled and taken in the order they
  // were made nearly always: the table is kept sorted by id and consumed from the front.
  Pending& PendingOf(ObjectId id) {
    if (pending_.empty() || pending_.back().id < id) {
      pending_.push_back(Pending{id, false, {}});
      return pending_.back();
    }
    auto it = std::lower_bound(pending_.begin() + static_cast<std::ptrdiff_t>(pending_head_),
                               pending_.end(), id,
                               [](const Pending& p, ObjectId key) { return p.id < key; });
    if (it == pending_.end() || it->id != id) it = pending_.insert(it, Pending{id, false, {}});
    return *it;
  }
  // Takes the pending fields of dict `id` into *f, if any.
  void TakePending(ObjectId id, EntryFields* f) {
    if (pending_head_ == pending_.size()) return;
    Pending* p = nullptr;
    if (pending_[pending_head_].id == id) {
      p = &pending_[pending_head_];
    } else {
      const auto it = std::lower_bound(
          pending_.begin() + static_cast<std::ptrdiff_t>(pending_head_), pending_.end(), id,
          [](const Pending& q, ObjectId key) { return q.id < key; });
      if (it == pending_.end() || it->id != id || it->done) return;
      p = &*it;
    }
    const EntryFields& g = p->f;
    // Pairs set after the Document's own entries: they come later, and the last one wins.
    for (std::optional<Value> EntryFields::*field :
         {&EntryFields::action, &EntryFields::addr, &EntryFields::size, &EntryFields::stream,
          &EntryFields::time_us, &EntryFields::frames, &EntryFields::device_free,
          &EntryFields::user_metadata}) {
      if (g.*field) f->*field = g.*field;
    }
    f->keys |= g.keys;
    p->done = true;
    while (pending_head_ < pending_.size() && pending_[pending_head_].done) ++pending_head_;
    if (pending_head_ == pending_.size()) {
      pending_.clear();
      pending_head_ = 0;
    } else if (pending_head_ >= 4096 && pending_head_ * 2 >= pending_.size()) {
      pending_.erase(pending_.begin(),
                     pending_.begin() + static_cast<std::ptrdiff_t>(pending_head_));
      pending_head_ = 0;
    }
  }

  // Item `index` of a taken list.
  Status StreamEntry(Stream& stream, Value e, std::uint64_t index) {
    if (!FirstVisit(e)) [[unlikely]] {
      return SharedError(e, fmt::format("{}[{}]", kStreamWhere, index));
    }
    if (index > 0xffffffffu) [[unlikely]] {
      return Status::Corruption(fmt::format("{}: too many entries", kStreamWhere));
    }
    EntryFields f;
    if (e.kind() == ValueKind::kDict) {
      for (const auto& [k, v] : doc_->Entries(e)) AddField(k, v, &f);
      TakePending(*doc_->Id(e), &f);
    }
    const std::uint64_t before = stream.entries.bytes();
    FRAGSCOPE_RETURN_IF_ERROR(
        Entry(e, f, kStreamWhere, index, &stream.entries, &stream.annotations, &stream.first_keys));
    history_bytes_ += stream.entries.bytes() - before;
    return Status::Ok();
  }

  // Numbers stacks and frames in the order the Document path meets them (segments, each one's
  // blocks, then the device lists), which streaming does not follow: it meets the trace entries
  // first. Stacks and frames that only lists never placed used are dropped, as that path never
  // decodes them. Output then does not depend on the path (frame ids in `convert`, ...).
  void Renumber() {
    std::vector<std::int32_t> new_stack(out_.stacks.size(), -1);
    std::vector<std::int32_t> new_frame(out_.frames.size(), -1);
    std::vector<std::vector<std::uint32_t>> stacks;
    std::vector<SnapshotFrame> frames;
    const auto visit = [&](std::int32_t* stack) {
      if (*stack < 0) return;
      std::int32_t& renumbered = new_stack[static_cast<std::size_t>(*stack)];
      if (renumbered < 0) {
        renumbered = static_cast<std::int32_t>(stacks.size());
        std::vector<std::uint32_t> frame_ids =
            std::move(out_.stacks[static_cast<std::size_t>(*stack)]);
        for (std::uint32_t& f : frame_ids) {
          std::int32_t& to = new_frame[f];
          if (to < 0) {
            to = static_cast<std::int32_t>(frames.size());
            frames.push_back(std::move(out_.frames[f]));
          }
          f = static_cast<std::uint32_t>(to);
        }
        stacks.push_back(std::move(frame_ids));
      }
      *stack = renumbered;
    };
    for (SnapshotSegment& seg : out_.segments) {
      visit(&seg.stack);
      for (std::uint32_t b = 0; b < seg.num_blocks; ++b)
        visit(&out_.blocks[seg.first_block + b].stack);
    }
    for (const TraceHistory& device : out_.device_traces) {
      for (std::int32_t stack : device.first_stacks()) visit(&stack);  // the entries' order
    }
    const auto map = std::make_shared<const std::vector<std::int32_t>>(std::move(new_stack));
    for (TraceHistory& device : out_.device_traces) {
      if (!device.empty()) device.MapStacks(map);
    }
    out_.stacks = std::move(stacks);
    out_.frames = std::move(frames);
  }

  // Puts a taken list at device_traces[d]: its error, warnings, annotations and entries.
  Status Place(Stream* stream, std::size_t d, const std::string& list_where) {
    if (!stream->error.ok()) {
      return Status(stream->error.code(), Placed(stream->error.message(), list_where));
    }
    for (std::string& w : stream->warnings) Warn(Placed(w, list_where));
    Suppress(stream->more_warnings);
    for (SnapshotTraceAnnotation& a : stream->annotations) {
      a.device = static_cast<std::int32_t>(d);
      out_.trace_annotations.push_back(std::move(a));
    }
    annotations_placed_ = out_.trace_annotations.size();
    first_keys_[d] = std::move(stream->first_keys);
    out_.trace_entries += stream->count;
    history_bytes_ -= stream->entries.bytes();
    out_.device_traces[d] = std::move(stream->entries);
    *stream = Stream();
    return Status::Ok();
  }

  // ---- allocator_settings and external_annotations.

  // Appends `v` as text to *out, which stops growing past kMaxTextBytes (then it ends in
  // "..."): a setting is a short option value, and a file can make one stand for gigabytes
  // (a string shared by every key, a dict of a million entries; issue 30 item 4).
  void Render(Value v, std::string* out, int depth = 0) const {
    if (out->size() > kMaxTextBytes) return;
    switch (v.kind()) {
      case ValueKind::kNone:
        *out += "None";
        break;
      case ValueKind::kBool:
        *out += *doc_->AsBool(v) ? "True" : "False";
        break;
      case ValueKind::kInt:
        *out += std::to_string(*doc_->AsInt(v));
        break;
      case ValueKind::kFloat:
        *out += fmt::format("{}", *doc_->AsDouble(v));
        break;
      case ValueKind::kString:
        *out += doc_->AsString(v)->substr(0, kMaxTextBytes + 1 - out->size());
        break;
      case ValueKind::kDict: {
        if (depth > 0) {
          *out += "{...}";
          break;
        }
        *out += '[';
        bool first = true;
        for (const auto& [k, val] : doc_->Entries(v)) {
          if (out->size() > kMaxTextBytes) break;
          if (!first) *out += ',';
          first = false;
          Render(k, out, depth + 1);
          *out += ':';
          Render(val, out, depth + 1);
        }
        *out += ']';
        break;
      }
      default:
        *out += fmt::format("<{}>", KindOf(v));
    }
  }
  std::string Render(Value v) const {
    std::string out;
    Render(v, &out);
    if (out.size() > kMaxTextBytes) {
      out.resize(kMaxTextBytes);
      out += "...";
    }
    return out;
  }

  void Settings(Value settings) {
    if (settings.kind() != ValueKind::kDict) {
      Warn(fmt::format("allocator_settings: expected a dict, found {}; ignored", KindOf(settings)));
      return;
    }
    out_.has_allocator_settings = true;
    const auto entries = doc_->Entries(settings);
    std::size_t kept = 0;
    for (const auto& [k, v] : entries) {
      const auto key = doc_->AsString(k);
      if (!key) continue;
      if (kept == kMaxSettings) {
        Warn(fmt::format("allocator_settings: more than {} keys; the rest are ignored",
                         kMaxSettings));
        break;
      }
      ++kept;
      std::string text = Render(v);
      std::string name(key->substr(0, kMaxTextBytes));
      Charge(name.size() + text.size() + 2 * kStringOverhead);
      if (!memory_status_.ok()) return;
      out_.allocator_settings.emplace_back(std::move(name), std::move(text));
    }
  }

  void Annotations(Value list) {
    for (const Value a : doc_->Items(list)) {
      if (!memory_status_.ok()) return;
      if (a.kind() != ValueKind::kDict) continue;
      // A shared annotation dict would be searched again at each reference: read each once.
      if (!Once(a, "external_annotations").ok()) continue;
      SnapshotAnnotation n;
      if (auto v = doc_->Find(a, "stage")) n.stage = TextOf(Text(*v));
      if (auto v = doc_->Find(a, "name")) n.name = TextOf(Text(*v));
      if (auto v = doc_->Find(a, "device")) {
        n.device = static_cast<std::int32_t>(doc_->AsInt(*v).value_or(0));
      }
      if (auto v = doc_->Find(a, "time_us")) n.time_us = doc_->AsInt(*v).value_or(-1);
      Charge(n.stage.size() + n.name.size() + sizeof(SnapshotAnnotation) + 2 * kStringOverhead);
      out_.annotations.push_back(std::move(n));
    }
  }

  // ---- Generation (spec §7), from the keys present.

  // A bare segment list (torch.cuda.memory_snapshot()): G0 when blocks carry no address.
  std::string GenerationFromSegments() const {
    return saw_block_address_ || out_.segments.empty() ? "segment list" : "segment list, G0";
  }

  std::string Generation(Value root) const {
    // The keys of the first entries of device_traces (recorded as they were decoded: a taken
    // list's entries are no longer in the Document).
    std::uint8_t keys = 0;
    std::size_t looked = 0;
    if (doc_->Find(root, "device_traces")) {
      for (const std::vector<std::uint8_t>& device : first_keys_) {
        for (const std::uint8_t k : device) {
          keys |= k;
          if (++looked == kGenerationEntries) break;
        }
        if (looked >= kGenerationEntries) break;
      }
    }
    const bool has_time = (keys & kKeyTime) != 0, has_compile = (keys & kKeyCompile) != 0,
               has_metadata = (keys & kKeyMetadata) != 0, has_pool_id = (keys & kKeyPoolId) != 0;
    bool block_address = false, block_history = false, segment_pool = false;
    for (const Value seg : doc_->Items(*doc_->Find(root, "segments"))) {
      segment_pool |= doc_->Find(seg, "segment_pool_id").has_value();
      for (const Value b : doc_->Items(doc_->Find(seg, "blocks").value_or(Value()))) {
        block_address |= doc_->Find(b, "address").has_value();
        block_history |= doc_->Find(b, "history").has_value();
        break;
      }
    }
    if (has_pool_id || doc_->Find(root, "host_segments")) return "G6";
    if (has_metadata) return "G5";
    if (has_compile) return "G4";
    if (doc_->Find(root, "external_annotations")) return "G3";
    if (doc_->Find(root, "allocator_settings")) return "G3a";
    if (has_time) return "G2";
    if (block_address || segment_pool) return "G1";
    if (block_history || !out_.segments.empty() || out_.trace_entries > 0) return "G0";
    return "?";
  }

  const Document* doc_;  // the one being read while streaming; moved after it
  const SnapshotDecodeOptions& options_;
  Snapshot& out_;
  // The longest text kept from a string of the file (a frame's name or file name, a setting, an
  // annotation): real ones are names and paths (PATH_MAX is 4096); longer ones are cut.
  static constexpr std::size_t kMaxTextBytes = 4096;
  static constexpr std::size_t kMaxSettings = 1024;  // PyTorch records about ten
  // What a kept std::string costs besides its characters (its object, the heap block's header).
  static constexpr std::uint64_t kStringOverhead = 48;
  static constexpr std::size_t kGenerationEntries = 64;  // entries Generation() looks at
  std::size_t suppressed_warnings_ = 0;
  bool saw_block_address_ = false;
  struct RunKey {
    std::uint64_t offset;  // Document::ItemsOffset: stable while a pickle is still being read
    std::size_t size;      // 0 = an empty slot (empty stacks are never looked up)
    bool operator==(const RunKey&) const = default;
  };
  // Stack by item run: an open-addressing table with linear probing. It is looked up once per
  // trace entry (millions), holds one key per distinct stack (thousands), and never erases; a
  // node-based map cost a division and a pointer chase per lookup.
  class RunTable {
   public:
    RunTable() : slots_(64) {}
    const std::int32_t* Find(const RunKey& key) const {
      for (std::size_t i = Slot(key);; i = (i + 1) & (slots_.size() - 1)) {
        const Entry& e = slots_[i];
        if (e.key.size == 0) return nullptr;
        if (e.key == key) return &e.value;
      }
    }
    /// REQUIRES: key.size != 0 and key is not present.
    void Insert(const RunKey& key, std::int32_t value) {
      if ((size_ + 1) * 2 > slots_.size()) Grow();
      std::size_t i = Slot(key);
      while (slots_[i].key.size != 0) i = (i + 1) & (slots_.size() - 1);
      slots_[i] = Entry{key, value};
      ++size_;
    }

   private:
    struct Entry {
      RunKey key{0, 0};
      std::int32_t value = 0;
    };
    std::size_t Slot(const RunKey& k) const {
      std::uint64_t h = k.offset ^ (k.size * 0x9e3779b97f4a7c15ULL);
      h ^= h >> 29;
      h *= 0xbf58476d1ce4e5b9ULL;
      h ^= h >> 32;
      return static_cast<std::size_t>(h) & (slots_.size() - 1);
    }
    void Grow() {
      std::vector<Entry> old(slots_.size() * 2);
      old.swap(slots_);
      for (const Entry& e : old) {
        if (e.key.size == 0) continue;
        std::size_t i = Slot(e.key);
        while (slots_[i].key.size != 0) i = (i + 1) & (slots_.size() - 1);
        slots_[i] = e;
      }
    }
    std::vector<Entry> slots_;  // a power of two, at most half full
    std::size_t size_ = 0;
  };
  bool events_user_set_;
  std::uint64_t max_events_;
  std::uint64_t events_ = 0;   // segments, blocks and trace entries counted so far
  std::vector<bool> reached_;  // by ObjectId: a structural object already decoded
  std::vector<std::int32_t> interned_of_object_;  // by ObjectId; kUnseen until interned
  RunTable stack_by_run_;
  // Streaming: stacks taken while the pickle is read, by content (InternStack); open
  // addressing, at most half full.
  struct StackSlot {
    std::uint64_t hash = 0;   // of the frame dicts' object ids
    std::int32_t stack = -1;  // -1 = empty
  };
  std::vector<StackSlot> stack_by_content_;
  std::size_t stacks_by_content_used_ = 0;
  static constexpr std::size_t kMaxStackProbes = 64;
  const std::uint64_t stack_hash_seed_ = ProcessKeyedHash("stacks");
  std::vector<bool> own_stack_;  // by stack (false past its end): one list's, grown in place
  std::vector<std::uint32_t> frames_scratch_, ids_scratch_;
  bool took_frames_ = false;
  KeyedStringMap<std::int32_t> frame_by_content_;  // by the ids of name and file, and the line
  KeyedStringMap<std::int32_t> text_by_content_;
  std::vector<const std::string*> texts_;  // the keys of text_by_content_ (nodes do not move)
  MemoryMeter meter_;
  Status memory_status_ = Status::Ok();
  // Per device list of device_traces, the keys of its first kGenerationEntries entries.
  std::vector<std::vector<std::uint8_t>> first_keys_;
  std::size_t annotations_placed_ = 0;  // trace_annotations whose device is set
  // Streaming.
  std::vector<Stream> streams_;
  std::unordered_map<ObjectId, std::size_t> stream_of_list_;
  std::vector<Pending> pending_;  // sorted by id; [0, pending_head_) all done
  std::size_t pending_head_ = 0;
  std::uint64_t history_bytes_ = 0;  // what the streams' histories hold
  Stream* warn_into_ = nullptr;      // while a taken list's items are decoded
};

}  // namespace

Result<Snapshot> DecodeSnapshot(const Document& doc, const SnapshotDecodeOptions& options) {
  Snapshot snapshot;
  Decoder decoder(doc, options, &snapshot);
  FRAGSCOPE_RETURN_IF_ERROR(decoder.Run());
  return snapshot;
}

namespace {

// The streaming decode around a reader: `read(sink)` reads the input into a Document, giving
// the pickle's lists to `sink`; `input_bytes` is the input's size as the budgets take it.
template <typename ReadFn>
Result<Snapshot> StreamSnapshot(std::uint64_t input_bytes, const PickleLimits& limits,
                                const SnapshotDecodeOptions& options, std::string_view name,
                                const ReadFn& read) {
  SnapshotDecodeOptions decode = options;
  if (decode.max_memory_bytes == 0) decode.max_memory_bytes = limits.max_memory_bytes;
  Snapshot snapshot;
  Decoder decoder(decode, input_bytes, &snapshot);
  {
    Result<Document> doc = read(&decoder);
    if (!doc.ok()) return doc.status();
    if (Status status = decoder.Run(*doc); !status.ok()) {
      return name.empty() ? status : status.WithPrefix(name);
    }
  }  // the Document (segments and blocks) goes before the history is walked
  return snapshot;
}

}  // namespace

Result<Snapshot> ReadSnapshotFile(const std::string& path, const PickleLimits& limits,
                                  const ProgressFn& progress, const SnapshotDecodeOptions& options,
                                  DocumentFormat* format) {
  // The size the budgets take, as the pickle reader's (0 for a pipe: not known).
  std::error_code error;
  const std::uintmax_t size = std::filesystem::file_size(path, error);
  const auto read = [&](PickleListSink* sink) {
    return ReadDocumentFile(path, format, limits, progress, sink);
  };
  return StreamSnapshot(error ? 0 : static_cast<std::uint64_t>(size), limits, options, path, read);
}

Result<Snapshot> ReadSnapshotBytes(std::string_view bytes, const PickleLimits& limits,
                                   const SnapshotDecodeOptions& options) {
  if (DetectDocumentFormat(bytes) == DocumentFormat::kJson) {
    Result<Document> doc = ReadJsonDocumentBytes(bytes, limits);
    if (!doc.ok()) return doc.status();
    SnapshotDecodeOptions decode = options;
    if (decode.max_memory_bytes == 0) decode.max_memory_bytes = limits.max_memory_bytes;
    return DecodeSnapshot(*doc, decode);
  }
  const auto read = [&](PickleListSink* sink) { return ReadPickleBytes(bytes, limits, sink); };
  return StreamSnapshot(bytes.size(), limits, options, "", read);
}

CallSite SnapshotCallSite(const Snapshot& snapshot, std::int32_t stack) {
  if (stack < 0 || static_cast<std::size_t>(stack) >= snapshot.stacks.size()) return {};
  const auto& indexes = snapshot.stacks[static_cast<std::size_t>(stack)];
  std::vector<FrameText> frames;
  frames.reserve(indexes.size());
  for (const std::uint32_t f : indexes) {
    frames.push_back({snapshot.frames[f].name, snapshot.frames[f].filename});
  }
  CallSite site = ChooseCallSite(frames);
  if (site.frame >= 0) site.frame = static_cast<std::int32_t>(indexes[site.frame]);
  return site;
}

}  // namespace fragscope::sources
