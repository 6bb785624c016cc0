#include "explain_command.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "analysis/bfc_explain.h"
#include "analysis/bfc_verify.h"
#include "analysis/explain.h"
#include "analysis/tune.h"
#include "cli_util.h"
#include "common/units.h"
#include "model/alloc_conf.h"
#include "pipeline/replay.h"
#include "sinks/report/explain_report.h"
#include "sources/bfc_text/bfc_log.h"
#include "sources/oom_text/oom_text_scanner.h"
#include "sources/snapshot/snapshot_requests.h"

namespace fragscope::cli {
namespace {

struct ExplainFlags {
  std::string path = "-";
  std::string trace;
  std::string snapshot;
  std::string capacity;
  std::string used_by_others;
  std::optional<std::string> alloc_conf;  // unset: a snapshot's recorded settings, else ""
  std::optional<std::string> bfc_conf;    // TensorFlow / JAX: unset = read from the log
  std::string torch_version = "newest";
  std::size_t error = 0;  // 1-based; 0: the first with figures
  unsigned threads = 0;
  bool json = false;
};

constexpr std::string_view kExplainDescription =
    "Explain a CUDA out-of-memory error: fragmentation or shortage, and the fix";

constexpr std::string_view kExplainFooter =
    R"(Reads a log (or the pasted error text, from standard input when FILE is - or omitted),
finds every out-of-memory message of PyTorch's caching allocator in it, in any wording since
PyTorch 1.x (CUDA, ROCm's "HIP out of memory", XPU; wrapped lines, "[rank3]:" and timestamp
prefixes, tracebacks around it), and for each one says:
  * the verdict: fragmentation (enough memory was cached by PyTorch but not in one block),
    shortage (not enough even if every cached byte were one block), other processes (it would
    have fit without the memory they held), cap (the process's allowed share - a memory
    fraction - was the bound, printed as "allowed" or shown by far more free memory than the
    request), or undetermined (and which figure is missing);
  * how much memory was stranded, with the formula and the message's own figures;
  * the remedies, best first: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, a
    max_split_size_mb computed from the figures, fixed shapes, a smaller batch, freeing other
    processes' memory, garbage_collection_threshold, ... (for a HIP message the settings name
    PYTORCH_HIP_ALLOC_CONF, as the message's own hint does)

Repeated copies of one message (same text and rank) are reported once.

With --trace (a request trace) or --snapshot (a PyTorch memory snapshot) the job's requests
are replayed through the caching-allocator simulator on the device the message describes
(total capacity, minus the memory outside PyTorch's cache), once with the current settings
(--alloc-conf; for a snapshot, by default the settings it recorded) and once per proposed
allocator setting, and the remedies are re-ranked by the measured result: fits or still OOM,
peak reserved, fragmentation at the OOM point; a setting that runs out of memory earlier than
the current settings is marked worse and ranked last. The same replays try `fragscope tune`'s
default grid: its best setting is added when no proposed setting fits with a peak as low.

TensorFlow and JAX logs (the BFC allocator's dump, XLA's RESOURCE_EXHAUSTED, cuMemAllocAsync
failures) get the same verdicts with the remedies in that framework's terms; with --trace they
are replayed through the BFC allocator model under the job's settings (read from the log, or
--bfc-conf) and each remedy's, and ranked the same way.

docs/explain.md has the formulas and the supported wordings with their PyTorch versions.

Examples:
  fragscope explain train.log
  kubectl logs trainer-0 | fragscope explain
  fragscope explain train.log --json | jq '.errors[] | {gpu, verdict, stranded_bytes}'
  fragscope explain train.log --trace requests.jsonl.gz
  fragscope explain oom.txt --snapshot snapshot.pickle --alloc-conf max_split_size_mb:128
  fragscope explain tf_train.log --trace requests.jsonl --capacity 16GiB

Exit status: 0 if an out-of-memory message was explained, 2 if none was found or none had its
figures (the message says which), or for bad usage.)";

// For a FILE with no out-of-memory message: what it is instead, when it is not text (a
// snapshot, a trace, a torch.save archive, an empty or binary file), and which command takes it.
// "" for text: a log without such a message.
std::string NotErrorText(const std::string& path) {
  const std::string expected = fmt::format(
      "{}: expected the text of an out-of-memory error (a job's log, or the message itself)", path);
  Result<sources::InputKind> kind = sources::DetectInputKind(path);
  if (!kind.ok()) {
    const std::string& message = kind.status().message();
    const std::size_t at = message.find("this file is ");
    if (at == std::string::npos || message.find("this file is text") != std::string::npos) {
      return "";
    }
    return expected + "; " + message.substr(at);
  }
  if (*kind == sources::InputKind::kSnapshot) {
    return fmt::format(
        "{}; this file is a PyTorch memory snapshot: `fragscope analyze {}` shows what it "
        "recorded, and `fragscope explain LOG --snapshot {}` replays it to test the fixes for the "
        "error in LOG",
        expected, path, path);
  }
  return fmt::format(
      "{}; this file looks like a fragscope trace: `fragscope analyze {}` or `fragscope replay {}` "
      "reads it, and `fragscope explain LOG --trace {}` replays it for the error in LOG",
      expected, path, path, path);
}

// `--trace` on a TensorFlow / JAX log: the chosen failure's remedies replayed through the BFC
// model (bfc_verify.h).
int VerifyBfc(const ExplainFlags& flags, const sources::BfcLogScan& scan,
              std::optional<std::uint64_t> capacity, analysis::BfcExplainReport* report) {
  std::size_t index = 0;
  if (flags.error > 0) {
    index = flags.error - 1;
  } else {
    while (index + 1 < report->errors.size() && !report->errors[index].figures) ++index;
  }
  analysis::BfcExplanation& target = report->errors[index];
  analysis::BfcVerifyOptions options;
  options.current_conf = flags.bfc_conf;
  if (capacity) {
    options.capacity_bytes = *capacity;
  } else if (target.figures && target.figures->device_total) {
    options.capacity_bytes = *target.figures->device_total;
  }
  Result<std::optional<std::uint64_t>> others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!others.ok()) return BadInput(others.status().message());
  options.used_by_others_bytes = others->value_or(0);
  Result<OpenedInput> opened = OpenInput(flags.trace);
  if (!opened.ok()) return BadInput(opened.status().message());
  if (opened->snapshot != nullptr) {
    return BadInput(fmt::format(
        "{}: a PyTorch snapshot; the BFC model replays a request trace (`fragscope convert {} -o "
        "requests.jsonl --to requests` makes one)",
        flags.trace, flags.trace));
  }
  std::vector<std::string> notes;
  Result<pipeline::RequestEvents> events =
      ReadRequestEvents(*opened, flags.trace, model::AllocatorRules{}, &notes, {});
  if (!events.ok()) return BadInput(events.status().message());
  Result<analysis::BfcVerification> verified = analysis::VerifyBfcRemedies(
      events->events, scan.reports[index], scan.context, options, &target);
  if (!verified.ok()) {
    return BadInput(fmt::format("{}: {}", flags.trace, verified.status().message()));
  }
  verified->source = flags.trace;
  report->verification = std::move(*verified);
  report->verified_error = index;
  return kExitOk;
}

// A TensorFlow / JAX log: every allocator failure it reports, explained (bfc_explain.h).
int RunBfcExplain(const ExplainFlags& flags, const sources::BfcLogScan& scan,
                  std::optional<std::uint64_t> capacity, std::uint64_t pytorch_messages) {
  if (!flags.snapshot.empty() || flags.alloc_conf) {
    return BadInput(
        "--snapshot and --alloc-conf replay PyTorch's caching allocator; this log reports a "
        "TensorFlow/JAX allocator failure: give the job's request trace with --trace (and its "
        "BFC settings with --bfc-conf)");
  }
  analysis::BfcExplainReport report;
  report.input = flags.path;
  report.lines = scan.lines;
  report.cut_lines = scan.cut_lines;
  report.dropped_reports = scan.dropped_reports;
  report.soft_failures = scan.context.soft_failures;
  report.pytorch_messages = pytorch_messages;
  bool any_explained = false;
  for (std::size_t i = 0; i < scan.reports.size(); ++i) {
    report.errors.push_back(analysis::ExplainBfc(scan.reports[i], scan.context, capacity));
    report.errors.back().report = i;
    any_explained = any_explained || report.errors.back().figures.has_value();
  }
  if (flags.error > report.errors.size()) {
    return BadInput(fmt::format("--error {}: the input has {} allocator failure{}", flags.error,
                                report.errors.size(), report.errors.size() == 1 ? "" : "s"));
  }
  if (!flags.trace.empty()) {
    if (int bad = VerifyBfc(flags, scan, capacity, &report); bad != kExitOk) return bad;
  }
  const std::string out =
      flags.json ? sinks::RenderBfcExplainJson(report) : sinks::RenderBfcExplainText(report);
  const int written = WriteReport(out, flags.json ? ReportForm::kJson : ReportForm::kText);
  if (written != kExitOk) return written;
  if (any_explained) return kExitOk;
  const std::string input = flags.path == "-" ? std::string("standard input") : flags.path;
  for (const analysis::BfcExplanation& e : report.errors) {
    std::string list;
    for (const std::string& x : e.missing) list += (list.empty() ? "'" : ", '") + x + "'";
    PrintSafe(stderr, fmt::format("fragscope: {}:{}: found an allocator failure but no {} "
                                  "figure{}\n",
                                  input, e.line, list, e.missing.size() == 1 ? "" : "s"));
  }
  return kExitBadInput;
}

int RunExplain(const ExplainFlags& flags) {
  const model::ConfigVersion version = TorchVersion(flags.torch_version);
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  Result<std::optional<std::uint64_t>> used_by_others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!used_by_others.ok()) return BadInput(used_by_others.status().message());
  if (Status fits = CheckUsedByOthers(*capacity, *used_by_others); !fits.ok())
    return BadInput(fits.message());
  if (!flags.trace.empty() && !flags.snapshot.empty()) {
    return BadInput("give --trace or --snapshot, not both");
  }
  Result<model::AllocatorConfig> current =
      model::ParseUserAllocatorConf(flags.alloc_conf.value_or(""), version);
  if (!current.ok()) return BadInput("--alloc-conf: " + current.status().message());

  if (flags.path == "-" && isatty(STDIN_FILENO) != 0) {
    std::fputs(
        "fragscope: reading the error text from standard input (paste it, then Ctrl-D; "
        "or give a FILE)\n",
        stderr);
  }
  // One pass feeds both scanners: PyTorch's messages and TensorFlow/JAX allocator failures.
  sources::BfcLogScanner bfc;
  const auto feed = [&bfc](std::string_view line) { bfc.AddLine(line); };
  Result<sources::OomTextScan> scan = sources::ReadOomText(flags.path, {}, feed);
  if (!scan.ok()) return BadInput(scan.status().message());
  const sources::BfcLogScan bfc_scan = bfc.Finish();
  if (!bfc_scan.reports.empty()) {
    // cuda_malloc_async's line holds "CUDA error: out of memory": not a PyTorch message.
    const auto inside_bfc = [&bfc_scan](const OomMessage& m) {
      for (const BfcReport& r : bfc_scan.reports) {
        if (m.line >= r.line && m.line <= std::max(r.line, r.last_line)) return true;
      }
      return false;
    };
    std::erase_if(scan->messages, inside_bfc);
    const auto has_figures = [](const OomMessage& m) { return m.total.has_value(); };
    if (std::none_of(scan->messages.begin(), scan->messages.end(), has_figures)) {
      return RunBfcExplain(flags, bfc_scan, *capacity, scan->messages.size());
    }
  }
  const std::string input = flags.path == "-" ? std::string("standard input") : flags.path;
  if (scan->messages.empty()) {
    // Standard input and FIFOs too: their first bytes are read again from the buffer every
    // stream keeps (sources::OpenFileSource), not from the stream.
    if (const std::string other = NotErrorText(flags.path); !other.empty()) return BadInput(other);
    return BadInput(fmt::format(
        "{}: no out-of-memory message in {} lines (looked for \"CUDA out of memory\", \"HIP out "
        "of memory\", \"XPU out of memory\", \"CUDA error: out of memory\", and TensorFlow's and "
        "JAX's \"ran out of memory trying to allocate\", \"Out of memory while trying to "
        "allocate\", \"cuMemAllocAsync failed\")",
        input, scan->lines));
  }
  analysis::ExplainReport report;
  report.input = flags.path;
  report.lines = scan->lines;
  report.cut_lines = scan->cut_lines;
  report.dropped_messages = scan->dropped_messages;
  bool any_explained = false;
  for (const OomMessage& m : scan->messages) {
    report.errors.push_back(analysis::ExplainOom(m));
    if (flags.alloc_conf) {
      analysis::OmitRemediesInEffect(*current, "--alloc-conf", version, &report.errors.back());
    }
    const analysis::OomExplanation& last = report.errors.back();
    any_explained = any_explained || (last.figures.has_value() && last.figures_agree);
  }
  if (flags.error > report.errors.size()) {
    return BadInput(fmt::format("--error {}: the input has {} out-of-memory message{}", flags.error,
                                report.errors.size(), report.errors.size() == 1 ? "" : "s"));
  }

  const std::string& replay_path = flags.trace.empty() ? flags.snapshot : flags.trace;
  if (!replay_path.empty()) {
    std::size_t index = 0;
    if (flags.error > 0) {
      index = flags.error - 1;
    } else {
      while (index + 1 < report.errors.size() && !report.errors[index].figures) ++index;
    }
    analysis::OomExplanation& target = report.errors[index];
    analysis::VerifyOptions options;
    options.version = version;
    options.threads = flags.threads;
    options.current_conf = model::ToConfString(*current);
    if (target.figures) {
      options.capacity_bytes = target.figures->total;
      options.used_by_others_bytes = target.figures->outside;
    }
    if (*capacity) options.capacity_bytes = **capacity;
    if (*used_by_others) options.used_by_others_bytes = **used_by_others;
    if (options.capacity_bytes == 0) {
      return BadInput(fmt::format(
          "error {} (line {}) gives no total capacity to replay on; give --capacity SIZE",
          index + 1, target.message.line));
    }
    std::vector<std::string> notes;
    Result<OpenedInput> opened = OpenInput(replay_path);
    if (!opened.ok()) return BadInput(opened.status().message());
    // A snapshot's segments go where the real driver put them, and the job's own settings are
    // those it recorded unless --alloc-conf says otherwise, as in `replay`.
    if (opened->snapshot != nullptr) {
      options.addresses = sources::RecordedSegmentAddresses(*opened->snapshot);
      if (!flags.alloc_conf) {
        Result<RecordedSettings> recorded =
            ReadRecordedSettings(*opened->snapshot, replay_path, version, &notes);
        if (!recorded.ok()) return BadInput(recorded.status().message());
        options.current_conf = recorded->conf;
        current = recorded->config;
        for (analysis::OomExplanation& e : report.errors) {
          analysis::OmitRemediesInEffect(*current, "the snapshot's recorded settings", version, &e);
        }
      }
    }
    Result<pipeline::RequestEvents> events =
        ReadRequestEvents(*opened, replay_path, current->Rules(), &notes);
    if (!events.ok()) return BadInput(events.status().message());
    options.recorded_from = events->recorded_from;
    options.recorded_device_allocs = events->recorded_device_allocs;
    options.search = analysis::DefaultTuneGrid(version);  // tune's own search, in one pass
    Result<analysis::Verification> verified =
        analysis::VerifyRemedies(events->events, options, &target);
    if (!verified.ok()) {
      return BadInput(fmt::format("{}: {}", replay_path, verified.status().message()));
    }
    verified->source = replay_path;
    // "A GPU of at least X" is the failing request's arithmetic; the whole job can need more
    // (a later peak) or less. Say what `tune --min-capacity` finds under the job's settings.
    const bool larger_gpu =
        std::any_of(target.remedies.begin(), target.remedies.end(),
                    [](const analysis::Remedy& r) { return r.id == "larger_gpu"; });
    // A history that cannot rank the settings (verified->cannot_rank) cannot size the GPU
    // either: its minimum capacity would be a rebuild's.
    if (larger_gpu && verified->cannot_rank.empty()) {
      analysis::TuneOptions tune;
      tune.capacity_bytes = options.capacity_bytes;
      tune.used_by_others_bytes = options.used_by_others_bytes;
      tune.version = version;
      tune.threads = flags.threads;
      tune.addresses = options.addresses;
      tune.recorded_from = events->recorded_from;
      tune.settings = {options.current_conf};
      tune.find_min_capacity = true;
      Result<std::vector<analysis::TuneOutcome>> minimum = analysis::Tune(events->events, tune);
      if (minimum.ok() && !minimum->empty() && minimum->front().min_capacity) {
        target.notes.push_back(fmt::format(
            "replay: the whole job fits on a GPU of {} under its own settings (the smallest, "
            "as `fragscope tune --min-capacity` finds it); a larger-GPU remedy above counts the "
            "failing request alone",
            FormatBytes(*minimum->front().min_capacity)));
      }
    }
    report.verification = std::move(*verified);
    report.verified_error = index;
    for (std::string& note : notes) target.notes.push_back("replay: " + note);
  }

  const std::string out =
      flags.json ? sinks::RenderExplainJson(report) : sinks::RenderExplainText(report);
  const int written = WriteReport(out, flags.json ? ReportForm::kJson : ReportForm::kText);
  if (written != kExitOk) return written;
  if (!any_explained) {
    for (const analysis::OomExplanation& e : report.errors) {
      if (!e.figures_agree) {
        PrintSafe(stderr, fmt::format("fragscope: {}:{}: found '{} out of memory' but its figures "
                                      "contradict each other (reserved + free > total capacity)\n",
                                      input, e.message.line, e.message.backend));
        continue;
      }
      std::string list;
      for (const std::string& x : e.missing) list += (list.empty() ? "'" : ", '") + x + "'";
      PrintSafe(
          stderr,
          fmt::format("fragscope: {}:{}: found '{} out of memory' but no {} figure{}\n", input,
                      e.message.line, e.message.backend, list, e.missing.size() == 1 ? "" : "s"));
    }
    return kExitBadInput;
  }
  return kExitOk;
}

}  // namespace

Command AddExplainCommand(CLI::App& app) {
  auto flags = std::make_shared<ExplainFlags>();
  CLI::App* sub = app.add_subcommand("explain", std::string(kExplainDescription));
  sub->footer(std::string(kExplainFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("FILE", flags->path, "Log or error text; - (the default) reads standard input")
      ->type_name("PATH");
  sub->add_option("--trace", flags->trace,
                  "Request trace of the job to replay under each remedy (.jsonl, .gz, .zst)")
      ->type_name("PATH");
  sub->add_option("--snapshot", flags->snapshot,
                  "PyTorch memory snapshot of the job to replay instead (.pickle, .json)")
      ->type_name("PATH");
  sub->add_option("--capacity", flags->capacity,
                  "Device memory for the replay (default: the message's total capacity)")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Memory outside PyTorch for the replay (default: total - free - reserved)")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option(
         "--alloc-conf", flags->alloc_conf,
         "The job's own PYTORCH_CUDA_ALLOC_CONF, to which remedies are added (default: the "
         "snapshot's recorded settings, else PyTorch's defaults)")
      ->type_name("STR");
  sub->add_option("--bfc-conf", flags->bfc_conf,
                  "TensorFlow / JAX log with --trace: the job's BFC allocator settings as "
                  "`replay --bfc-conf` takes them (default: read from the log)")
      ->type_name("STR");
  sub->add_option("--error", flags->error,
                  "Which message the replay checks, 1-based (default: the first with figures)")
      ->type_name("N")
      ->check(IntegerAtLeast(1));
  AddTorchVersionOption(*sub, &flags->torch_version);
  sub->add_option("--threads", flags->threads, "Replay threads (0 = one per hardware thread)")
      ->type_name("N")
      ->check(IntegerAtLeast(0));
  sub->add_flag("--json", flags->json, "Print JSON (schema fragscope.explain) instead of text");
  return Command{sub, [flags] { return RunExplain(*flags); }};
}

}  // namespace fragscope::cli
