#include "tune_command.h"

#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "analysis/tune.h"
#include "cli_util.h"
#include "common/units.h"
#include "fragscope/trace.h"

namespace fragscope::cli {
namespace {

struct TuneFlags {
  std::string path;
  std::string capacity;
  std::string used_by_others;
  std::vector<std::string> settings;
  std::string torch_version = "newest";
  unsigned threads = 0;
  bool min_capacity = false;
  bool json = false;
  std::size_t rows = 20;
};

constexpr std::string_view kDescription =
    "Rank allocator settings (PYTORCH_CUDA_ALLOC_CONF) by replaying a request trace";

constexpr std::string_view kFooter =
    R"(Replays the trace through the caching-allocator simulator once per setting, in parallel,
on a device of --capacity bytes, and ranks the settings: runs without an out-of-memory error
first, then the lowest peak reserved memory, then the lowest waste at the high-water mark
((peak reserved - peak allocated) / peak reserved); settings that run out of memory rank by how
far they got. Prints the table and the recommended
PYTORCH_CUDA_ALLOC_CONF line with its saving against PyTorch's defaults.

The default grid has 72 settings: expandable_segments False/True x max_split_size_mb
unset/32/64/128/256/512 x roundup_power2_divisions 0/4/8 x garbage_collection_threshold off or
0.8 (with per_process_memory_fraction 0.95, which it needs). --setting replaces the grid.

--min-capacity also finds, by bisection to 2 MiB, the smallest device each setting runs on
without an OOM (about 15 more replays per setting).

The trace is held in memory (about 100 bytes per event) so that every thread replays it.

Examples:
  fragscope tune trace.jsonl.gz --capacity 24GiB
  fragscope tune trace.jsonl.gz --capacity 24GiB --min-capacity --json
  fragscope tune trace.jsonl.gz --capacity 16GiB --setting "" --setting expandable_segments:True

Exit status: 0 if some setting runs without an OOM, 1 if none does, 2 for bad input.)";

std::string ConfText(const std::string& conf) { return conf.empty() ? "(defaults)" : conf; }

int RunTune(const TuneFlags& flags) {
  analysis::TuneOptions options;
  Result<std::uint64_t> capacity = ParseSize(flags.capacity);
  if (!capacity.ok()) return BadInput("--capacity: " + capacity.status().message());
  options.capacity_bytes = *capacity;
  if (!flags.used_by_others.empty()) {
    Result<std::uint64_t> u = ParseSize(flags.used_by_others);
    if (!u.ok()) return BadInput("--used-by-others: " + u.status().message());
    options.used_by_others_bytes = *u;
  }
  options.version = TorchVersion(flags.torch_version);
  options.settings = flags.settings;
  options.threads = flags.threads;
  options.find_min_capacity = flags.min_capacity;

  Result<std::unique_ptr<TraceReader>> opened = TraceReader::Open(flags.path);
  if (!opened.ok()) return BadInput(opened.status().message());
  TraceReader& reader = **opened;
  if (reader.header().kind == TraceKind::kAllocator) {
    return BadInput(
        fmt::format("{}: this is an allocator trace; tune takes a request trace", flags.path));
  }
  std::vector<Event> events;
  Result<std::uint64_t> read = ReadAllEvents(reader, [&](const Event& e) -> Status {
    if (e.action == Action::kSegmentAlloc || e.action == Action::kSegmentFree ||
        e.action == Action::kSegmentMap || e.action == Action::kSegmentUnmap) {
      return Status::Corruption(fmt::format("{} in a request trace", ActionName(e.action)));
    }
    events.push_back(e);
    return Status::Ok();
  });
  if (!read.ok()) return BadInput(read.status().message());

  Result<std::vector<analysis::TuneOutcome>> tuned = analysis::Tune(events, options);
  if (!tuned.ok()) return BadInput(fmt::format("{}: {}", flags.path, tuned.status().message()));
  const std::vector<analysis::TuneOutcome>& ranked = *tuned;
  const analysis::TuneOutcome* baseline = nullptr;
  for (const analysis::TuneOutcome& o : ranked) {
    if (o.conf.empty()) baseline = &o;
  }
  const analysis::TuneOutcome& best = ranked.front();

  std::string out;
  if (flags.json) {
    using Json = nlohmann::ordered_json;
    Json j = Json::object();
    j["schema"] = "fragscope.tune";
    j["schema_version"] = 1;
    j["trace"] = flags.path;
    j["capacity_bytes"] = options.capacity_bytes;
    j["used_by_others_bytes"] = options.used_by_others_bytes;
    j["request_events"] = events.size();
    Json rows = Json::array();
    for (const analysis::TuneOutcome& o : ranked) {
      Json r = Json::object();
      r["alloc_conf"] = o.conf;
      r["oom"] = o.oom;
      r["oom_event_index"] = o.oom ? Json(o.oom_event) : Json(nullptr);
      r["oom_step"] = o.oom && o.oom_step >= 0 ? Json(o.oom_step) : Json(nullptr);
      r["peak_reserved_bytes"] = o.peak_reserved;
      r["peak_allocated_bytes"] = o.peak_allocated;
      r["waste_at_peak"] = o.waste_at_peak;
      r["num_alloc_retries"] = o.num_alloc_retries;
      r["num_device_alloc"] = o.num_device_alloc;
      r["min_capacity_bytes"] = o.min_capacity ? Json(*o.min_capacity) : Json(nullptr);
      rows.push_back(std::move(r));
    }
    j["ranked"] = std::move(rows);
    j["recommended"] = best.oom ? Json(nullptr) : Json(best.conf);
    j["default"] = nullptr;  // the row of "" (PyTorch's defaults), if it was tried
    for (const Json& r : j["ranked"]) {
      if (r["alloc_conf"] == "") j["default"] = r;
    }
    out = j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  } else {
    out += fmt::format(
        "fragscope tune: {} ({} request events) on {} ({} used by others), "
        "{} settings\n\n",
        flags.path, events.size(), FormatBytes(options.capacity_bytes),
        FormatBytes(options.used_by_others_bytes), ranked.size());
    out += fmt::format("  {:>4}  {:<10}  {:>13}  {:>14}  {:>6}  {:>7}{}  {}\n", "rank", "result",
                       "peak reserved", "peak allocated", "waste", "retries",
                       flags.min_capacity ? "  min capacity" : "", "PYTORCH_CUDA_ALLOC_CONF");
    const std::size_t shown = flags.rows == 0 ? ranked.size() : std::min(flags.rows, ranked.size());
    for (std::size_t i = 0; i < ranked.size(); ++i) {
      const analysis::TuneOutcome& o = ranked[i];
      if (i >= shown && &o != baseline) continue;
      const std::string result =
          o.oom ? (o.oom_step >= 0 ? fmt::format("OOM step {}", o.oom_step) : std::string("OOM"))
                : std::string("fits");
      out += fmt::format("  {:>4}  {:<10}  {:>13}  {:>14}  {:>5.1f}%  {:>7}{}  {}\n", i + 1, result,
                         FormatBytes(o.peak_reserved), FormatBytes(o.peak_allocated),
                         100.0 * o.waste_at_peak, o.num_alloc_retries,
                         flags.min_capacity
                             ? fmt::format("  {:>12}", o.min_capacity ? FormatBytes(*o.min_capacity)
                                                                      : std::string("-"))
                             : std::string(),
                         ConfText(o.conf));
    }
    if (shown < ranked.size()) {
      out += fmt::format("  ({} more settings; --rows 0 shows all, --json lists all)\n",
                         ranked.size() - shown);
    }
    out += "\n";
    if (best.oom) {
      out += fmt::format(
          "  No setting avoids the out-of-memory error on {}: the job needs a "
          "larger device or less memory (smaller batch, shorter sequences).\n",
          FormatBytes(options.capacity_bytes));
    } else {
      out += fmt::format("  Recommended: PYTORCH_CUDA_ALLOC_CONF={}\n",
                         best.conf.empty() ? "\"\" (the defaults are best)" : best.conf);
      if (baseline != nullptr && baseline != &best) {
        if (baseline->oom) {
          out += fmt::format(
              "  The defaults run out of memory at request event {}{}; this "
              "setting fits, with a peak reserved of {}.\n",
              baseline->oom_event,
              baseline->oom_step >= 0 ? fmt::format(" (step {})", baseline->oom_step)
                                      : std::string(),
              FormatBytes(best.peak_reserved));
        } else {
          const std::uint64_t saved = baseline->peak_reserved > best.peak_reserved
                                          ? baseline->peak_reserved - best.peak_reserved
                                          : 0;
          out += fmt::format(
              "  Saves {} of peak reserved memory against the defaults ({} -> {}, "
              "{:.1f}%).\n",
              FormatBytes(saved), FormatBytes(baseline->peak_reserved),
              FormatBytes(best.peak_reserved),
              baseline->peak_reserved == 0 ? 0.0
                                           : 100.0 * static_cast<double>(saved) /
                                                 static_cast<double>(baseline->peak_reserved));
        }
      }
    }
  }
  const int written = WriteReport(out);
  if (written != kExitOk) return written;
  return best.oom ? kExitFailure : kExitOk;
}

}  // namespace

Command AddTuneCommand(CLI::App& app) {
  auto flags = std::make_shared<TuneFlags>();
  CLI::App* sub = app.add_subcommand("tune", std::string(kDescription));
  sub->footer(std::string(kFooter));
  sub->add_option("TRACE", flags->path, "Request trace: JSON Lines, plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  sub->add_option("--capacity", flags->capacity, "Device memory of the virtual GPU")
      ->type_name("SIZE")
      ->required()
      ->check(ByteSize(1));
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Device memory used outside PyTorch: CUDA context, NCCL, other processes")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--setting", flags->settings,
                  "A PYTORCH_CUDA_ALLOC_CONF to try (repeat; replaces the default grid)")
      ->type_name("CONF");
  AddTorchVersionOption(*sub, &flags->torch_version);
  sub->add_option("--threads", flags->threads, "Worker threads (0 = one per hardware thread)")
      ->type_name("N")
      ->check(IntegerAtLeast(0))
      ->capture_default_str();
  sub->add_flag("--min-capacity", flags->min_capacity,
                "Also find the smallest device each setting fits on (bisection)");
  sub->add_flag("--json", flags->json, "Print JSON instead of text");
  sub->add_option("--rows", flags->rows, "Table rows shown (0 = all)")
      ->type_name("N")
      ->check(IntegerAtLeast(0))
      ->capture_default_str();
  return Command{sub, [flags] { return RunTune(*flags); }};
}

}  // namespace fragscope::cli
