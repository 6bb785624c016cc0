#include "replay_command.h"

#include <memory>
#include <optional>
#include <string>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "cli_util.h"
#include "common/units.h"
#include "sinks/report/replay_report.h"

namespace fragscope::cli {
namespace {

struct ReplayFlags {
  std::string path;
  std::string capacity;                   // size; empty: from the trace header
  std::string used_by_others;             // size; empty: from the trace header, else 0
  std::optional<std::string> alloc_conf;  // unset: the header's allocator_settings
  std::string allocator = "pytorch";      // or "bfc"
  std::optional<std::string> bfc_conf;    // --allocator bfc settings
  std::string torch_version = "newest";
  bool continue_after_oom = false;
  std::string emit;
  std::string addresses;  // empty: recorded for a snapshot
  unsigned threads = 0;
  ReportFlags report;
  bool forecast = false;
  analysis::ForecastOptions forecast_options;
};

constexpr std::string_view kReplayDescription =
    "Replay a request trace through the caching-allocator simulator on a virtual GPU";

constexpr std::string_view kReplayFooter =
    R"(Replays what the program asked for (a request trace: allocs and frees of tensors, plus
replay controls such as record_stream, empty_cache, set_memory_fraction) through a model of
PyTorch's CUDA caching allocator (docs/simulator.md) on a GPU of --capacity bytes, and reports:
whether it runs out of memory and where (request event, step) with the exact message PyTorch
would print; the simulator's memory_stats(); then the same analysis as `fragscope analyze` of
the allocator trace the simulation produced (peaks, fragmentation per step, memory map).

After an out-of-memory error the replay stops, as an uncaught torch.OutOfMemoryError ends a
job. With --continue-after-oom it goes on as if the program caught the error: the failed
tensor never exists and its later free is ignored.

TRACE may be a PyTorch memory snapshot: its recorded requests are replayed under the
allocator settings it recorded (--alloc-conf overrides) on an unlimited device (--capacity to
test a size), and the report compares the simulation with what the real allocator did: final
segments matched by layout and by size, reserved memory at the end and at its peak
(docs/snapshots.md). Its segments go where the real driver put them, as the file recorded, so
that free blocks of equal size in different segments are chosen in the recorded order; with
--addresses simulated the simulator places them by its own rule (docs/simulator.md).

--forecast runs the OOM forecaster (docs/forecast.md) over the simulated run's steps, as a
live agent would have: on a capacity that runs out of memory, it shows how many steps ahead
the warning would have come.

Sizes accept units: 80GiB, 40GB (decimal), 512MiB, 21.94GiB, "11.03 GiB", or plain bytes.
--alloc-conf takes any string PyTorch accepts, and a pasted PYTORCH_CUDA_ALLOC_CONF=... line.

Examples:
  fragscope replay trace.jsonl.gz --capacity 40GiB
  fragscope replay trace.jsonl.gz --capacity 16GiB --alloc-conf expandable_segments:True
  fragscope replay trace.jsonl.gz --capacity 24GiB --used-by-others 600MiB --json | jq .oom
  fragscope replay trace.jsonl.gz --capacity 24GiB --emit simulated.jsonl.zst
  fragscope replay trace.jsonl.gz --capacity 16GiB --forecast
  fragscope replay snapshot.pickle
  fragscope replay snapshot.pickle --json | jq .fidelity
  fragscope replay snapshot.pickle --capacity 40GiB --alloc-conf expandable_segments:True
  fragscope replay trace.jsonl --allocator bfc --capacity 16GiB --bfc-conf preallocate:true
  fragscope replay trace.jsonl --allocator bfc --bfc-conf memory_limit:12GiB,garbage_collection:true

--allocator bfc replays through a model of TensorFlow's and JAX's BFC allocator instead
(docs/simulator.md, "The BFC allocator model"); --bfc-conf takes its settings as
key:value pairs: allow_growth or preallocate, memory_limit, memory_fraction (of --capacity less
--used-by-others; default 1), garbage_collection, fragmentation_fraction, version (newest, 2.x,
0.x). Its memory_stats use JAX's names (bytes_in_use, peak_bytes_in_use, pool_bytes, ...).

Exit status: 0 if the trace fits, 1 if it runs out of memory, 2 for bad input or usage.)";

int RunReplay(const ReplayFlags& flags) {
  ReplayRequest request;
  request.path = flags.path;
  if (flags.allocator == "bfc") {
    Result<model::BfcSettings> bfc = model::ParseBfcSettings(flags.bfc_conf.value_or(""));
    if (!bfc.ok()) return BadInput("--bfc-conf: " + bfc.status().message());
    if (flags.alloc_conf) return BadInput("--alloc-conf sets PyTorch's allocator; use --bfc-conf");
    request.bfc = *bfc;
  } else if (flags.bfc_conf) {
    return BadInput("--bfc-conf needs --allocator bfc");
  }
  Result<std::optional<std::uint64_t>> capacity = OptionalCapacity("--capacity", flags.capacity);
  if (!capacity.ok()) return BadInput(capacity.status().message());
  Result<std::optional<std::uint64_t>> others =
      OptionalSize("--used-by-others", flags.used_by_others);
  if (!others.ok()) return BadInput(others.status().message());
  if (Status fits = CheckUsedByOthers(*capacity, *others); !fits.ok())
    return BadInput(fits.message());
  request.capacity = *capacity;
  request.used_by_others = *others;
  request.alloc_conf = flags.alloc_conf;
  request.version = TorchVersion(flags.torch_version);
  request.continue_after_oom = flags.continue_after_oom;
  request.emit = flags.emit;
  request.recorded_addresses = RecordedAddressesFlag(flags.addresses);
  request.threads = flags.threads;
  ApplyReportFlags(flags.report, &request.options);
  if (flags.forecast) {
    if (Status s = analysis::ValidateForecastOptions(flags.forecast_options); !s.ok()) {
      return BadInput("--forecast: " + s.message());
    }
    request.options.forecast = flags.forecast_options;
  }

  Result<ReplayRun> run = ReplayInput(request);
  if (!run.ok()) return BadInput(run.status().message());
  std::string out;
  ReportForm form = ReportForm::kJson;
  if (flags.report.json) {
    sinks::JsonOptions json;
    json.include_layout = !flags.report.no_map;
    out = sinks::RenderReplayJson(run->replay, run->result, json);
  } else {
    const sinks::TextOptions text = TextOptionsFor(flags.report);
    out = sinks::RenderReplayText(run->replay, run->result, text);
    form = TextForm(text.color);
  }
  const int written = WriteReport(out, form);
  if (written != kExitOk) return written;
  return run->replay.ooms.empty() ? kExitOk : kExitFailure;
}

}  // namespace

Command AddReplayCommand(CLI::App& app) {
  auto flags = std::make_shared<ReplayFlags>();
  CLI::App* sub = app.add_subcommand("replay", std::string(kReplayDescription));
  sub->footer(std::string(kReplayFooter));
  AddMaxInputBytesOption(*sub);
  sub->add_option("TRACE", flags->path,
                  "A request trace (JSON Lines) or a PyTorch memory snapshot; plain, .gz or .zst")
      ->type_name("PATH")
      ->required();
  sub->add_option("--capacity", flags->capacity,
                  "Device memory of the virtual GPU (required unless the header gives it)")
      ->type_name("SIZE")
      ->check(CapacitySize());
  sub->add_option("--used-by-others", flags->used_by_others,
                  "Device memory used outside PyTorch: CUDA context, NCCL, other processes")
      ->type_name("SIZE")
      ->check(ByteSize(0));
  sub->add_option("--alloc-conf", flags->alloc_conf,
                  "PYTORCH_CUDA_ALLOC_CONF to simulate (default: the trace header's settings)")
      ->type_name("STR");
  sub->add_option("--allocator", flags->allocator,
                  "Allocator model: pytorch (CUDA caching allocator) or bfc (TensorFlow / JAX)")
      ->type_name("NAME")
      ->check(CLI::IsMember({"pytorch", "bfc"}))
      ->default_val("pytorch");
  sub->add_option("--bfc-conf", flags->bfc_conf,
                  "BFC settings with --allocator bfc: allow_growth, preallocate, memory_limit, "
                  "memory_fraction, garbage_collection, fragmentation_fraction, version")
      ->type_name("STR");
  AddTorchVersionOption(*sub, &flags->torch_version);
  sub->add_flag("--continue-after-oom", flags->continue_after_oom,
                "Go on after an OOM as if the program caught it");
  sub->add_option("--emit", flags->emit,
                  "Also write the simulated allocator trace (.jsonl, .jsonl.gz, .jsonl.zst), "
                  "through a new temporary file renamed to OUT; a link to nothing is refused")
      ->type_name("OUT");
  AddAddressesOption(*sub, &flags->addresses);
  sub->add_option("--threads", flags->threads,
                  "2: analyze the simulated events on a second thread while simulating (same "
                  "report, sooner); 1: one thread; 0: 2 if the machine has 2+ hardware threads")
      ->type_name("N")
      ->default_val(0);
  AddReportOptions(*sub, &flags->report);
  AddForecastOptions(*sub, &flags->forecast, &flags->forecast_options);
  return Command{sub, [flags] { return RunReplay(*flags); }};
}

}  // namespace fragscope::cli
