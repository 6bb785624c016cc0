#include "sources/snapshot/snapshot_reader.h"

#include <algorithm>
#include <cstdlib>
#include <iterator>
#include <map>
#include <string_view>
#include <unordered_map>
#include <utility>

#include <fmt/format.h>

#include "common/units.h"
#include "model/alloc_conf.h"
#include "model/allocator_rules.h"
#include "sources/document/json_document.h"
#include "sources/trace/input_stream.h"

namespace fragscope::sources {
namespace {

constexpr std::uint64_t kSmallSegment = std::uint64_t{2} << 20;

struct SegState {
  std::uint64_t size = 0;
  std::uint64_t stream = 0;
  Pool pool = Pool::kUnknown;
  bool expandable = false;
};

struct LiveState {
  std::uint64_t requested = 0;
  std::uint64_t block_size = 0;  // 0 = unknown
  std::uint64_t stream = 0;
  std::int32_t stack = -1;
  bool pending = false;  // free_requested seen, free_completed not yet
};

// The size of a block live at the start of the history whose size nothing recorded: its
// rounded request, plus the free space after it when the allocator could not have split that
// off. In a cudaMalloc'd large-pool segment every free block is larger than 1 MiB (a split
// leaves more than that, a carve takes a free block's front, a free merges), so a smaller gap
// behind a live block is that block's unsplit remainder (spec §4.8), as PyTorch counts it.
std::uint64_t StartBlockSize(const model::AllocatorRules& rules,
                             const std::map<std::uint64_t, SegState>& segs, std::uint64_t addr,
                             std::uint64_t rounded, std::uint64_t next_block) {
  auto seg = segs.upper_bound(addr);
  if (seg == segs.begin()) return rounded;
  --seg;
  const SegState& s = seg->second;
  const std::uint64_t end = seg->first + s.size;
  if (s.expandable || addr >= end || rounded > end - addr) return rounded;
  const Pool pool = s.pool != Pool::kUnknown  ? s.pool
                    : s.size == kSmallSegment ? Pool::kSmall
                                              : Pool::kLarge;
  if (pool != Pool::kLarge || rounded >= rules.max_split_size) return rounded;
  const std::uint64_t upto = std::min(end, std::max(next_block, addr + rounded));
  const std::uint64_t whole = upto - addr;
  return rules.ShouldSplit(pool, whole, rounded) ? rounded : whole;
}

}  // namespace

Result<InputKind> DetectInputKind(const std::string& path) {
  Result<std::unique_ptr<ByteSource>> source = OpenFileSource(path);
  if (!source.ok()) return source.status();
  Result<std::unique_ptr<InputStream>> input = InputStream::Open(std::move(*source));
  if (!input.ok()) return input.status().WithPrefix(path);
  std::string head(4096, '\0');
  std::size_t got = 0;
  while (got < head.size()) {
    Result<std::size_t> n = (*input)->Read(head.data() + got, head.size() - got);
    if (!n.ok()) return n.status().WithPrefix(path);
    if (*n == 0) break;
    got += *n;
  }
  head.resize(got);
  if (const std::string other = DescribeOtherInput(head, path); !other.empty()) {
    return Status::InvalidArgument(fmt::format(
        "{}: expected a fragscope trace (JSON Lines, docs/formats.md) or a PyTorch memory "
        "snapshot (torch.cuda.memory._dump_snapshot); this file is {}",
        path, other));
  }
  if (DetectDocumentFormat(head) == DocumentFormat::kPickle) return InputKind::kSnapshot;
  // A fragscope trace names its format on the first line; a JSON snapshot does not.
  const std::string_view first_line = std::string_view(head).substr(0, head.find('\n'));
  if (first_line.find("fragscope-trace") != std::string_view::npos) return InputKind::kTrace;
  if (first_line.find("\"format\"") != std::string_view::npos) return InputKind::kTrace;
  const std::size_t start = head.find_first_not_of(" \t\r\n");
  if (start != std::string::npos && head[start] == '[') return InputKind::kSnapshot;
  if (head.find("\"segments\"") != std::string::npos ||
      head.find("\"device_traces\"") != std::string::npos) {
    return InputKind::kSnapshot;
  }
  return InputKind::kTrace;  // the trace reader will say what is wrong with it
}

std::string DescribeOtherInput(std::string_view head, std::string_view path) {
  if (head.empty()) return "empty";
  const auto byte = [&](std::size_t i) { return static_cast<unsigned char>(head[i]); };
  if (head.starts_with(std::string_view("PK\x03\x04", 4))) {
    return "a ZIP archive, as torch.save writes (a model's weights or tensors), not a memory "
           "snapshot: write one with torch.cuda.memory._dump_snapshot(\"snapshot.pickle\") "
           "after torch.cuda.memory._record_memory_history()";
  }
  if (byte(0) == 0x80) return "";  // a pickle (protocol 2 or later)
  const std::size_t start = head.find_first_not_of(" \t\r\n");
  if (start == std::string_view::npos) return "only whitespace";
  // JSON (a trace or a JSON snapshot), and the first bytes of a protocol-0/1 pickle of a dict or
  // a list, are for the readers to judge.
  if (std::string_view("{[(]}").find(head[start]) != std::string_view::npos) return "";
  // Text: printable bytes (UTF-8 included) and whitespace; a log may hold a few others (terminal
  // escapes, a stray byte), so up to 1 in 20 is allowed.
  std::size_t other = 0;
  for (std::size_t i = 0; i < head.size(); ++i) {
    const unsigned char c = byte(i);
    other += c < 0x20 && c != '\n' && c != '\r' && c != '\t' && c != '\f' && c != 0x1b;
  }
  const bool text = other * 20 <= head.size();
  if (!text) {
    std::string shown;
    for (std::size_t i = 0; i < head.size() && i < 8; ++i) shown += fmt::format(" {:02x}", byte(i));
    return fmt::format("binary data that is neither a pickle nor JSON (first bytes:{})", shown);
  }
  auto shorten = [](std::string_view line) {
    std::string out(line.substr(0, 80));
    if (line.size() > 80) out += "...";
    return out;
  };
  std::size_t line_start = 0;
  for (std::size_t number = 1; line_start < head.size(); ++number) {
    std::size_t end = head.find('\n', line_start);
    if (end == std::string_view::npos) end = head.size();
    const std::string_view line = head.substr(line_start, end - line_start);
    if (line.find("out of memory") != std::string_view::npos ||
        line.find("Tried to allocate") != std::string_view::npos) {
      return fmt::format(
          "text with an out-of-memory message (line {}: \"{}\"): `fragscope explain {}` "
          "explains it, and replays the job with --snapshot or --trace",
          number, shorten(line), path);
    }
    line_start = end + 1;
  }
  const std::string_view first = head.substr(0, head.find('\n'));
  return fmt::format(
      "text (first line: \"{}\"); if it is a job's log, `fragscope explain {}` finds the "
      "out-of-memory messages in it",
      shorten(first), path);
}

SnapshotReader::~SnapshotReader() = default;

Result<std::unique_ptr<SnapshotReader>> SnapshotReader::Open(const std::string& path,
                                                             const SnapshotReadOptions& options) {
  DocumentFormat format = DocumentFormat::kPickle;
  Result<Snapshot> snapshot =
      ReadSnapshotFile(path, options.limits, options.progress, options.decode, &format);
  if (!snapshot.ok()) return snapshot.status();
  std::unique_ptr<SnapshotReader> reader = FromSnapshot(std::move(*snapshot), path);
  reader->container_ = format == DocumentFormat::kJson ? "JSON" : "pickle";
  if (Result<std::unique_ptr<ByteSource>> src = OpenFileSource(path); src.ok()) {
    reader->input_bytes_ = (*src)->size_bytes();
  }
  return reader;
}

std::unique_ptr<SnapshotReader> SnapshotReader::FromSnapshot(Snapshot snapshot, std::string name) {
  std::unique_ptr<SnapshotReader> reader(new SnapshotReader());
  reader->name_ = std::move(name);
  reader->snapshot_ = std::move(snapshot);
  reader->Prepare();
  return reader;
}

void SnapshotReader::Prepare() {
  Snapshot& s = snapshot_;
  warnings_ = s.warnings;
  header_.kind = TraceKind::kAllocator;
  header_.producer = fmt::format("PyTorch memory snapshot ({}{})", s.generation,
                                 s.layout == SnapshotLayout::kSegmentList ? ", segment list" : "");
  // The header carries the recorded settings as PYTORCH_CUDA_ALLOC_CONF pairs, as any trace.
  recorded_conf_ = ComputeConf();
  // (Each item passed ParseAllocatorConfig alone; together they parse too.)
  if (Result<model::AllocatorConfig> recorded = model::ParseAllocatorConfig(recorded_conf_);
      recorded.ok()) {
    header_.allocator_settings = model::ToSettingPairs(*recorded);
  }

  // Call sites (sources/call_site.h): each frame is classified once, each stack chooses from
  // its frames' roles. A stack of C++ frames only is named by a label; each distinct label
  // becomes a frame of its own after the file's (no file, no line), so events name it by id
  // as any other site and `convert` writes it as a frame line.
  std::vector<FrameRole> role_of_frame;
  role_of_frame.reserve(s.frames.size());
  for (const SnapshotFrame& f : s.frames)
    role_of_frame.push_back(ClassifyFrame({f.name, f.filename}));
  std::vector<std::string> labels;
  std::unordered_map<std::string, std::int32_t> label_ids;
  std::vector<FrameText> texts;
  std::vector<FrameRole> roles;
  site_of_stack_.resize(s.stacks.size());
  for (std::size_t i = 0; i < s.stacks.size(); ++i) {
    texts.clear();
    roles.clear();
    for (const std::uint32_t f : s.stacks[i]) {
      texts.push_back({s.frames[f].name, s.frames[f].filename});
      roles.push_back(role_of_frame[f]);
    }
    CallSite site = ChooseCallSite(texts, roles);
    if (site.frame >= 0) {
      site_of_stack_[i] =
          static_cast<std::int32_t>(s.stacks[i][static_cast<std::size_t>(site.frame)]);
    } else if (!site.label.empty()) {
      const auto id = static_cast<std::int32_t>(s.frames.size() + labels.size());
      auto [it, inserted] = label_ids.try_emplace(site.label, id);
      if (inserted) labels.push_back(std::move(site.label));
      site_of_stack_[i] = it->second;
    } else {
      site_of_stack_[i] = -1;
    }
  }
  // The frames' strings move into frames(): the decoder charged one copy of each to the memory
  // budget, and a second would double what a file of many call sites takes (issue 30 item 4).
  frames_.reserve(s.frames.size() + labels.size());
  for (std::size_t i = 0; i < s.frames.size(); ++i) {
    Frame f;
    f.id = static_cast<std::int32_t>(i);
    f.name = std::move(s.frames[i].name);
    f.filename = std::move(s.frames[i].filename);
    f.line = s.frames[i].line;
    frames_.push_back(std::move(f));
  }
  for (std::string& label : labels) {
    Frame f;
    f.id = static_cast<std::int32_t>(frames_.size());
    f.name = std::move(label);
    frames_.push_back(std::move(f));
  }

  // Segments by device, so that building each device's history looks at its own segments
  // only: a scan of all segments per device was O(devices x segments) (issue 24 item 2).
  std::unordered_map<std::int32_t, std::vector<std::size_t>> segments_of;
  std::vector<std::int32_t> devices;
  for (std::size_t i = 0; i < s.segments.size(); ++i) {
    devices.push_back(s.segments[i].device);
    segments_of[s.segments[i].device].push_back(i);
  }
  for (std::size_t d = 0; d < s.device_traces.size(); ++d) {
    if (!s.device_traces[d].empty()) {
      devices.push_back(static_cast<std::int32_t>(d));
      with_history_.push_back(static_cast<std::int32_t>(d));
    }
  }
  std::sort(devices.begin(), devices.end());
  devices.erase(std::unique(devices.begin(), devices.end()), devices.end());
  for (const std::int32_t d : devices) {
    DeviceInfo info;
    info.device = d;
    header_.devices.push_back(info);
    const auto found = segments_of.find(d);
    BuildDevice(d, found != segments_of.end() ? found->second : std::vector<std::size_t>());
  }
  if (history_warnings_ > kMaxHistoryWarnings) {
    warnings_.push_back(
        fmt::format("... {} disagreements between the history and the segments "
                    "in all",
                    history_warnings_));
  }
  steps_ = DeriveSteps(s);
  for (DevicePlan& plan : plans_) {
    if (plan.device != steps_.device) continue;
    plan.marks = steps_.marks;
    if (!plan.marks.empty() && plan.marks.front().before == 0) {
      first_mark_ = plan.marks.front();
      plan.marks.erase(plan.marks.begin());
    }
  }
  first_mark_pending_ = first_mark_.has_value();
}

// Walks device `device`'s history backwards from the final segments to the state at its start.
void SnapshotReader::BuildDevice(std::int32_t device,
                                 const std::vector<std::size_t>& segment_indices) {
  Snapshot& s = snapshot_;
  DevicePlan plan;
  plan.device = device;
  const auto d = static_cast<std::size_t>(device);
  const TraceHistory* entries = d < s.device_traces.size() ? &s.device_traces[d] : nullptr;
  plan.entries = entries;
  auto warn = [&](const SnapshotTraceEntry& e, std::string_view what) {
    if (++history_warnings_ > kMaxHistoryWarnings) return;  // counted; Prepare() says how many
    warnings_.push_back(fmt::format("device_traces[{}][{}] ({} at {}): {}", device, e.entry,
                                    ActionName(e.action), FormatAddress(e.addr), what));
  };

  std::map<std::uint64_t, SegState> segs;
  std::unordered_map<std::uint64_t, LiveState> live;
  for (const std::size_t index : segment_indices) {
    const SnapshotSegment& seg = s.segments[index];
    segs[seg.addr] = SegState{seg.total_size, seg.stream, seg.pool, seg.expandable};
    for (std::uint32_t b = seg.first_block; b < seg.first_block + seg.num_blocks; ++b) {
      const SnapshotBlock& block = s.blocks[b];
      if (block.state == model::BlockState::kFree) continue;
      live[block.addr] = LiveState{block.requested, block.size, seg.stream, block.stack,
                                   block.state == model::BlockState::kPendingFree};
    }
  }

  // Backwards a chunk at a time (the history is kept compact: TraceHistory).
  std::vector<SnapshotTraceEntry> chunk;
  for (std::size_t c = entries != nullptr ? entries->num_chunks() : 0; c-- > 0;) {
    entries->DecodeChunk(c, &chunk);
    for (std::size_t i = chunk.size(); i-- > 0;) {
      const SnapshotTraceEntry& e = chunk[i];
      switch (e.action) {
        case Action::kAlloc: {
          auto found = live.find(e.addr);
          if (found == live.end()) {
            warn(e, "no block is live there afterwards (the history and the segments disagree)");
            break;
          }
          if (found->second.requested == e.size && found->second.block_size != 0) {
            plan.block_sizes.emplace_back(
                static_cast<std::uint32_t>(c * TraceHistory::kChunkEntries + i),
                found->second.block_size);
          }
          live.erase(found);
          break;
        }
        case Action::kFreeCompleted: {
          auto [found, inserted] = live.try_emplace(e.addr);
          if (!inserted) {
            warn(e, "a block is already live there afterwards; free_completed ignored");
            break;
          }
          found->second = LiveState{e.size, 0, e.stream, e.stack, true};
          break;
        }
        case Action::kFreeRequested: {
          auto found = live.find(e.addr);
          if (found != live.end() && found->second.pending) {
            found->second.pending = false;
          } else if (found == live.end()) {
            live[e.addr] = LiveState{e.size, 0, e.stream, e.stack, false};
          } else {
            warn(e, "a block is already live there afterwards; free_requested ignored");
          }
          break;
        }
        case Action::kSegmentAlloc: {
          auto found = segs.find(e.addr);
          if (found == segs.end()) {
            warn(e, "no segment starts there afterwards");
          } else {
            if (found->second.size != e.size) {
              warn(e, fmt::format("the segment there has {} bytes afterwards, not {}",
                                  found->second.size, e.size));
            }
            segs.erase(found);
          }
          break;
        }
        case Action::kSegmentFree: {
          auto next = segs.lower_bound(e.addr);
          const bool overlaps = (next != segs.end() && next->first < e.addr + e.size) ||
                                (next != segs.begin() &&
                                 std::prev(next)->first + std::prev(next)->second.size > e.addr);
          if (overlaps) {
            warn(e, "the freed range overlaps a segment that exists afterwards");
            break;
          }
          const Pool pool = e.size == kSmallSegment ? Pool::kSmall : Pool::kLarge;
          segs[e.addr] = SegState{e.size, e.stream, pool, false};
          break;
        }
        case Action::kSegmentMap: {
          // Before the map the range was not mapped: cut it out of the segment that holds it.
          auto it2 = segs.upper_bound(e.addr);
          if (it2 == segs.begin()) {
            warn(e, "no mapped range holds it afterwards");
            break;
          }
          --it2;
          const std::uint64_t start = it2->first;
          const SegState seg = it2->second;
          if (start + seg.size < e.addr + e.size) {
            warn(e, "no mapped range holds it afterwards");
            break;
          }
          segs.erase(it2);
          if (e.addr > start) {
            SegState left = seg;
            left.size = e.addr - start;
            segs[start] = left;
          }
          if (start + seg.size > e.addr + e.size) {
            SegState right = seg;
            right.size = start + seg.size - (e.addr + e.size);
            segs[e.addr + e.size] = right;
          }
          break;
        }
        case Action::kSegmentUnmap: {
          // Before the unmap the range was mapped: join it with touching ranges of its stream.
          std::uint64_t start = e.addr;
          std::uint64_t size = e.size;
          Pool pool = Pool::kUnknown;
          auto next = segs.lower_bound(e.addr);
          if (next != segs.end() && next->first < e.addr + e.size) {
            warn(e, "the range overlaps a segment that exists afterwards");
            break;
          }
          if (next != segs.begin()) {
            auto prev = std::prev(next);
            if (prev->first + prev->second.size > e.addr) {
              warn(e, "the range overlaps a segment that exists afterwards");
              break;
            }
            if (prev->first + prev->second.size == e.addr && prev->second.expandable &&
                prev->second.stream == e.stream) {
              start = prev->first;
              size += prev->second.size;
              pool = prev->second.pool;
              segs.erase(prev);
            }
          }
          next = segs.lower_bound(e.addr + e.size);
          if (next != segs.end() && next->first == e.addr + e.size && next->second.expandable &&
              next->second.stream == e.stream) {
            size += next->second.size;
            pool = next->second.pool;
            segs.erase(next);
          }
          segs[start] = SegState{size, e.stream, pool, true};
          break;
        }
        default:
          break;
      }
    }
  }
  std::reverse(plan.block_sizes.begin(), plan.block_sizes.end());

  // The start state as events: segments, then the blocks live in them.
  for (const auto& [addr, seg] : segs) {
    Event ev;
    ev.action = seg.expandable ? Action::kSegmentMap : Action::kSegmentAlloc;
    ev.device = device;
    ev.addr = addr;
    ev.size = seg.size;
    ev.stream = seg.stream;
    ev.pool = seg.pool;
    plan.start.push_back(std::move(ev));
  }
  plan.start_segments = segs.size();
  std::vector<std::pair<std::uint64_t, LiveState>> blocks(live.begin(), live.end());
  std::sort(blocks.begin(), blocks.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  Result<model::AllocatorRules> parsed =
      model::AllocatorRules::FromSettings(header_.allocator_settings);
  const model::AllocatorRules rules = parsed.ok() ? *parsed : model::AllocatorRules{};
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto& [addr, block] = blocks[i];
    Event ev;
    ev.action = Action::kBlock;
    ev.device = device;
    ev.addr = addr;
    ev.size = std::max<std::uint64_t>(block.requested, 1);
    ev.block_size = block.block_size != 0
                        ? block.block_size
                        : StartBlockSize(rules, segs, addr, rules.RoundSize(ev.size),
                                         i + 1 < blocks.size() ? blocks[i + 1].first : ~0ull);
    ev.stream = block.stream;
    ev.frame = block.stack >= 0 ? site_of_stack_[static_cast<std::size_t>(block.stack)] : -1;
    ev.stack = block.stack;
    plan.start.push_back(ev);
    if (block.pending) {
      ev.action = Action::kFreeRequested;
      ev.block_size = 0;
      plan.start.push_back(ev);
    }
  }
  plans_.push_back(std::move(plan));
}

void SnapshotReader::Rewind() {
  plan_ = 0;
  index_ = 0;
  block_size_ = 0;
  position_ = 0;
  in_start_ = true;
  first_mark_pending_ = first_mark_.has_value();
  mark_ = 0;
  last_plan_ = 0;
  last_index_ = 0;
  last_in_start_ = true;
  last_step_.reset();
}

Event SnapshotReader::StepEvent(const SnapshotStepMark& mark) const {
  Event ev;
  ev.action = Action::kStep;
  ev.device = steps_.device;
  ev.step = mark.step;
  return ev;
}

Result<bool> SnapshotReader::Next(Event* event) {
  if (first_mark_pending_) {
    first_mark_pending_ = false;
    for (std::size_t p = 0; p < plans_.size(); ++p) {
      if (plans_[p].device == steps_.device) last_plan_ = p;
    }
    last_in_start_ = false;
    last_index_ = 0;
    last_step_ = first_mark_->step;
    *event = StepEvent(*first_mark_);
    ++position_;
    return true;
  }
  last_step_.reset();
  while (plan_ < plans_.size()) {
    DevicePlan& plan = plans_[plan_];
    last_plan_ = plan_;
    if (in_start_) {
      if (index_ < plan.start.size()) {
        last_in_start_ = true;
        last_index_ = index_;
        *event = plan.start[index_++];
        ++position_;
        return true;
      }
      in_start_ = false;
      index_ = 0;
    }
    if (plan.entries != nullptr && index_ < plan.entries->size()) {
      if (mark_ < plan.marks.size() && plan.marks[mark_].before == index_) {
        last_in_start_ = false;
        last_index_ = index_;
        last_step_ = plan.marks[mark_].step;
        *event = StepEvent(plan.marks[mark_++]);
        ++position_;
        return true;
      }
      const SnapshotTraceEntry& e = EntryAt(plan_, index_);
      last_in_start_ = false;
      last_index_ = index_++;
      Event& ev = *event;
      ev = Event();
      ev.action = e.action;
      ev.device = plan.device;
      ev.addr = e.addr;
      ev.size = e.size;
      ev.stream = e.stream;
      ev.time_us = e.time_us;
      if (e.action == Action::kOom) ev.device_free = e.device_free;
      if (e.action == Action::kAlloc) {
        // The walk's block sizes, ascending by index: consumed in step with the entries.
        while (block_size_ < plan.block_sizes.size() &&
               plan.block_sizes[block_size_].first < last_index_) {
          ++block_size_;
        }
        if (block_size_ < plan.block_sizes.size() &&
            plan.block_sizes[block_size_].first == last_index_) {
          ev.block_size = plan.block_sizes[block_size_].second;
        }
      }
      if (e.action == Action::kSegmentAlloc || e.action == Action::kSegmentFree) {
        ev.pool = e.size == kSmallSegment ? Pool::kSmall : Pool::kLarge;
      }
      ev.frame = e.stack >= 0 ? site_of_stack_[static_cast<std::size_t>(e.stack)] : -1;
      ev.stack = e.stack;
      ++position_;
      return true;
    }
    ++plan_;
    in_start_ = true;
    index_ = 0;
    mark_ = 0;
    block_size_ = 0;
  }
  return false;
}

const SnapshotTraceEntry& SnapshotReader::EntryAt(std::size_t plan, std::size_t index) const {
  const std::size_t c = index / TraceHistory::kChunkEntries;
  if (chunk_plan_ != plan || chunk_index_ != c) {
    plans_[plan].entries->DecodeChunk(c, &chunk_);
    chunk_plan_ = plan;
    chunk_index_ = c;
  }
  return chunk_[index % TraceHistory::kChunkEntries];
}

std::span<const Event> SnapshotReader::start_events(std::int32_t device) const {
  for (const DevicePlan& plan : plans_) {
    if (plan.device == device) return plan.start;
  }
  return {};
}

bool SnapshotReader::CompleteHistory(std::int32_t device) const {
  for (const DevicePlan& plan : plans_) {
    if (plan.device == device) {
      return plan.entries != nullptr && !plan.entries->empty() && plan.start_segments == 0;
    }
  }
  return false;
}

std::vector<model::SnapshotSegment> SnapshotReader::FinalSegments(std::int32_t device) const {
  std::vector<model::SnapshotSegment> out;
  for (const SnapshotSegment& s : snapshot_.segments) {
    if (s.device != device) continue;
    model::SnapshotSegment seg;
    seg.device = device;
    seg.address = s.addr;
    seg.total_size = s.total_size;
    seg.stream = s.stream;
    seg.segment_type = s.pool == Pool::kSmall ? "small" : "large";
    seg.is_expandable = s.expandable;
    for (std::uint32_t i = s.first_block; i < s.first_block + s.num_blocks; ++i) {
      const SnapshotBlock& b = snapshot_.blocks[i];
      model::SnapshotBlock block;
      block.address = b.addr;
      block.size = b.size;
      block.requested_size = b.state == model::BlockState::kFree ? 0 : b.requested;
      block.state = b.state == model::BlockState::kFree        ? "inactive"
                    : b.state == model::BlockState::kAllocated ? "active_allocated"
                                                               : "active_pending_free";
      if (b.state == model::BlockState::kAllocated) {
        seg.allocated_size += b.size;
        seg.requested_size += b.requested;
      }
      if (b.state != model::BlockState::kFree) seg.active_size += b.size;
      seg.blocks.push_back(std::move(block));
    }
    out.push_back(std::move(seg));
  }
  return out;
}

std::string SnapshotReader::RecordedConf(std::vector<std::string>* notes) const {
  notes->insert(notes->end(), conf_notes_.begin(), conf_notes_.end());
  return recorded_conf_;
}

std::string SnapshotReader::ComputeConf() {
  std::string conf;
  std::vector<std::string>* notes = &conf_notes_;
  if (!snapshot_.has_allocator_settings) {
    for (const SnapshotSegment& s : snapshot_.segments) {
      if (s.expandable) {
        notes->push_back(
            "the snapshot records no allocator settings; it has expandable segments, so "
            "expandable_segments:True is assumed");
        return "expandable_segments:True";
      }
    }
    notes->push_back(
        "the snapshot records no allocator settings (PyTorch < 2.3): defaults assumed");
    return conf;
  }
  // Each option is read on its own (model::ParseAllocatorSettings, the parser of every header's
  // settings): one PyTorch would refuse is dropped with a warning; the others are kept.
  std::vector<std::pair<std::string, std::string>> kept;
  for (const auto& pair : snapshot_.allocator_settings) {
    if (Result<model::AllocatorConfig> c = model::ParseAllocatorSettings({pair}); !c.ok()) {
      warnings_.push_back(fmt::format("allocator_settings: {}:{} not understood ({}); ignored",
                                      pair.first, pair.second, c.status().message()));
      continue;
    }
    kept.push_back(pair);
  }
  if (Result<model::AllocatorConfig> c = model::ParseAllocatorSettings(kept); c.ok()) {
    conf = model::ToConfString(*c);
  }
  return conf;
}

std::string SnapshotReader::Where() const {
  if (last_plan_ >= plans_.size()) return name_;
  const DevicePlan& plan = plans_[last_plan_];
  if (last_in_start_) {
    return fmt::format("{}: start state of device {} (rebuilt from the segments)", name_,
                       plan.device);
  }
  const std::uint32_t entry = plan.entries != nullptr && last_index_ < plan.entries->size()
                                  ? EntryAt(last_plan_, last_index_).entry
                                  : static_cast<std::uint32_t>(last_index_);
  if (last_step_) {
    return fmt::format("{}: step {} (marked before device_traces[{}][{}])", name_, *last_step_,
                       plan.device, entry);
  }
  return fmt::format("{}: device_traces[{}][{}]", name_, plan.device, entry);
}

}  // namespace fragscope::sources
