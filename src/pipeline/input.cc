#include "pipeline/input.h"

#include <algorithm>
#include <array>
#include <set>
#include <thread>
#include <unordered_set>

#include <fmt/format.h>

#include "analysis/analyzer_thread.h"
#include "analysis/bfc_explain.h"
#include "analysis/diagnosis.h"
#include "common/units.h"
#include "pipeline/progress.h"
#include "sources/snapshot/snapshot_requests.h"

namespace fragscope::pipeline {

namespace {

// What a snapshot adds to the report's notes: its layout, history and what was tolerated.
void AddSnapshotNotes(const sources::SnapshotReader& reader,
                      const std::vector<std::string>& consume_notes,
                      analysis::AnalysisResult* result) {
  const sources::Snapshot& s = reader.snapshot();
  std::vector<std::string> notes;
  std::uint64_t rebuilding = 0;  // events that rebuild the start state
  for (const DeviceInfo& d : reader.header().devices) {
    rebuilding += reader.start_events(d.device).size();
  }
  std::string history;
  if (reader.devices_with_history().empty()) {
    history = fmt::format(
        "no recorded history: every figure is the final state's (the {} events that rebuild it "
        "are not part of the run)",
        FormatCount(rebuilding));
  } else {
    history = fmt::format(
        "{} history {} recorded; the state before {} was rebuilt from the segments ({} events, "
        "not part of the run): it counts once, as the history's starting point, in the peaks; "
        "the worst moments, the timeline and the event counts are the recorded history's and "
        "the final state's (docs/snapshots.md, \"Recorded and rebuilt figures\")",
        FormatCount(s.trace_entries), s.trace_entries == 1 ? "entry" : "entries",
        s.trace_entries == 1 ? "it" : "them", FormatCount(rebuilding));
  }
  notes.push_back(fmt::format("memory snapshot ({}, {}): {} segments, {} blocks; {}",
                              reader.container(), s.generation, FormatCount(s.segments.size()),
                              FormatCount(s.blocks.size()), history));
  if (!reader.steps().source.empty()) notes.push_back("steps: " + reader.steps().source);
  for (const std::string& n : reader.steps().notes) notes.push_back("steps: " + n);
  for (const std::string& w : reader.warnings()) notes.push_back("snapshot: " + w);
  notes.insert(notes.end(), consume_notes.begin(), consume_notes.end());
  result->notes.insert(result->notes.begin(), notes.begin(), notes.end());
}

// What a BFC dump adds to the report's notes: where it came from, the request against the
// largest free chunk, and the free chunks per bin (docs/frameworks.md).
void AddBfcNotes(const sources::BfcTraceReader& reader, analysis::AnalysisResult* result) {
  const BfcReport& r = reader.report();
  const analysis::BfcExplanation e = analysis::ExplainBfc(r, reader.scan().context);
  std::vector<std::string> notes;
  notes.push_back(fmt::format(
      "BFC allocator dump (lines {}-{}; {}): {} region{} read as segments, chunks in use as "
      "blocks (their requested sizes are not in the dump: internal waste reads 0); the pool is "
      "one, shown as \"large\"",
      r.line, r.last_line, e.wording, FormatCount(r.regions.size()),
      r.regions.size() == 1 ? "" : "s"));
  if (reader.scan().reports.size() > 1) {
    notes.push_back(
        fmt::format("the log holds {} allocator failures; this is the last with a "
                    "chunk map (`fragscope explain` lists them all)",
                    reader.scan().reports.size()));
  }
  if (e.figures) {
    notes.push_back(fmt::format("request {} against the largest free chunk {}: {}",
                                FormatBytes(e.figures->request),
                                FormatBytes(e.figures->largest_free), e.summary));
  }
  for (const std::string& n : e.notes) notes.push_back("bfc: " + n);
  for (const std::string& m : e.missing) notes.push_back("bfc: missing from the log: " + m);
  if (e.bins) {
    for (const analysis::BfcBinUse& b : *e.bins) {
      if (b.chunks == 0) continue;
      notes.push_back(fmt::format(
          "bin {} (chunks from {}): {} chunks, {} free ({}), largest free {}; fragmentation {}",
          b.bin, FormatBytes(std::uint64_t{256} << b.bin), FormatCount(b.chunks),
          FormatCount(b.free_chunks), FormatBytes(b.free_bytes), FormatBytes(b.largest_free),
          b.free_bytes > 0 ? fmt::format("{:.2f}", 1.0 - static_cast<double>(b.largest_free) /
                                                             static_cast<double>(b.free_bytes))
                           : std::string("-")));
    }
  }
  result->notes.insert(result->notes.begin(), notes.begin(), notes.end());
}

}  // namespace

std::string RebuiltPeaksNote() {
  return "the requests that rebuild the start state are not part of the run: peaks (memory_stats "
         "too) count from the state they leave, as in `analyze` of the snapshot";
}

Result<OpenedInput> OpenInput(const std::string& path, const TraceLimits& limits) {
  Result<sources::InputKind> kind = sources::DetectInputKind(path);
  OpenedInput opened;
  if (!kind.ok()) {
    // Text: a TensorFlow / JAX log whose BFC dump can be read as an allocator trace?
    if (kind.status().message().find("this file is text") == std::string::npos) {
      return kind.status();
    }
    Result<sources::BfcLogScan> scan = sources::ReadBfcLog(path);
    if (!scan.ok()) return scan.status();
    const auto has_map = [](const BfcReport& r) { return !r.regions.empty(); };
    if (std::none_of(scan->reports.begin(), scan->reports.end(), has_map)) return kind.status();
    Result<std::unique_ptr<sources::BfcTraceReader>> bfc =
        sources::BfcTraceReader::Create(std::move(*scan), path);
    if (!bfc.ok()) return bfc.status();
    opened.bfc = bfc->get();
    opened.reader = std::move(*bfc);
    return opened;
  }
  if (*kind == sources::InputKind::kTrace) {
    Result<std::unique_ptr<TraceReader>> reader = TraceReader::Open(path, limits);
    if (!reader.ok()) return reader.status();
    opened.reader = std::move(*reader);
    return opened;
  }
  ProgressLine progress;
  sources::SnapshotReadOptions options;
  options.progress = [&](std::uint64_t done, std::uint64_t total) {
    progress.UpdateBytes(done, total, "reading the snapshot");
  };
  Result<std::unique_ptr<sources::SnapshotReader>> snapshot =
      sources::SnapshotReader::Open(path, options);
  progress.Clear();
  if (!snapshot.ok()) return snapshot.status();
  opened.snapshot = snapshot->get();
  opened.reader = std::move(*snapshot);
  return opened;
}

Result<std::uint64_t> ReadSnapshotEvents(sources::SnapshotReader& reader,
                                         const std::function<Status(const Event&)>& consume,
                                         std::vector<std::string>* notes) {
  constexpr std::size_t kMaxNotes = 20;
  std::uint64_t events = 0, skipped = 0;
  ProgressLine progress;
  Event e;
  while (true) {
    Result<bool> next = reader.Next(&e);
    if (!next.ok()) {
      progress.Clear();
      return next.status().WithPrefix(reader.Where());
    }
    if (!*next) break;
    ++events;
    if (Status st = consume(e); !st.ok()) {
      if (st.code() == StatusCode::kLimitExceeded) {  // a budget: no later event is wanted
        progress.Clear();
        return st.WithPrefix(reader.Where());
      }
      if (++skipped <= kMaxNotes) {
        notes->push_back(fmt::format("{}: {}; event skipped", reader.Where(), st.message()));
      }
    }
    if ((events & 0xfff) == 0) progress.Update(reader, events);
  }
  progress.Clear();
  if (skipped > kMaxNotes) {
    notes->push_back(fmt::format("... {} events skipped in all", FormatCount(skipped)));
  }
  return events;
}

Result<std::uint64_t> AnalyzeSnapshotEvents(sources::SnapshotReader& reader,
                                            analysis::TraceAnalyzer& analyzer,
                                            std::vector<std::string>* notes) {
  return ReadSnapshotEvents(
      reader,
      [&](const Event& e) {
        return reader.last_was_start() ? analyzer.ConsumeStartState(e) : analyzer.Consume(e);
      },
      notes);
}

Status LearnCapacitiesFromOoms(sources::SnapshotReader& reader, TraceHeader* header,
                               std::vector<std::string>* notes) {
  bool needed = false;
  const auto& traces = reader.snapshot().device_traces;
  for (std::size_t device = 0; device < traces.size() && !needed; ++device) {
    const DeviceInfo* info = header->FindDevice(static_cast<std::int32_t>(device));
    if (info != nullptr && info->capacity_bytes) continue;
    for (const auto& entry : traces[device]) {
      if (entry.action == Action::kOom) {
        needed = true;
        break;
      }
    }
  }
  if (!needed) return Status::Ok();
  analysis::AnalysisOptions options;
  options.keep_layout = false;
  Result<std::unique_ptr<analysis::TraceAnalyzer>> analyzer =
      analysis::TraceAnalyzer::Create(*header, options);
  if (!analyzer.ok()) return analyzer.status();
  std::vector<std::string> skipped;  // the analysis proper reports them
  Result<std::uint64_t> read = AnalyzeSnapshotEvents(reader, **analyzer, &skipped);
  reader.Rewind();
  if (!read.ok()) return read.status();
  const analysis::AnalysisResult first = (*analyzer)->Finish(reader.Where());
  for (const analysis::DeviceReport& d : first.devices) {
    if (d.oom_diagnoses.empty() || !d.oom_diagnoses.front().device_free) continue;
    DeviceInfo* info = nullptr;
    for (DeviceInfo& x : header->devices) {
      if (x.device == d.device) info = &x;
    }
    if (info == nullptr) {
      header->devices.push_back(DeviceInfo{d.device, d.name, std::nullopt, std::nullopt});
      info = &header->devices.back();
    }
    if (info->capacity_bytes) continue;
    const analysis::OomDiagnosis& o = d.oom_diagnoses.front();
    info->capacity_bytes = o.reserved + *o.device_free;
    notes->push_back(fmt::format(
        "device {}: capacity {} taken from its first recorded OOM (reserved + the driver's "
        "free bytes then)",
        d.device, FormatBytes(*info->capacity_bytes)));
  }
  return Status::Ok();
}

namespace {

// What "file:line" messages start with: reader.Where() without its ":line" (after a Next).
std::string TraceName(const TraceReader& reader) {
  const std::string where = reader.Where();
  const std::string suffix = ":" + std::to_string(reader.line_number());
  return where.size() >= suffix.size() &&
                 where.compare(where.size() - suffix.size(), suffix.size(), suffix) == 0
             ? where.substr(0, where.size() - suffix.size())
             : where;
}

}  // namespace

Result<std::uint64_t> AnalyzeAllEvents(TraceReader& reader, analysis::TraceAnalyzer& analyzer,
                                       unsigned threads) {
  if (AnalysisThreads(threads) < 2) {
    return ReadAllEvents(
        reader, [&](const Event& e) { return analyzer.Consume(e); }, nullptr,
        [&](const Event& e) { analyzer.Prefetch(e); });
  }
  // The name is set before the first event is sent, and so seen by the analyzing thread.
  std::string name;
  analysis::AnalyzerThread thread(analyzer, [&](const Event& e, std::uint64_t line) {
    Status s = analyzer.Consume(e);
    if (s.ok()) return s;
    return Status(s.code(), fmt::format("{}:{}: {}", name, line, s.message()));
  });
  ProgressLine progress;
  std::uint64_t events = 0;
  Event e;
  while (!thread.failed()) {
    Result<bool> next = reader.Next(&e);
    if (!next.ok()) {
      // An analysis error is on an earlier line than the reader's: it comes first.
      Status analyzed = thread.Finish();
      progress.Clear();
      return analyzed.ok() ? next.status() : analyzed;
    }
    if (!*next) break;
    if (name.empty()) name = TraceName(reader);
    thread.Send(e, std::nullopt, reader.line_number());
    if ((++events & 0xfff) == 0) progress.Update(reader, events);
  }
  Status analyzed = thread.Finish();
  progress.Clear();
  if (!analyzed.ok()) return analyzed;
  return events;
}

unsigned AnalysisThreads(unsigned requested) {
  if (requested == 0) return std::thread::hardware_concurrency() >= 2 ? 2 : 1;
  return std::min(requested, 2u);
}

Result<std::uint64_t> ReadAllEvents(TraceReader& reader,
                                    const std::function<Status(const Event&)>& consume,
                                    Status* status_out,
                                    const std::function<void(const Event&)>& prefetch) {
  // Events are read kAhead ahead of consumption so that `prefetch` can warm the caches for
  // them; each keeps its line number so that messages still name the right line.
  constexpr std::size_t kAhead = 8;
  std::array<Event, kAhead> ring;
  std::array<std::uint64_t, kAhead> lines{};
  std::size_t head = 0, count = 0;
  bool eof = false;
  Status read_error;
  std::string name;  // Where() is "name:line"
  ProgressLine progress;
  std::uint64_t events = 0;
  while (true) {
    while (!eof && read_error.ok() && count < kAhead) {
      const std::size_t slot = (head + count) % kAhead;
      Result<bool> next = reader.Next(&ring[slot]);
      if (!next.ok()) {
        read_error = next.status();
        break;
      }
      if (!*next) {
        eof = true;
        break;
      }
      lines[slot] = reader.line_number();
      if (name.empty()) name = TraceName(reader);
      if (prefetch) prefetch(ring[slot]);
      ++count;
    }
    if (count == 0) break;
    if (Status s = consume(ring[head]); !s.ok()) {
      progress.Clear();
      if (status_out != nullptr) *status_out = s;
      return Status(s.code(), fmt::format("{}:{}: {}", name, lines[head], s.message()));
    }
    head = (head + 1) % kAhead;
    --count;
    if ((++events & 0xfff) == 0) progress.Update(reader, events);
  }
  progress.Clear();
  if (!read_error.ok()) return read_error;
  return events;
}

Result<RequestEvents> ReadRequestEvents(OpenedInput& input, const std::string& path,
                                        const model::AllocatorRules& rules,
                                        std::vector<std::string>* notes,
                                        std::vector<std::int32_t> drop_ooms) {
  RequestEvents out;
  std::vector<Event>& events = out.events;
  if (input.snapshot != nullptr) {
    sources::SnapshotReader& snapshot = *input.snapshot;
    // The replayer's rules on request ids (RequestReplayer::Consume), applied while reading:
    // an entry of the snapshot that breaks them is skipped with a note, as `replay` skips it,
    // rather than failing every replay of the list.
    std::map<std::int32_t, std::unordered_set<std::uint64_t>> live;
    sources::SnapshotRequests requests(snapshot, rules, [&](const Event& e) -> Status {
      std::unordered_set<std::uint64_t>& ids = live[e.device];
      switch (e.action) {
        case Action::kAlloc:
          if (!ids.insert(e.addr).second) {
            return Status::Corruption(fmt::format(
                "alloc of id {} which is still live (ids must be unique among live allocations)",
                e.addr));
          }
          break;
        case Action::kFreeRequested:
          if (ids.erase(e.addr) == 0) {
            return Status::Corruption(fmt::format(
                "free_requested of id {} which is not live (never allocated, or freed twice)",
                e.addr));
          }
          break;
        case Action::kFreeCompleted:
          ids.erase(e.addr);  // a lone free_completed after free_requested is fine
          break;
        case Action::kRecordStream:
          if (ids.count(e.addr) == 0) {
            return Status::Corruption(
                fmt::format("record_stream of id {} which is not live", e.addr));
          }
          break;
        default:
          break;
      }
      events.push_back(e);
      return Status::Ok();
    });
    requests.DropOoms(std::move(drop_ooms));
    std::set<std::int32_t> rebuilt;  // devices whose start state was rebuilt
    out.recorded_device_allocs = 0;
    Result<std::uint64_t> read = ReadSnapshotEvents(
        snapshot,
        [&](const Event& e) {
          if (snapshot.last_was_start()) {
            rebuilt.insert(e.device);
          } else if (e.action != Action::kStep) {  // a step belongs to no device's history
            out.recorded_from.try_emplace(e.device, events.size());
            if (e.action == Action::kSegmentAlloc || e.action == Action::kSegmentMap) {
              ++*out.recorded_device_allocs;
            }
          }
          return requests.Consume(e);
        },
        notes);
    if (!read.ok()) return read.status();
    for (const std::int32_t device : rebuilt) out.recorded_from.try_emplace(device, events.size());
    requests.AddNotes(notes);
    if (!rebuilt.empty()) notes->push_back(RebuiltPeaksNote());
    return out;
  }
  TraceReader& reader = *input.reader;
  if (reader.header().kind == TraceKind::kAllocator) {
    return Status::InvalidArgument(fmt::format(
        "{}: this is an allocator trace; a replay takes a request trace (`fragscope convert {} "
        "-o requests.jsonl --to requests` makes one) or a snapshot",
        path, path));
  }
  Result<std::uint64_t> read = ReadAllEvents(reader, [&](const Event& e) -> Status {
    if (e.action == Action::kSegmentAlloc || e.action == Action::kSegmentFree ||
        e.action == Action::kSegmentMap || e.action == Action::kSegmentUnmap) {
      return Status::Corruption(fmt::format("{} in a request trace", ActionName(e.action)));
    }
    events.push_back(e);
    return Status::Ok();
  });
  if (!read.ok()) return read.status();
  return out;
}

Result<analysis::AnalysisResult> AnalyzeInput(
    const std::string& path, const analysis::AnalysisOptions& options, const TraceLimits& limits,
    unsigned threads, const std::function<Status(const TraceHeader&, const Event&, bool)>& tap,
    std::vector<Frame>* call_sites, std::vector<std::vector<std::uint32_t>>* stacks) {
  Result<OpenedInput> opened = OpenInput(path, limits);
  if (!opened.ok()) return opened.status();
  TraceReader& reader = *opened->reader;
  TraceHeader header = reader.header();
  std::vector<std::string> capacity_notes;
  if (opened->snapshot != nullptr) {
    Status learnt = LearnCapacitiesFromOoms(*opened->snapshot, &header, &capacity_notes);
    if (!learnt.ok()) return learnt;
  }

  // A BFC dump records one request, the one that failed: free chunks smaller than it are the
  // stranded ones (unless --stranded-threshold says otherwise).
  analysis::AnalysisOptions bfc_options = options;
  if (opened->bfc != nullptr && !options.stranded_threshold) {
    const BfcReport& r = opened->bfc->report();
    if (r.rounded || r.request) {
      bfc_options.stranded_threshold = r.rounded ? *r.rounded : BfcRoundedBytes(*r.request);
    }
  }
  Result<std::unique_ptr<analysis::TraceAnalyzer>> created =
      analysis::TraceAnalyzer::Create(header, bfc_options);
  if (!created.ok())
    return Status(created.status().code(),
                  fmt::format("{}: {}", reader.Where(), created.status().message()));
  analysis::TraceAnalyzer& analyzer = **created;

  std::vector<std::string> notes;
  Result<std::uint64_t> read = Status::Ok();
  if (opened->snapshot != nullptr) {
    sources::SnapshotReader& snapshot = *opened->snapshot;
    read = ReadSnapshotEvents(
        snapshot,
        [&](const Event& e) {
          const bool start = snapshot.last_was_start();
          Status s = start ? analyzer.ConsumeStartState(e) : analyzer.Consume(e);
          if (s.ok() && tap) s = tap(reader.header(), e, start);
          return s;
        },
        &notes);
  } else if (tap) {
    read = ReadAllEvents(reader, [&](const Event& e) {
      Status s = analyzer.Consume(e);
      if (s.ok()) s = tap(reader.header(), e, false);
      return s;
    });
  } else {
    read = AnalyzeAllEvents(reader, analyzer, threads);
  }
  if (!read.ok()) return read.status();

  analysis::AnalysisResult result = analyzer.Finish(path);
  if (opened->snapshot != nullptr) AddSnapshotNotes(*opened->snapshot, notes, &result);
  if (opened->bfc != nullptr) AddBfcNotes(*opened->bfc, &result);
  result.notes.insert(result.notes.end(), capacity_notes.begin(), capacity_notes.end());
  for (analysis::DeviceReport& d : result.devices) {
    for (analysis::SiteStranding& s : d.stranding_sites) analysis::NameSite(reader.frames(), &s);
  }
  if (call_sites != nullptr) *call_sites = reader.frames();
  if (stacks != nullptr) {
    stacks->clear();
    if (opened->snapshot != nullptr) *stacks = opened->snapshot->snapshot().stacks;
  }
  return result;
}

}  // namespace fragscope::pipeline
