#include "convert_command.h"

#include <cstdio>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/counter_track.h"
#include "cli_util.h"
#include "common/units.h"
#include "model/allocator_rules.h"
#include "model/request_extractor.h"
#include "sinks/export/perfetto.h"
#include "sources/budget.h"
#include "sources/document/document_json.h"
#include "sources/document/json_document.h"
#include "sources/snapshot/snapshot_requests.h"
#include "sources/trace/output_stream.h"

namespace fragscope::cli {
namespace {

struct ConvertFlags {
  std::string input;
  std::string output;
  std::string to;  // trace, requests, perfetto, json; empty = from OUT's name
};

constexpr std::string_view kConvertDescription =
    "Convert a snapshot or trace: to a fragscope trace, Perfetto JSON or plain JSON";

constexpr std::string_view kConvertFooter =
    R"(Formats (--to, or from OUT's name):
  trace      fragscope allocator trace, JSON Lines (OUT.jsonl, .jsonl.gz, .jsonl.zst): every
             allocator event, with a snapshot's start state as segment and `block` events;
             call sites as frame lines. Reads back with `fragscope analyze`.
  requests   fragscope request trace: only what the program asked for (allocs and frees), for
             `fragscope replay` and `tune` under other settings or capacities.
  perfetto   Chrome/Perfetto trace-event JSON (OUT.perfetto.json or OUT.trace.json): per GPU,
             counter tracks of reserved, allocated, largest free block and fragmentation
             ratio, and instants for OOMs and segment allocs/frees. Open it in
             https://ui.perfetto.dev or chrome://tracing.
  json       a snapshot as plain JSON (OUT.json), the same keys as the pickle, for scripts.

INPUT is a fragscope trace or a PyTorch memory snapshot (pickle or JSON; plain, .gz or .zst).
A snapshot is read safely: no code in it runs. The output is written to a new temporary file
next to OUT (.OUT.<random>.tmp) and renamed to OUT when complete, so an interrupted convert
(error, Ctrl-C, SIGTERM) leaves OUT as it was and no temporary; .gz and .zst names are
compressed. If OUT is a symbolic link to an existing file, that file is replaced (you named
it); a link to nothing is refused. INPUT may be - (standard input), a FIFO or <(...).

Examples:
  fragscope convert snapshot.pickle -o trace.jsonl.zst
  fragscope convert snapshot.pickle -o memory.perfetto.json
  fragscope convert snapshot.pickle -o requests.jsonl --to requests
  fragscope convert snapshot.pickle -o snapshot.json

Exit status: 0 written; 2 bad input or usage; 1 the output could not be written.)";

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string FormatFor(const std::string& out) {
  std::string_view name = out;
  for (std::string_view z : {".gz", ".zst"}) {
    if (EndsWith(name, z)) name.remove_suffix(z.size());
  }
  if (EndsWith(name, ".jsonl")) return "trace";
  if (EndsWith(name, ".perfetto.json") || EndsWith(name, ".trace.json")) return "perfetto";
  if (EndsWith(name, ".json")) return "json";
  return "";
}

// A compressed (by OUT's name) file, written through a SafeFile: a new temporary next to OUT,
// renamed onto OUT by Commit() (OUT may be a link the user named, common/safe_file.h).
class AtomicOutput {
 public:
  static Result<std::unique_ptr<AtomicOutput>> Create(const std::string& path) {
    Result<std::unique_ptr<sources::ByteSink>> sink =
        sources::CreateFileSink(path, OutputOrigin::kNamedByUser);
    if (!sink.ok()) return sink.status();
    Result<std::unique_ptr<sources::OutputStream>> stream =
        sources::OutputStream::Create(CompressionForPath(path), std::move(*sink));
    if (!stream.ok()) return stream.status();
    auto out = std::unique_ptr<AtomicOutput>(new AtomicOutput());
    out->stream_ = std::move(*stream);
    return out;
  }
  /// Caps the bytes Write takes (0: none): beyond it, kLimitExceeded naming the budget and
  /// --max-output, and Commit never runs, so OUT is not created.
  void SetBudget(std::uint64_t limit, bool user_set) {
    budget_ = limit;
    budget_user_set_ = user_set;
  }
  Status Write(std::string_view data) {
    written_ += data.size();
    if (budget_ != 0 && written_ > budget_) {
      return Status::LimitExceeded(sources::BudgetMessage(
          "the output outgrew its budget (an input that expands to far more events than its "
          "size suggests?)",
          "output", budget_, written_, budget_user_set_, "--max-output", /*bytes=*/true));
    }
    return stream_->Write(data);
  }
  // Finishing the stream closes the sink, which renames the temporary onto OUT.
  Status Commit() { return stream_->Finish(); }

 private:
  AtomicOutput() = default;
  std::unique_ptr<sources::OutputStream> stream_;
  std::uint64_t budget_ = 0;
  bool budget_user_set_ = false;
  std::uint64_t written_ = 0;
};

// Reads every event of the input (tolerant for snapshots: skipped events become notes).
Result<std::uint64_t> ForEachEvent(OpenedInput& in, const std::function<Status(const Event&)>& fn,
                                   std::vector<std::string>* notes) {
  if (in.snapshot != nullptr) return ReadSnapshotEvents(*in.snapshot, fn, notes);
  return ReadAllEvents(*in.reader, fn);
}

void PrintNotes(const OpenedInput& in, const std::vector<std::string>& notes) {
  if (in.snapshot != nullptr) {
    for (const std::string& w : in.snapshot->warnings()) {
      PrintSafe(stderr, fmt::format("fragscope: note: snapshot: {}\n", w));
    }
  }
  for (const std::string& n : notes) PrintSafe(stderr, fmt::format("fragscope: note: {}\n", n));
}

int ToTrace(const ConvertFlags& flags, OpenedInput& in, bool requests) {
  // What a reader accepted, as the writer takes it (non-UTF-8 strings, negative lines and
  // times, repeated keys: WritableHeader in fragscope/trace.h).
  TraceHeader header = WritableHeader(in.reader->header());
  if (requests) header.kind = TraceKind::kRequest;
  if (header.producer.empty()) header.producer = "fragscope convert";
  Result<std::unique_ptr<TraceWriter>> writer = TraceWriter::Create(flags.output, header);
  if (!writer.ok()) return OutputFailure(writer.status());
  // Frames are defined before the first event that names them. A trace reader learns its
  // frames as it reads (frame lines, events' frames), so the table is looked at per event.
  std::vector<bool> defined;
  auto define = [&](std::int32_t frame) -> Status {
    if (frame < 0) return Status::Ok();
    const auto f = static_cast<std::size_t>(frame);
    const std::vector<Frame>& frames = in.reader->frames();
    if (f >= frames.size()) return Status::Ok();
    if (f >= defined.size()) defined.resize(frames.size(), false);
    if (defined[f]) return Status::Ok();
    defined[f] = true;
    return (*writer)->WriteFrame(WritableFrame(frames[f]));
  };
  std::uint64_t written = 0;
  std::vector<std::string> notes;
  Status write_error;
  auto write = [&](const Event& e) -> Status {
    if (!write_error.ok()) return Status::Ok();
    Event out = WritableEvent(e);
    if (out.frame >= 0 && static_cast<std::size_t>(out.frame) >= in.reader->frames().size()) {
      out.frame = -1;
    }
    write_error = define(out.frame);
    if (write_error.ok()) write_error = (*writer)->Write(out);
    if (write_error.ok()) ++written;
    return Status::Ok();
  };
  // Requests: a snapshot's start state is rebuilt with requests (SnapshotRequests); a trace's
  // allocator events become the program's requests.
  Result<model::AllocatorRules> rules =
      model::AllocatorRules::FromSettings(header.allocator_settings);
  if (!rules.ok()) return BadInput(fmt::format("{}: {}", flags.input, rules.status().message()));
  std::optional<sources::SnapshotRequests> from_snapshot;
  if (requests && in.snapshot != nullptr) from_snapshot.emplace(*in.snapshot, *rules, write);
  model::RequestExtractor extractor;
  Result<std::uint64_t> read = ForEachEvent(
      in,
      [&](const Event& e) -> Status {
        if (!requests) return write(e);
        if (from_snapshot) return from_snapshot->Consume(e);
        Event out;
        return extractor.Convert(e, &out) ? write(out) : Status::Ok();
      },
      &notes);
  if (from_snapshot) from_snapshot->AddNotes(&notes);
  if (!read.ok()) return BadInput(read.status().message());
  if (!write_error.ok()) return Failure(write_error.message());
  if (Status st = (*writer)->Close(); !st.ok()) return Failure(st.message());
  PrintNotes(in, notes);
  PrintSafe(stderr, fmt::format("fragscope: wrote {} {} events to {}\n", FormatCount(written),
                                requests ? "request" : "allocator", flags.output));
  return kExitOk;
}

int ToPerfetto(const ConvertFlags& flags, OpenedInput& in) {
  Result<model::AllocatorRules> rules =
      model::AllocatorRules::FromSettings(in.reader->header().allocator_settings);
  if (!rules.ok()) return BadInput(fmt::format("{}: {}", flags.input, rules.status().message()));
  if (in.reader->header().kind == TraceKind::kRequest) {
    return BadInput(
        fmt::format("{}: a request trace has no allocator state to chart; replay it first "
                    "(fragscope replay --emit OUT.jsonl) and convert that",
                    flags.input));
  }
  Result<std::unique_ptr<AtomicOutput>> out = AtomicOutput::Create(flags.output);
  if (!out.ok()) return OutputFailure(out.status());
  // The chart grows with the events, which a small compressed input can hold millions of: the
  // same output budget as --to json, from the input's size as stored (0 for a stream).
  std::error_code size_error;
  const std::uintmax_t stored = std::filesystem::is_regular_file(flags.input, size_error)
                                    ? std::filesystem::file_size(flags.input, size_error)
                                    : 0;
  (*out)->SetBudget(sources::OutputBudgetFor(size_error ? 0 : stored),
                    sources::ProcessBudget().max_output_bytes != 0);
  sinks::PerfettoWriter writer([&](std::string_view s) { return (*out)->Write(s); }, flags.input);
  Status write_error;
  analysis::CounterTrack track(
      *rules,
      [&](const analysis::CounterSample& s) {
        if (write_error.ok()) write_error = writer.Sample(s);
        return Status::Ok();
      },
      [&](const analysis::Marker& m) {
        if (write_error.ok()) write_error = writer.Mark(m);
        return Status::Ok();
      });
  std::vector<std::string> notes;
  const auto consume = [&](const Event& e) { return track.Consume(e); };
  Result<std::uint64_t> read = ForEachEvent(in, consume, &notes);
  if (!read.ok()) return BadInput(read.status().message());
  if (write_error.ok()) write_error = writer.Finish();
  if (write_error.code() == StatusCode::kLimitExceeded) {
    return BadInput(flags.input + ": " + write_error.message());
  }
  if (write_error.ok()) write_error = (*out)->Commit();
  if (!write_error.ok()) return Failure(write_error.message());
  PrintNotes(in, notes);
  PrintSafe(stderr, fmt::format("fragscope: wrote {} trace events ({} input events) to {}\n",
                                writer.events_written(), *read, flags.output));
  return kExitOk;
}

int ToJson(const ConvertFlags& flags) {
  ProgressLine progress;
  Result<sources::Document> doc = sources::ReadDocumentFile(
      flags.input, nullptr, {}, [&](std::uint64_t done, std::uint64_t total) {
        progress.UpdateBytes(done, total, "reading the snapshot");
      });
  progress.Clear();
  if (!doc.ok()) return BadInput(doc.status().message());
  Result<std::unique_ptr<AtomicOutput>> out = AtomicOutput::Create(flags.output);
  if (!out.ok()) return OutputFailure(out.status());
  Status st =
      sources::WriteDocumentJson(*doc, [&](std::string_view s) { return (*out)->Write(s); });
  if (st.code() == StatusCode::kLimitExceeded) return BadInput(flags.input + ": " + st.message());
  if (st.ok()) st = (*out)->Commit();
  if (!st.ok()) return Failure(st.message());
  PrintSafe(stderr, fmt::format("fragscope: wrote {}\n", flags.output));
  return kExitOk;
}

int RunConvert(const ConvertFlags& flags) {
  const std::string to = flags.to.empty() ? FormatFor(flags.output) : flags.to;
  if (to.empty()) {
    return BadInput(fmt::format(
        "-o {}: cannot tell the format from the name; use --to trace|requests|perfetto|json",
        flags.output));
  }
  if (flags.output == flags.input) return BadInput("-o names the input file itself");
  Result<sources::InputKind> kind = sources::DetectInputKind(flags.input);
  if (!kind.ok()) return BadInput(kind.status().message());
  if (to == "json") {
    if (*kind != sources::InputKind::kSnapshot) {
      return BadInput(fmt::format(
          "{}: --to json converts snapshots; this is a fragscope trace (already JSON Lines)",
          flags.input));
    }
    return ToJson(flags);
  }
  Result<OpenedInput> in = OpenInput(flags.input);
  if (!in.ok()) return BadInput(in.status().message());
  if (to == "perfetto") return ToPerfetto(flags, *in);
  return ToTrace(flags, *in, to == "requests");
}

}  // namespace

Command AddConvertCommand(CLI::App& app) {
  auto flags = std::make_shared<ConvertFlags>();
  CLI::App* sub = app.add_subcommand("convert", std::string(kConvertDescription));
  sub->footer(std::string(kConvertFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("INPUT", flags->input, "A PyTorch memory snapshot or a fragscope trace")
      ->type_name("PATH")
      ->required();
  sub->add_option("-o,--output", flags->output, "Where to write")->type_name("OUT")->required();
  sub->add_option("--to", flags->to, "Output format (default: from OUT's name)")
      ->check(CLI::IsMember({"trace", "requests", "perfetto", "json"}));
  return Command{sub, [flags] { return RunConvert(*flags); }};
}

}  // namespace fragscope::cli
