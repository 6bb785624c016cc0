#include "sources/gpu/nvidia_procfs.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace fragscope::gpu {
namespace {

namespace fs = std::filesystem;

std::string_view Trim(std::string_view s) {
  const auto space = [](char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\v'; };
  while (!s.empty() && space(s.front())) s.remove_prefix(1);
  while (!s.empty() && space(s.back())) s.remove_suffix(1);
  return s;
}

bool IsPrintable(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) {
    const auto u = static_cast<unsigned char>(c);
    return u >= 0x20 && u != 0x7f;  // UTF-8 continuation bytes (>= 0x80) are fine
  });
}

// Reads at most `max_bytes` of `path` (files under /proc report size 0, so read until EOF).
Result<std::string> ReadBounded(const std::string& path, std::size_t max_bytes) {
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  std::unique_ptr<std::FILE, Closer> file(std::fopen(path.c_str(), "rb"));
  if (!file) {
    const int err = errno;
    std::string msg = fmt::format("{}: cannot open: {}", path, std::strerror(err));
    if (err == ENOENT) return Status::NotFound(std::move(msg));
    return Status::IoError(std::move(msg));
  }
  std::string data;
  char buffer[4096];
  while (true) {
    const std::size_t n = std::fread(buffer, 1, sizeof buffer, file.get());
    if (n > 0) {
      if (data.size() + n > max_bytes) {
        return Status::LimitExceeded(
            fmt::format("{}: larger than the limit of {} bytes", path, max_bytes));
      }
      data.append(buffer, n);
    }
    if (n < sizeof buffer) {
      if (std::ferror(file.get()) != 0) {
        return Status::IoError(fmt::format("{}: read error after {} bytes: {}", path, data.size(),
                                           std::strerror(errno)));
      }
      break;
    }
  }
  return data;
}

bool EqualsIgnoreCase(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto lower = [](char c) {
      return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c;
    };
    if (lower(a[i]) != lower(b[i])) return false;
  }
  return true;
}

// "0000:3b:00.0" (the file's form) -> "00000000:3B:00.0" (NVML's), or "" if it does not parse.
std::string NvmlBusId(std::string_view location) {
  unsigned domain = 0, bus = 0, device = 0, function = 0;
  const std::string s(location);
  char tail = 0;
  if (std::sscanf(s.c_str(), "%x:%x:%x.%x%c", &domain, &bus, &device, &function, &tail) != 4) {
    return "";
  }
  if (bus > 0xff || device > 0x1f || function > 7) return "";
  return fmt::format("{:08X}:{:02X}:{:02X}.{:X}", domain, bus, device, function);
}

}  // namespace

std::string ParseDriverVersion(std::string_view text) {
  // "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023"
  // (open kernel modules write "NVIDIA UNIX Open Kernel Module for x86_64"): the first word
  // after the colon made of digits and dots with at least one dot.
  while (!text.empty()) {
    const std::size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    constexpr std::string_view kKey = "NVRM version:";
    if (line.substr(0, kKey.size()) != kKey) continue;
    std::string_view rest = line.substr(kKey.size());
    while (!rest.empty()) {
      rest = Trim(rest);
      const std::size_t end = rest.find_first_of(" \t");
      const std::string_view word = rest.substr(0, end);
      const bool version = !word.empty() && word.find('.') != std::string_view::npos &&
                           word.find_first_not_of("0123456789.") == std::string_view::npos &&
                           word.front() != '.';
      if (version) return std::string(word);
      if (end == std::string_view::npos) break;
      rest = rest.substr(end);
    }
    return "";
  }
  return "";
}

GpuInfo ParseGpuInformation(std::string_view text, const std::string& path) {
  GpuInfo gpu;
  gpu.from_procfs = true;
  std::size_t line_no = 0;
  while (!text.empty()) {
    ++line_no;
    const std::size_t eol = text.find('\n');
    const std::string_view line = text.substr(0, eol);
    text = eol == std::string_view::npos ? std::string_view() : text.substr(eol + 1);
    const std::size_t colon = line.find(':');
    if (colon == std::string_view::npos) continue;  // not a "Key: value" line: ignored
    const std::string_view key = Trim(line.substr(0, colon));
    const std::string_view value = Trim(line.substr(colon + 1));
    const auto bad = [&](std::string_view why) {
      gpu.errors.push_back(fmt::format("{}:{}: {}: {}", path, line_no, key, why));
    };
    const auto text_field = [&](std::string* field) {
      if (!IsPrintable(value)) {
        bad("value has control characters");
      } else {
        *field = std::string(value);
      }
    };
    const auto number_field = [&](std::optional<std::uint32_t>* field) {
      std::uint32_t v = 0;
      const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
      if (value.empty() || ec != std::errc() || end != value.data() + value.size()) {
        bad(fmt::format("'{}' is not a number", IsPrintable(value) ? value : "(binary)"));
      } else {
        *field = v;
      }
    };
    if (key == "Model") {
      text_field(&gpu.model);
    } else if (key == "IRQ") {
      number_field(&gpu.irq);
    } else if (key == "GPU UUID") {
      if (value.substr(0, 4) != "GPU-" || !IsPrintable(value) ||
          value.find_first_of(" \t") != std::string_view::npos) {
        bad(IsPrintable(value) ? fmt::format("'{}' is not a GPU UUID (GPU-…)", value)
                               : std::string("value has control characters"));
      } else {
        gpu.uuid = std::string(value);
      }
    } else if (key == "Video BIOS") {
      text_field(&gpu.video_bios);
    } else if (key == "Bus Type") {
      text_field(&gpu.bus_type);
    } else if (key == "DMA Size") {
      text_field(&gpu.dma_size);
    } else if (key == "DMA Mask") {
      text_field(&gpu.dma_mask);
    } else if (key == "Bus Location") {
      text_field(&gpu.bus_location);
    } else if (key == "Device Minor") {
      number_field(&gpu.device_minor);
    } else if (key == "GPU Excluded") {
      if (value == "Yes") {
        gpu.excluded = true;
      } else if (value == "No") {
        gpu.excluded = false;
      } else {
        bad(IsPrintable(value) ? fmt::format("'{}' is neither Yes nor No", value)
                               : std::string("value has control characters"));
      }
    } else if (key == "GPU Firmware") {
      text_field(&gpu.firmware);
    }
    // Any other key: a line a newer driver added; ignored.
  }
  if (!gpu.bus_location.empty()) gpu.pci_bus_id = NvmlBusId(gpu.bus_location);
  return gpu;
}

Result<NodeGpuInfo> ReadNvidiaProcfs(const ProcfsOptions& options) {
  std::error_code ec;
  const fs::file_status st = fs::status(options.root, ec);
  if (st.type() == fs::file_type::not_found) {
    return Status::NotFound(
        fmt::format("{}: no such directory (is the NVIDIA kernel module loaded?)", options.root));
  }
  if (ec) return Status::NotFound(fmt::format("{}: {}", options.root, ec.message()));
  if (st.type() != fs::file_type::directory) {
    return Status::NotFound(fmt::format("{}: not a directory", options.root));
  }
  NodeGpuInfo node;
  const std::string version_path = options.root + "/version";
  Result<std::string> version = ReadBounded(version_path, options.max_file_bytes);
  if (!version.ok()) {
    node.errors.push_back(version.status().message());
  } else {
    node.driver_version = ParseDriverVersion(*version);
    if (node.driver_version.empty()) {
      node.errors.push_back(
          fmt::format("{}: no driver version on an 'NVRM version:' line", version_path));
    }
  }

  const std::string gpus_dir = options.root + "/gpus";
  if (!fs::exists(gpus_dir, ec)) return node;  // a driver without GPUs has no gpus/
  std::vector<std::string> names;
  fs::directory_iterator it(gpus_dir, ec);
  if (ec) {
    node.errors.push_back(fmt::format("{}: cannot list: {}", gpus_dir, ec.message()));
    return node;
  }
  for (; it != fs::directory_iterator(); it.increment(ec)) {
    if (names.size() == options.max_gpus) {
      node.errors.push_back(fmt::format("{}: more than {} entries; the rest are not read", gpus_dir,
                                        options.max_gpus));
      break;
    }
    names.push_back(it->path().filename().string());
  }
  if (ec) node.errors.push_back(fmt::format("{}: cannot list: {}", gpus_dir, ec.message()));
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    const std::string path = gpus_dir + "/" + name + "/information";
    Result<std::string> text = ReadBounded(path, options.max_file_bytes);
    GpuInfo gpu;
    if (text.ok()) {
      gpu = ParseGpuInformation(*text, path);
    } else {
      gpu.from_procfs = true;
      gpu.errors.push_back(text.status().message());
    }
    if (gpu.bus_location.empty() && IsPrintable(name)) {
      gpu.bus_location = name;  // the folder is named after it
      gpu.pci_bus_id = NvmlBusId(name);
    }
    node.gpus.push_back(std::move(gpu));
  }
  return node;
}

NodeGpuInfo JoinGpuInfo(NodeGpuInfo nvml, NodeGpuInfo procfs) {
  NodeGpuInfo node = std::move(nvml);
  if (node.driver_version.empty()) node.driver_version = procfs.driver_version;
  node.procfs_unavailable_reason = std::move(procfs.procfs_unavailable_reason);
  for (std::string& e : procfs.errors) node.errors.push_back(std::move(e));

  std::vector<bool> used(procfs.gpus.size(), false);
  for (GpuInfo& gpu : node.gpus) {
    if (gpu.uuid.empty()) continue;
    for (std::size_t i = 0; i < procfs.gpus.size(); ++i) {
      GpuInfo& p = procfs.gpus[i];
      if (used[i] || p.uuid.empty() || !EqualsIgnoreCase(p.uuid, gpu.uuid)) continue;
      used[i] = true;
      gpu.from_procfs = true;
      gpu.model = std::move(p.model);
      gpu.device_minor = p.device_minor;
      gpu.firmware = std::move(p.firmware);
      gpu.excluded = p.excluded;
      gpu.bus_location = std::move(p.bus_location);
      gpu.video_bios = std::move(p.video_bios);
      gpu.bus_type = std::move(p.bus_type);
      gpu.irq = p.irq;
      gpu.dma_size = std::move(p.dma_size);
      gpu.dma_mask = std::move(p.dma_mask);
      if (gpu.pci_bus_id.empty()) gpu.pci_bus_id = std::move(p.pci_bus_id);
      for (std::string& e : p.errors) gpu.errors.push_back(std::move(e));
      break;
    }
  }
  for (std::size_t i = 0; i < procfs.gpus.size(); ++i) {
    if (!used[i]) node.gpus.push_back(std::move(procfs.gpus[i]));
  }
  return node;
}

}  // namespace fragscope::gpu
