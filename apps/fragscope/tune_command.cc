#include "tune_command.h"

#include <algorithm>
#include <cctype>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "analysis/replay_result.h"
#include "analysis/tune.h"
#include "analysis/tune_bfc.h"
#include "cli_util.h"
#include "common/units.h"
#include "fragscope/trace.h"
#include "pipeline/replay.h"
#include "sources/snapshot/snapshot_requests.h"

namespace fragscope::cli {
namespace {

struct TuneFlags {
  std::string path;
  std::string capacity;
  std::string used_by_others;
  std::vector<std::string> settings;
  std::string addresses;  // empty: recorded for a snapshot
  std::string torch_version = "newest";
  unsigned threads = 0;
  bool min_capacity = false;
  bool json = false;
  std::size_t rows = 20;
  std::string allocator = "pytorch";  // or "bfc"
};

constexpr std::string_view kTuneDescription =
    "Rank allocator settings (PYTORCH_CUDA_ALLOC_CONF) by replaying a request trace or snapshot";

constexpr std::string_view kTuneFooter =
    R"(Replays the trace through the caching-allocator simulator once per setting, in parallel,
on a device of --capacity bytes, and ranks the settings: runs without an out-of-memory error
first, then (with --min-capacity) the smallest device a setting fits on, then the lowest peak
reserved memory, then the lowest peak allocated (the requests are
the same in every run: what a setting's rounding adds to them is waste, which brings an OOM
closer when requests grow), then the fewest keys set; settings that run out of memory rank by
how far they got. "waste" is (peak reserved - peak requested) / peak reserved: memory no
request asked for, rounding included. Prints the table and the recommended
PYTORCH_CUDA_ALLOC_CONF line with its saving against PyTorch's defaults.

The default grid has 72 settings: expandable_segments False/True x max_split_size_mb
unset/32/64/128/256/512 x roundup_power2_divisions 0/4/8 x garbage_collection_threshold off or
0.8 (with per_process_memory_fraction 0.95, which it needs). It holds only keys the chosen
--torch-version knows: 2 leaves out per_process_memory_fraction (set it in code there), 1.13
also expandable_segments (36 settings). --setting replaces the grid; it takes any string PyTorch
accepts, and a pasted PYTORCH_CUDA_ALLOC_CONF=... line.

--allocator bfc ranks the settings of TensorFlow's and JAX's BFC allocator instead (a request
trace only): the default grid is allow_growth true/false x memory_fraction 1/0.95/0.9/0.75 x
garbage_collection false/true (16), --setting takes `replay --bfc-conf` strings, and the ranking
is no OOM first, then the lowest peak pool (device memory held), then the fewest keys set.

--min-capacity also finds, by bisection to 2 MiB, the smallest device each setting runs on
without an OOM (about 15 more replays per setting).

TRACE may be a PyTorch memory snapshot: its requests are rebuilt as `fragscope replay` does
(the state before its history first, then the history; docs/snapshots.md), and the settings it
recorded join the grid, marked "recorded". Without --capacity, a device that ran out of memory
in the recorded run keeps the size its OOM reveals (reserved + the driver's free bytes), so the
table shows which settings would have avoided that OOM; devices without a recorded OOM get
unlimited memory, and the table ranks by peak reserved. Segments go where the real driver put
them (--addresses simulated: the simulator's own placement), as in `replay`. A snapshot whose
recorded history allocates no segment (everything was reserved before recording began) cannot
rank the settings: the replays compare rebuilds of its start state; tune says so and
recommends nothing.

The requests are held in memory (about 100 bytes per event) so that every thread replays them.

Examples:
  fragscope tune trace.jsonl.gz --capacity 24GiB
  fragscope tune trace.jsonl.gz --capacity 24GiB --min-capacity --json
  fragscope tune trace.jsonl.gz --capacity 16GiB --setting "" --setting expandable_segments:True
  fragscope tune oom_snapshot.pickle
  fragscope tune snapshot.pickle --min-capacity

Exit status: 0 if some setting runs without an OOM, 1 if none does, 2 for bad input.)";

std::string ConfText(const std::string& conf) { return conf.empty() ? "(defaults)" : conf; }

// "24.00 GiB", or per device when a snapshot's recorded OOMs gave sizes: "device 1: 78.51 GiB
// from its recorded OOM; devices 0, 2: unlimited memory".
std::string CapacityText(const analysis::TuneOptions& options,
                         const std::vector<std::int32_t>& unknown) {
  auto size = [](std::uint64_t bytes) {
    return bytes >= analysis::kUnlimitedCapacity ? std::string("unlimited memory")
                                                 : FormatBytes(bytes);
  };
  if (options.device_capacity_bytes.empty()) return size(options.capacity_bytes);
  std::string text;
  for (const auto& [device, bytes] : options.device_capacity_bytes) {
    text += fmt::format("{}device {}: {} from its recorded OOM", text.empty() ? "" : "; ", device,
                        FormatBytes(bytes));
  }
  if (!unknown.empty()) {
    text += fmt::format("; device{} {}: {}", unknown.size() == 1 ? "" : "s",
                        fmt::join(unknown, ", "), size(options.capacity_bytes));
  }
  return text;
}

// `tune --allocator bfc`: the BFC settings of TensorFlow / JAX on a request trace.
int RunTuneBfc(const TuneFlags& flags, std::optional<std::uint64_t> capacity,
               std::uint64_t used_by_others) {
  if (flags.min_capacity) return BadInput("--min-capacity is not offered with --allocator bfc");
  Result<OpenedInput> opened = OpenInput(flags.path);
  if (!opened.ok()) return BadInput(opened.status().message());
  if (opened->snapshot != nullptr) {
    return BadInput(
        fmt::format("{}: --allocator bfc tunes a request trace (`fragscope convert "
                    "{} -o requests.jsonl --to requests` makes one)",
                    flags.path, flags.path));
  }
  std::vector<std::string> notes;
  Result<pipeline::RequestEvents> read =
      ReadRequestEvents(*opened, flags.path, model::AllocatorRules{}, &notes, {});
  if (!read.ok()) return BadInput(read.status().message());
  Result<std::vector<analysis::BfcTuneOutcome>> tuned =
      analysis::TuneBfc(read->events, capacity.value_or(0), used_by_others, flags.settings);
  if (!tuned.ok()) return BadInput(fmt::format("{}: {}", flags.path, tuned.status().message()));
  const std::vector<analysis::BfcTuneOutcome>& ranked = *tuned;
  std::string out;
  if (flags.json) {
    nlohmann::ordered_json j = nlohmann::ordered_json::object();
    j["trace"] = flags.path;
    j["allocator"] = "bfc";
    j["capacity_bytes"] = capacity ? nlohmann::ordered_json(*capacity) : nullptr;
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (const analysis::BfcTuneOutcome& o : ranked) {
      nlohmann::ordered_json x = nlohmann::ordered_json::object();
      x["conf"] = o.conf;
      x["oom"] = o.oom;
      x["oom_event"] = o.oom ? nlohmann::ordered_json(o.oom_event) : nullptr;
      x["limit_bytes"] = o.limit_bytes;
      x["peak_pool_bytes"] = o.peak_pool_bytes;
      x["peak_in_use_bytes"] = o.peak_in_use_bytes;
      x["regions"] = o.regions;
      x["regions_freed"] = o.regions_freed;
      rows.push_back(std::move(x));
    }
    j["ranked"] = std::move(rows);
    j["recommended"] = ranked.empty() || ranked.front().oom
                           ? nlohmann::ordered_json(nullptr)
                           : nlohmann::ordered_json(ranked.front().conf);
    out = j.dump(2) + "\n";
  } else {
    out = fmt::format("fragscope tune --allocator bfc: {} ({} settings{})\n",
                      TerminalSafe(flags.path), ranked.size(),
                      capacity ? ", device of " + FormatBytes(*capacity) : std::string());
    out += "  rank  OOM at      limit       peak pool   peak in use  regions  setting\n";
    std::size_t shown = 0;
    for (const analysis::BfcTuneOutcome& o : ranked) {
      if (flags.rows != 0 && shown++ >= flags.rows) break;
      out += fmt::format("  {:>4}  {:<10}  {:>10}  {:>10}  {:>11}  {:>7}  {}\n", shown,
                         o.oom ? fmt::format("event {}", o.oom_event) : std::string("-"),
                         FormatBytes(o.limit_bytes), FormatBytes(o.peak_pool_bytes),
                         FormatBytes(o.peak_in_use_bytes), o.regions,
                         o.conf.empty() ? std::string("(defaults)") : TerminalSafe(o.conf));
    }
    if (!ranked.empty() && ranked.front().oom) {
      out +=
          "  No setting avoids the out-of-memory error: the job needs a larger device or "
          "less memory.\n";
    } else if (!ranked.empty()) {
      out += fmt::format("  Recommended: {}\n", ranked.front().conf.empty()
                                                    ? std::string("the defaults")
                                                    : TerminalSafe(ranked.front().conf));
    }
    for (const std::string& note : notes) out += fmt::format("  note: {}\n", TerminalSafe(note));
  }
  const int written = WriteReport(out, flags.json ? ReportForm::kJson : ReportForm::kText);
  if (written != kExitOk) return written;
  return !ranked.empty() && ranked.front().oom ? kExitFailure : kExitOk;
}

int RunTune(const TuneFlags& flags) {
  analysis::TuneOptions options;
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  if (!flags.used_by_others.empty()) {
    Result<std::uint64_t> u = ParseSize(flags.used_by_others);
    if (!u.ok()) return BadInput("--used-by-others: " + u.status().message());
    options.used_by_others_bytes = *u;
    if (Status fits = CheckUsedByOthers(*capacity, *u); !fits.ok()) return BadInput(fits.message());
  }
  if (flags.allocator == "bfc") return RunTuneBfc(flags, *capacity, options.used_by_others_bytes);
  options.version = TorchVersion(flags.torch_version);
  options.settings = flags.settings;
  options.threads = flags.threads;
  options.find_min_capacity = flags.min_capacity;

  Result<OpenedInput> opened = OpenInput(flags.path);
  if (!opened.ok()) return BadInput(opened.status().message());
  sources::SnapshotReader* snapshot = opened->snapshot;
  Result<bool> recorded_addresses =
      UseRecordedAddresses(RecordedAddressesFlag(flags.addresses), snapshot != nullptr, flags.path);
  if (!recorded_addresses.ok()) return BadInput(recorded_addresses.status().message());
  if (snapshot == nullptr && !*capacity) {
    return BadInput(fmt::format(
        "{}: a request trace needs --capacity SIZE (the device to replay on)", flags.path));
  }
  options.capacity_bytes = capacity->value_or(analysis::kUnlimitedCapacity);

  // A snapshot: its requests are rebuilt for the allocator that made them (its recorded
  // settings), which also join the grid; its recorded OOMs give device sizes.
  std::vector<std::string> notes;
  std::optional<std::string> recorded_conf;
  std::optional<model::AllocatorConfig> recorded_config;
  auto is_recorded = [&](const std::string& conf) {
    if (!recorded_config) return false;
    Result<model::AllocatorConfig> c = model::ParseAllocatorConfig(conf, options.version);
    return c.ok() && *c == *recorded_config;
  };
  model::AllocatorRules rules;
  std::vector<std::int32_t> unknown_devices;  // of a snapshot without --capacity: unlimited
  if (snapshot != nullptr) {
    Result<RecordedSettings> recorded =
        ReadRecordedSettings(*snapshot, flags.path, options.version, &notes);
    if (!recorded.ok()) return BadInput(recorded.status().message());
    recorded_conf = recorded->conf;
    recorded_config = recorded->config;
    rules = recorded->config.Rules();
    if (options.settings.empty()) {
      options.settings = analysis::DefaultTuneGrid(options.version);
      if (std::none_of(options.settings.begin(), options.settings.end(), is_recorded)) {
        options.settings.push_back(*recorded_conf);
      }
    }
    if (!*capacity) {
      Result<analysis::AnalysisResult> real = AnalyzeRecordedRun(*snapshot, flags.path, &notes);
      if (!real.ok()) return BadInput(real.status().message());
      RecordedCapacities found = CapacitiesFromRecordedOoms(*real, snapshot->header(),
                                                            "are given unlimited memory", &notes);
      options.device_capacity_bytes = std::move(found.bytes);
      unknown_devices = std::move(found.unknown);
    }
    if (*recorded_addresses) options.addresses = sources::RecordedSegmentAddresses(*snapshot);
  }
  // On unlimited memory a recorded OOM's request would succeed; it is left out there, as in
  // `replay`.
  Result<pipeline::RequestEvents> read =
      ReadRequestEvents(*opened, flags.path, rules, &notes, unknown_devices);
  if (!read.ok()) return BadInput(read.status().message());
  const std::vector<Event>& events = read->events;
  options.recorded_from = read->recorded_from;
  options.recorded_device_allocs = read->recorded_device_allocs;

  Result<std::vector<analysis::TuneOutcome>> tuned = analysis::Tune(events, options);
  if (!tuned.ok()) return BadInput(fmt::format("{}: {}", flags.path, tuned.status().message()));
  const std::vector<analysis::TuneOutcome>& ranked = *tuned;
  const analysis::TuneOutcome* baseline = nullptr;  // PyTorch's defaults, if tried
  const analysis::TuneOutcome* recorded = nullptr;  // a snapshot's recorded settings
  for (const analysis::TuneOutcome& o : ranked) {
    if (o.conf.empty()) baseline = &o;
    if (recorded == nullptr && is_recorded(o.conf)) recorded = &o;
  }
  const analysis::TuneOutcome& best = ranked.front();
  // The history may be unable to tell the settings apart (nothing after recording began took
  // memory from the device): then there is no best setting to recommend.
  const std::string cannot_rank = analysis::TuneCannotRank(ranked, options);

  std::string out;
  if (flags.json) {
    using Json = nlohmann::ordered_json;
    Json j = Json::object();
    j["schema"] = "fragscope.tune";
    j["schema_version"] = 1;
    j["trace"] = flags.path;
    j["capacity_bytes"] = options.capacity_bytes;
    Json own = Json::object();
    for (const auto& [device, bytes] : options.device_capacity_bytes) {
      own[std::to_string(device)] = bytes;
    }
    j["device_capacity_bytes"] = std::move(own);
    j["used_by_others_bytes"] = options.used_by_others_bytes;
    j["request_events"] = events.size();
    j["recorded_alloc_conf"] = recorded_conf ? Json(*recorded_conf) : Json(nullptr);
    Json rows = Json::array();
    Json default_row = nullptr;
    Json recorded_row = nullptr;
    for (const analysis::TuneOutcome& o : ranked) {
      Json r = Json::object();
      r["alloc_conf"] = o.conf;
      r["recorded"] = &o == recorded;
      r["oom"] = o.oom;
      r["oom_event_index"] = o.oom ? Json(o.oom_event) : Json(nullptr);
      r["oom_step"] = o.oom && o.oom_step >= 0 ? Json(o.oom_step) : Json(nullptr);
      r["peak_reserved_bytes"] = o.peak_reserved;
      r["peak_allocated_bytes"] = o.peak_allocated;
      r["peak_requested_bytes"] = o.peak_requested;
      r["waste_at_peak"] = o.waste_at_peak;
      r["num_alloc_retries"] = o.num_alloc_retries;
      r["num_device_alloc"] = o.num_device_alloc;
      r["device_allocs_recorded"] = o.device_allocs_recorded;
      r["min_capacity_bytes"] = o.min_capacity ? Json(*o.min_capacity) : Json(nullptr);
      if (&o == baseline) default_row = r;
      if (&o == recorded) recorded_row = r;
      rows.push_back(std::move(r));
    }
    j["ranked"] = std::move(rows);
    j["recommended"] = best.oom || !cannot_rank.empty() ? Json(nullptr) : Json(best.conf);
    j["cannot_rank"] = cannot_rank.empty() ? Json(nullptr) : Json(cannot_rank);
    j["default"] = std::move(default_row);
    j["recorded"] = std::move(recorded_row);
    j["notes"] = notes;
    out = j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  } else {
    const std::string capacity_text = CapacityText(options, unknown_devices);
    out += fmt::format(
        "fragscope tune: {} ({} request events) on {} ({} used by others), "
        "{} settings\n\n",
        TerminalSafe(flags.path), FormatCount(events.size()), capacity_text,
        FormatBytes(options.used_by_others_bytes), ranked.size());
    out += fmt::format("  {:>4}  {:<10}  {:>13}  {:>14}  {:>6}  {:>7}{}  {}\n", "rank", "result",
                       "peak reserved", "peak allocated", "waste", "retries",
                       flags.min_capacity ? "  min capacity" : "", "PYTORCH_CUDA_ALLOC_CONF");
    const std::size_t shown = flags.rows == 0 ? ranked.size() : std::min(flags.rows, ranked.size());
    std::size_t printed = 0;  // the first `shown`, then the defaults' and recorded rows
    for (std::size_t i = 0; i < ranked.size(); ++i) {
      const analysis::TuneOutcome& o = ranked[i];
      if (i >= shown && &o != baseline && &o != recorded) continue;
      ++printed;
      const std::string result =
          o.oom ? (o.oom_step >= 0 ? fmt::format("OOM step {}", o.oom_step) : std::string("OOM"))
                : std::string("fits");
      out += fmt::format("  {:>4}  {:<10}  {:>13}  {:>14}  {:>5.1f}%  {:>7}{}  {}{}\n", i + 1,
                         result, FormatBytes(o.peak_reserved), FormatBytes(o.peak_allocated),
                         100.0 * o.waste_at_peak, o.num_alloc_retries,
                         flags.min_capacity
                             ? fmt::format("  {:>12}", o.min_capacity ? FormatBytes(*o.min_capacity)
                                                                      : std::string("-"))
                             : std::string(),
                         ConfText(o.conf), &o == recorded ? "  (recorded)" : "");
    }
    if (printed < ranked.size()) {
      const std::size_t hidden = ranked.size() - printed;
      out += fmt::format("  ({} more setting{}; --rows 0 shows all, --json lists all)\n", hidden,
                         hidden == 1 ? "" : "s");
    }
    out += "\n";
    // How the best setting compares with `other`, named `name` ("the defaults").
    auto against = [&](const analysis::TuneOutcome& other, std::string_view name) {
      if (other.oom) {
        return fmt::format(
            "  {}{} run out of memory at request event {}{}; this setting fits, with a peak "
            "reserved of {}.\n",
            static_cast<char>(std::toupper(static_cast<unsigned char>(name[0]))), name.substr(1),
            FormatCount(other.oom_event),
            other.oom_step >= 0
                ? fmt::format(" (step {})", FormatCount(static_cast<std::uint64_t>(other.oom_step)))
                : std::string(),
            FormatBytes(best.peak_reserved));
      }
      if (best.min_capacity && other.min_capacity && *best.min_capacity < *other.min_capacity) {
        return fmt::format("  Fits on a device of {}; {} need {}: {} more headroom on this one.\n",
                           FormatBytes(*best.min_capacity), name, FormatBytes(*other.min_capacity),
                           FormatBytes(*other.min_capacity - *best.min_capacity));
      }
      const std::uint64_t saved =
          other.peak_reserved > best.peak_reserved ? other.peak_reserved - best.peak_reserved : 0;
      return fmt::format("  Saves {} of peak reserved memory against {} ({} -> {}, {:.1f}%).\n",
                         FormatBytes(saved), name, FormatBytes(other.peak_reserved),
                         FormatBytes(best.peak_reserved),
                         other.peak_reserved == 0 ? 0.0
                                                  : 100.0 * static_cast<double>(saved) /
                                                        static_cast<double>(other.peak_reserved));
    };
    if (best.oom) {
      out += fmt::format(
          "  No setting avoids the out-of-memory error on {}: the job needs a "
          "larger device or less memory (smaller batch, shorter sequences){}.\n",
          capacity_text,
          flags.min_capacity ? "; the min capacity column says how large"
                             : std::string("; --min-capacity finds how large"));
    } else if (!cannot_rank.empty()) {
      out += fmt::format("  Recommended: none: {}.\n", TerminalSafe(cannot_rank));
    } else {
      out += fmt::format("  Recommended: PYTORCH_CUDA_ALLOC_CONF={}\n",
                         best.conf.empty() ? "\"\" (the defaults are best)" : best.conf);
      if (baseline != nullptr && baseline != &best) out += against(*baseline, "the defaults");
      if (recorded != nullptr && recorded != baseline && recorded != &best) {
        out += against(*recorded, "the recorded settings");
      }
    }
    for (const std::string& note : notes) out += fmt::format("  note: {}\n", TerminalSafe(note));
  }
  const int written = WriteReport(out, flags.json ? ReportForm::kJson : ReportForm::kText);
  if (written != kExitOk) return written;
  return best.oom ? kExitFailure : kExitOk;
}

}  // namespace

Command AddTuneCommand(CLI::App& app) {
  auto flags = std::make_shared<TuneFlags>();
  CLI::App* sub = app.add_subcommand("tune", std::string(kTuneDescription));
  sub->footer(std::string(kTuneFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("TRACE", flags->path,
                  "A request trace (JSON Lines) or a PyTorch memory snapshot; plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  sub->add_option("--capacity", flags->capacity,
                  "Device memory of the virtual GPU (required for a request trace; a snapshot's "
                  "recorded OOMs give it)")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Device memory used outside PyTorch: CUDA context, NCCL, other processes")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--setting", flags->settings,
                  "A PYTORCH_CUDA_ALLOC_CONF to try (repeat; replaces the default grid)")
      ->type_name("CONF");
  AddAddressesOption(*sub, &flags->addresses);
  AddTorchVersionOption(*sub, &flags->torch_version);
  sub->add_option("--threads", flags->threads, "Worker threads (0 = one per hardware thread)")
      ->type_name("N")
      ->check(IntegerAtLeast(0))
      ->capture_default_str();
  sub->add_option("--allocator", flags->allocator,
                  "Allocator model: pytorch (settings are PYTORCH_CUDA_ALLOC_CONF strings) or bfc "
                  "(TensorFlow / JAX; settings are --bfc-conf strings of `replay`)")
      ->type_name("NAME")
      ->check(CLI::IsMember({"pytorch", "bfc"}))
      ->default_val("pytorch");
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
