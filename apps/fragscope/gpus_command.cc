#include "gpus_command.h"

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_util.h"
#include "common/units.h"
#include "sources/gpu/gpu_info.h"
#include "sources/gpu/nvidia_procfs.h"
#include "sources/gpu/nvml_collector.h"

namespace fragscope::cli {
namespace {

struct GpusFlags {
  std::string nvml_lib;   // empty: libnvidia-ml.so.1, then libnvidia-ml.so
  std::string proc_root;  // empty: /proc/driver/nvidia
  bool json = false;
};

constexpr std::string_view kGpusDescription =
    "Show what this node knows about its GPUs: NVML and /proc/driver/nvidia";

constexpr std::string_view kGpusFooter =
    R"(Reads NVIDIA's management library (libnvidia-ml, loaded at run time: nothing to install
for fragscope itself) for each GPU's memory totals, BAR1, compute processes and MIG instances,
and /proc/driver/nvidia for the driver version, device minor, firmware and excluded GPUs; the
two are joined by GPU UUID. On a machine without an NVIDIA driver it says so and exits 0.

Neither source shows how PyTorch's caching allocator uses the memory it reserved (that is
what fragmentation is about): fragscope reads the allocator from inside the process.
docs/gpu-sources.md says what each source gives.

Examples:
  fragscope gpus
  fragscope gpus --json
  fragscope gpus --nvml-lib /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1
  fragscope gpus --proc-root /host/proc/driver/nvidia     # e.g. from inside a container

Exit status: 0 printed (also when NVML or /proc is unavailable); 2 a path given with
--nvml-lib or --proc-root cannot be opened, or bad usage; 1 stdout could not be written.)";

template <typename T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v.has_value() ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

// A text NVML or the driver's files did not give: null, never "" (docs/gpu-sources.md).
nlohmann::json TextOrNull(const std::string& v) {
  return v.empty() ? nlohmann::json(nullptr) : nlohmann::json(v);
}

nlohmann::json GpuJson(const gpu::GpuInfo& g) {
  nlohmann::json processes = nlohmann::json::array();
  for (const gpu::GpuProcess& p : g.processes) {
    processes.push_back({{"pid", p.pid},
                         {"used_memory_bytes", OrNull(p.used_memory_bytes)},
                         {"gpu_instance_id", OrNull(p.gpu_instance_id)},
                         {"compute_instance_id", OrNull(p.compute_instance_id)}});
  }
  nlohmann::json mig = nlohmann::json::array();
  for (const gpu::MigInstance& m : g.mig_instances) {
    mig.push_back({{"index", m.index},
                   {"uuid", TextOrNull(m.uuid)},
                   {"gpu_instance_id", OrNull(m.gpu_instance_id)},
                   {"compute_instance_id", OrNull(m.compute_instance_id)},
                   {"memory_total_bytes", OrNull(m.memory_total_bytes)},
                   {"memory_used_bytes", OrNull(m.memory_used_bytes)},
                   {"memory_free_bytes", OrNull(m.memory_free_bytes)}});
  }
  return {{"uuid", TextOrNull(g.uuid)},
          {"index", OrNull(g.index)},
          {"pci_bus_id", TextOrNull(g.pci_bus_id)},
          {"name", TextOrNull(g.name)},
          {"memory_total_bytes", OrNull(g.memory_total_bytes)},
          {"memory_used_bytes", OrNull(g.memory_used_bytes)},
          {"memory_free_bytes", OrNull(g.memory_free_bytes)},
          {"memory_reserved_bytes", OrNull(g.memory_reserved_bytes)},
          {"bar1_total_bytes", OrNull(g.bar1_total_bytes)},
          {"bar1_used_bytes", OrNull(g.bar1_used_bytes)},
          {"bar1_free_bytes", OrNull(g.bar1_free_bytes)},
          {"processes", processes},
          {"mig_enabled", g.mig_enabled},
          {"mig_instances", mig},
          {"model", TextOrNull(g.model)},
          {"device_minor", OrNull(g.device_minor)},
          {"firmware", TextOrNull(g.firmware)},
          {"excluded", OrNull(g.excluded)},
          {"bus_location", TextOrNull(g.bus_location)},
          {"video_bios", TextOrNull(g.video_bios)},
          {"bus_type", TextOrNull(g.bus_type)},
          {"irq", OrNull(g.irq)},
          {"dma_size", TextOrNull(g.dma_size)},
          {"dma_mask", TextOrNull(g.dma_mask)},
          {"from_nvml", g.from_nvml},
          {"from_procfs", g.from_procfs},
          {"errors", g.errors}};
}

std::string NodeJson(const gpu::NodeGpuInfo& node, const std::string& proc_root) {
  nlohmann::json gpus = nlohmann::json::array();
  for (const gpu::GpuInfo& g : node.gpus) gpus.push_back(GpuJson(g));
  nlohmann::json out = {{"nvml",
                         {{"available", node.nvml_unavailable_reason.empty()},
                          {"unavailable_reason", TextOrNull(node.nvml_unavailable_reason)},
                          {"library", TextOrNull(node.nvml_library)},
                          {"version", TextOrNull(node.nvml_version)}}},
                        {"procfs",
                         {{"root", proc_root},
                          {"available", node.procfs_unavailable_reason.empty()},
                          {"unavailable_reason", TextOrNull(node.procfs_unavailable_reason)}}},
                        {"driver_version", TextOrNull(node.driver_version)},
                        {"cuda_driver_version", OrNull(node.cuda_driver_version)},
                        {"errors", node.errors},
                        {"gpus", gpus}};
  // Strings come from a driver library and from files: never fail on bad UTF-8.
  return out.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

std::string Bytes(const std::optional<std::uint64_t>& v) {
  return v.has_value() ? FormatBytes(*v) : "?";
}

// Every string NVML, the driver's /proc files and the paths give is escaped as a field
// (common/terminal_text.h): a device name cannot drive the terminal.
std::string NodeText(const gpu::NodeGpuInfo& node) {
  const auto safe = [](std::string_view text) { return TerminalSafe(text); };
  std::string out;
  if (node.nvml_unavailable_reason.empty()) {
    out += fmt::format("NVML: {}", safe(node.nvml_library));
    if (!node.nvml_version.empty()) out += fmt::format(", NVML {}", safe(node.nvml_version));
    if (node.cuda_driver_version.has_value()) {
      out += fmt::format(", CUDA driver {}.{}", *node.cuda_driver_version / 1000,
                         *node.cuda_driver_version % 1000 / 10);
    }
    out += "\n";
  } else {
    out += fmt::format("NVML not available: {}\n", safe(node.nvml_unavailable_reason));
  }
  if (!node.procfs_unavailable_reason.empty()) {
    out += fmt::format("/proc/driver/nvidia not available: {}\n",
                       safe(node.procfs_unavailable_reason));
  }
  out += fmt::format("Driver: {}\n", node.driver_version.empty() ? "?" : safe(node.driver_version));
  for (const std::string& e : node.errors) out += fmt::format("error: {}\n", safe(e));
  out += fmt::format("GPUs: {}\n", node.gpus.size());

  for (const gpu::GpuInfo& g : node.gpus) {
    out += "\n";
    const std::string index = g.index.has_value() ? fmt::format("GPU {}", *g.index) : "GPU -";
    const char* sources = g.from_nvml && g.from_procfs ? "NVML + /proc"
                          : g.from_nvml                ? "NVML only"
                                                       : "/proc only";
    const std::string& name = g.name.empty() ? g.model : g.name;
    out += fmt::format("{}  {}  {}  {}  ({})\n", index, name.empty() ? "?" : safe(name),
                       g.uuid.empty() ? "(no UUID)" : safe(g.uuid),
                       safe(g.pci_bus_id.empty() ? g.bus_location : g.pci_bus_id), sources);
    if (g.memory_total_bytes.has_value() || g.memory_used_bytes.has_value()) {
      out += fmt::format("  memory     {} total, {} used, {} free", Bytes(g.memory_total_bytes),
                         Bytes(g.memory_used_bytes), Bytes(g.memory_free_bytes));
      if (g.memory_reserved_bytes.has_value()) {
        out += fmt::format(", {} reserved by the driver", FormatBytes(*g.memory_reserved_bytes));
      }
      out += "\n";
    }
    if (g.bar1_total_bytes.has_value()) {
      out += fmt::format("  BAR1       {} total, {} used, {} free\n", Bytes(g.bar1_total_bytes),
                         Bytes(g.bar1_used_bytes), Bytes(g.bar1_free_bytes));
    }
    if (g.from_nvml) {
      if (g.processes.empty()) {
        out += "  processes  none\n";
      } else {
        std::string list;
        for (const gpu::GpuProcess& p : g.processes) {
          if (!list.empty()) list += ", ";
          list += fmt::format("pid {} {}", p.pid,
                              p.used_memory_bytes.has_value() ? FormatBytes(*p.used_memory_bytes)
                                                              : "(memory not available)");
          if (p.gpu_instance_id.has_value()) {
            list += fmt::format(" [GI {}", *p.gpu_instance_id);
            if (p.compute_instance_id.has_value())
              list += fmt::format(" CI {}", *p.compute_instance_id);
            list += "]";
          }
        }
        out += fmt::format("  processes  {}\n", list);
      }
    }
    if (g.mig_enabled) {
      out += fmt::format("  MIG        enabled, {} instance(s)\n", g.mig_instances.size());
      for (const gpu::MigInstance& m : g.mig_instances) {
        out += fmt::format(
            "    MIG {}  {}  GI {} CI {}  {} total, {} used, {} free\n", m.index,
            m.uuid.empty() ? "(no UUID)" : safe(m.uuid),
            m.gpu_instance_id.has_value() ? std::to_string(*m.gpu_instance_id) : "?",
            m.compute_instance_id.has_value() ? std::to_string(*m.compute_instance_id) : "?",
            Bytes(m.memory_total_bytes), Bytes(m.memory_used_bytes), Bytes(m.memory_free_bytes));
      }
    }
    if (g.from_procfs) {
      std::string line;
      const auto add = [&line](const std::string& part) {
        if (part.empty()) return;
        if (!line.empty()) line += ", ";
        line += part;
      };
      if (!g.model.empty() && g.model != g.name) add(safe(g.model));
      if (g.device_minor.has_value()) add(fmt::format("minor {}", *g.device_minor));
      if (g.irq.has_value()) add(fmt::format("IRQ {}", *g.irq));
      if (!g.firmware.empty()) add("firmware " + safe(g.firmware));
      if (!g.video_bios.empty()) add("video BIOS " + safe(g.video_bios));
      if (g.excluded.has_value()) add(*g.excluded ? "EXCLUDED" : "not excluded");
      if (!line.empty()) out += fmt::format("  /proc      {}\n", line);
    }
    for (const std::string& e : g.errors) out += fmt::format("  error      {}\n", safe(e));
  }
  return out;
}

int RunGpus(const GpusFlags& flags) {
  gpu::NvmlOptions nvml_options;
  if (!flags.nvml_lib.empty()) nvml_options.library_paths = {flags.nvml_lib};
  gpu::NodeGpuInfo nvml;
  Result<std::unique_ptr<gpu::NvmlCollector>> collector = gpu::NvmlCollector::Open(nvml_options);
  if (!collector.ok()) {
    if (!flags.nvml_lib.empty() && collector.status().code() == StatusCode::kNotFound) {
      return BadInput(fmt::format("--nvml-lib: {}", collector.status().message()));
    }
    nvml.nvml_unavailable_reason = collector.status().message();
  } else {
    Result<gpu::NodeGpuInfo> collected = (*collector)->Collect();
    if (collected.ok()) {
      nvml = std::move(collected).value();
    } else {
      nvml.nvml_library = (*collector)->library();
      nvml.nvml_unavailable_reason = collected.status().message();
    }
  }

  gpu::ProcfsOptions procfs_options;
  if (!flags.proc_root.empty()) procfs_options.root = flags.proc_root;
  gpu::NodeGpuInfo procfs;
  Result<gpu::NodeGpuInfo> read = gpu::ReadNvidiaProcfs(procfs_options);
  if (read.ok()) {
    procfs = std::move(read).value();
  } else if (!flags.proc_root.empty()) {
    return BadInput(fmt::format("--proc-root: {}", read.status().message()));
  } else {
    procfs.procfs_unavailable_reason = read.status().message();
  }

  const gpu::NodeGpuInfo node = gpu::JoinGpuInfo(std::move(nvml), std::move(procfs));
  if (flags.json) return WriteReport(NodeJson(node, procfs_options.root), ReportForm::kJson);
  return WriteReport(NodeText(node), ReportForm::kText);
}

}  // namespace

Command AddGpusCommand(CLI::App& app) {
  auto flags = std::make_shared<GpusFlags>();
  CLI::App* sub = app.add_subcommand("gpus", std::string(kGpusDescription));
  sub->footer(std::string(kGpusFooter));
  sub->add_option("--nvml-lib", flags->nvml_lib,
                  "The NVML library to load (default: libnvidia-ml.so.1, then libnvidia-ml.so)")
      ->type_name("PATH");
  sub->add_option("--proc-root", flags->proc_root,
                  "The NVIDIA driver's proc folder (default: /proc/driver/nvidia)")
      ->type_name("DIR");
  sub->add_flag("--json", flags->json, "Print JSON instead of text (unknown values are null)");
  return Command{sub, [flags] { return RunGpus(*flags); }};
}

}  // namespace fragscope::cli
