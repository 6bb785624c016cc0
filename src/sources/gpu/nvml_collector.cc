#include "sources/gpu/nvml_collector.h"

#include <dlfcn.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <string_view>

#include <fmt/format.h>

namespace fragscope::gpu {
namespace {

// The part of NVML's C ABI that we use, declared from the documented interface (nvml.h is not
// needed to build). Return codes are a C enum, passed as int.
using NvmlReturn = int;
using NvmlDevice = void*;  // nvmlDevice_t: an opaque handle

constexpr NvmlReturn kSuccess = 0;
constexpr NvmlReturn kNotSupported = 3;
constexpr NvmlReturn kNotFound = 6;
constexpr NvmlReturn kInsufficientSize = 7;
constexpr NvmlReturn kFunctionNotFound = 13;
constexpr NvmlReturn kArgumentVersionMismatch = 25;
constexpr std::uint64_t kValueNotAvailable = ~0ULL;     // NVML_VALUE_NOT_AVAILABLE
constexpr std::uint32_t kInstanceIdNotAvailable = ~0U;  // gpuInstanceId outside MIG
constexpr unsigned kMigEnabled = 1;                     // NVML_DEVICE_MIG_ENABLE
constexpr unsigned kUuidBufferSize = 80;                // NVML_DEVICE_UUID_BUFFER_SIZE
constexpr unsigned kNameBufferSize = 96;                // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kVersionBufferSize = 80;             // NVML_SYSTEM_*_VERSION_BUFFER_SIZE
constexpr std::size_t kLargestProcessInfo = 32;         // the R535 record
constexpr std::uint32_t kPidMax = 4194304;              // Linux PID_MAX_LIMIT (2^22)
constexpr std::uint32_t kMaxMigDevices = 64;

struct NvmlMemoryV1 {  // nvmlMemory_t
  std::uint64_t total;
  std::uint64_t free;
  std::uint64_t used;
};
struct NvmlMemoryV2 {  // nvmlMemory_v2_t: versioned, adds `reserved`
  unsigned version;
  std::uint64_t total;
  std::uint64_t reserved;
  std::uint64_t free;
  std::uint64_t used;
};
struct NvmlBar1Memory {  // nvmlBAR1Memory_t
  std::uint64_t total;
  std::uint64_t free;
  std::uint64_t used;
};
struct NvmlPciInfoV1 {  // what the unversioned nvmlDeviceGetPciInfo fills
  char bus_id[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  unsigned reserved[4];
};
struct NvmlPciInfo {  // nvmlPciInfo_t as _v2 and _v3 fill it
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};
static_assert(sizeof(NvmlMemoryV2) == 40);
static_assert(sizeof(NvmlPciInfoV1) == 52);
static_assert(sizeof(NvmlPciInfo) == 68);
// NVML_STRUCT_VERSION(Memory, 2): the struct's size in the low bits, the version in the top byte.
constexpr unsigned kMemoryV2Version = static_cast<unsigned>(sizeof(NvmlMemoryV2)) | (2U << 24);

using InitFn = NvmlReturn (*)();
using ErrorStringFn = const char* (*)(NvmlReturn);
using CountFn = NvmlReturn (*)(unsigned*);
using HandleByIndexFn = NvmlReturn (*)(unsigned, NvmlDevice*);
using StringFn = NvmlReturn (*)(NvmlDevice, char*, unsigned);
using SystemStringFn = NvmlReturn (*)(char*, unsigned);
using IntFn = NvmlReturn (*)(int*);
using PciFn = NvmlReturn (*)(NvmlDevice, void*);
using MemoryV2Fn = NvmlReturn (*)(NvmlDevice, NvmlMemoryV2*);
using MemoryV1Fn = NvmlReturn (*)(NvmlDevice, NvmlMemoryV1*);
using Bar1Fn = NvmlReturn (*)(NvmlDevice, NvmlBar1Memory*);
using ProcessesFn = NvmlReturn (*)(NvmlDevice, unsigned*, void*);
using MigModeFn = NvmlReturn (*)(NvmlDevice, unsigned*, unsigned*);
using UintFn = NvmlReturn (*)(NvmlDevice, unsigned*);
using MigHandleFn = NvmlReturn (*)(NvmlDevice, unsigned, NvmlDevice*);

// A looked-up function: the pointer and the name that resolved (for messages).
template <typename Fn>
struct Sym {
  Fn fn = nullptr;
  const char* name = "";
  explicit operator bool() const { return fn != nullptr; }
};

// Fallback names when the library has no nvmlErrorString.
std::string_view CodeName(NvmlReturn code) {
  static constexpr std::array<std::string_view, 28> kNames = {
      "Success",
      "Uninitialized",
      "Invalid Argument",
      "Not Supported",
      "Insufficient Permissions",
      "Already Initialized",
      "Not Found",
      "Insufficient Size",
      "Insufficient External Power",
      "Driver Not Loaded",
      "Timeout",
      "Interrupt issue",
      "NVML Shared Library Not Found",
      "Function Not Found",
      "Corrupted infoROM",
      "GPU is lost",
      "GPU requires restart",
      "The operating system has blocked the request",
      "RM has detected an NVML/RM version mismatch",
      "In use by another client",
      "Insufficient Memory",
      "No data",
      "The requested vgpu operation is not available",
      "Insufficient resources",
      "Unsupported frequency",
      "Argument version mismatch",
      "Deprecated",
      "Not ready"};
  if (code >= 0 && static_cast<std::size_t>(code) < kNames.size()) {
    return kNames[static_cast<std::size_t>(code)];
  }
  return "Unknown Error";
}

std::string FromBuffer(const char* buffer, std::size_t size) {
  return std::string(buffer, strnlen(buffer, size));
}

std::uint32_t NvmlLoadU32(const unsigned char* p) {
  std::uint32_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
std::uint64_t LoadU64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

std::optional<std::uint64_t> Known(std::uint64_t value) {
  if (value == kValueNotAvailable) return std::nullopt;
  return value;
}

}  // namespace

// The loaded library and every function we looked up in it.
class NvmlLibrary {
 public:
  explicit NvmlLibrary(void* handle) : handle_(handle) {}
  ~NvmlLibrary() {
    if (handle_ != nullptr) dlclose(handle_);
  }
  NvmlLibrary(const NvmlLibrary&) = delete;
  NvmlLibrary& operator=(const NvmlLibrary&) = delete;

  // The first of `names` the library exports. `what` is the function's family name, recorded
  // for ResolvedSymbols().
  template <typename Fn>
  Sym<Fn> Find(const char* what, std::initializer_list<const char*> names) {
    Sym<Fn> sym;
    for (const char* candidate : names) {
      void* p = dlsym(handle_, candidate);
      if (p == nullptr) continue;
      static_assert(sizeof(Fn) == sizeof(void*));
      std::memcpy(&sym.fn, &p, sizeof p);  // object to function pointer, as POSIX allows
      sym.name = candidate;
      break;
    }
    resolved_.emplace_back(what, sym.name);
    return sym;
  }

  void Resolve() {
    init = Find<InitFn>("nvmlInit", {"nvmlInit_v2", "nvmlInit"});
    shutdown = Find<InitFn>("nvmlShutdown", {"nvmlShutdown"});
    error_string = Find<ErrorStringFn>("nvmlErrorString", {"nvmlErrorString"});
    count = Find<CountFn>("nvmlDeviceGetCount", {"nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"});
    handle_by_index =
        Find<HandleByIndexFn>("nvmlDeviceGetHandleByIndex",
                              {"nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByIndex"});
    uuid = Find<StringFn>("nvmlDeviceGetUUID", {"nvmlDeviceGetUUID"});
    name = Find<StringFn>("nvmlDeviceGetName", {"nvmlDeviceGetName"});
    pci =
        Find<PciFn>("nvmlDeviceGetPciInfo", {"nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"});
    pci_v1 = Find<PciFn>("nvmlDeviceGetPciInfo (v1)", {"nvmlDeviceGetPciInfo"});
    memory_v2 = Find<MemoryV2Fn>("nvmlDeviceGetMemoryInfo", {"nvmlDeviceGetMemoryInfo_v2"});
    memory_v1 = Find<MemoryV1Fn>("nvmlDeviceGetMemoryInfo (v1)", {"nvmlDeviceGetMemoryInfo"});
    bar1 = Find<Bar1Fn>("nvmlDeviceGetBAR1MemoryInfo", {"nvmlDeviceGetBAR1MemoryInfo"});
    processes = Find<ProcessesFn>(
        "nvmlDeviceGetComputeRunningProcesses",
        {"nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetComputeRunningProcesses_v2",
         "nvmlDeviceGetComputeRunningProcesses"});
    mig_mode = Find<MigModeFn>("nvmlDeviceGetMigMode", {"nvmlDeviceGetMigMode"});
    max_mig = Find<UintFn>("nvmlDeviceGetMaxMigDeviceCount", {"nvmlDeviceGetMaxMigDeviceCount"});
    mig_handle = Find<MigHandleFn>("nvmlDeviceGetMigDeviceHandleByIndex",
                                   {"nvmlDeviceGetMigDeviceHandleByIndex"});
    gpu_instance_id = Find<UintFn>("nvmlDeviceGetGpuInstanceId", {"nvmlDeviceGetGpuInstanceId"});
    compute_instance_id =
        Find<UintFn>("nvmlDeviceGetComputeInstanceId", {"nvmlDeviceGetComputeInstanceId"});
    driver_version =
        Find<SystemStringFn>("nvmlSystemGetDriverVersion", {"nvmlSystemGetDriverVersion"});
    nvml_version = Find<SystemStringFn>("nvmlSystemGetNVMLVersion", {"nvmlSystemGetNVMLVersion"});
    cuda_version =
        Find<IntFn>("nvmlSystemGetCudaDriverVersion",
                    {"nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"});
  }

  Sym<InitFn> init, shutdown;
  Sym<ErrorStringFn> error_string;
  Sym<CountFn> count;
  Sym<HandleByIndexFn> handle_by_index;
  Sym<StringFn> uuid, name;
  Sym<PciFn> pci, pci_v1;
  Sym<MemoryV2Fn> memory_v2;
  Sym<MemoryV1Fn> memory_v1;
  Sym<Bar1Fn> bar1;
  Sym<ProcessesFn> processes;
  Sym<MigModeFn> mig_mode;
  Sym<UintFn> max_mig, gpu_instance_id, compute_instance_id;
  Sym<MigHandleFn> mig_handle;
  Sym<SystemStringFn> driver_version, nvml_version;
  Sym<IntFn> cuda_version;
  bool initialized = false;

  const std::vector<std::pair<std::string, std::string>>& resolved() const { return resolved_; }

  std::string ErrorText(NvmlReturn code) const {
    std::string text;
    if (error_string) {
      const char* s = error_string.fn(code);
      if (s != nullptr) text = FromBuffer(s, 256);
    }
    if (text.empty()) text = std::string(CodeName(code));
    return fmt::format("{} (code {})", text, code);
  }

 private:
  void* handle_;
  std::vector<std::pair<std::string, std::string>> resolved_;
};

namespace {

// Memory of a GPU or MIG device: v2 first (it has `reserved`), v1 when v2 is absent or the
// driver answers that it does not implement it (R510.39 returned FUNCTION_NOT_FOUND).
struct MemoryReading {
  std::optional<std::uint64_t> total, used, free, reserved;
};
NvmlReturn ReadMemory(NvmlLibrary& lib, NvmlDevice device, MemoryReading* out,
                      const char** called) {
  NvmlReturn rc = kFunctionNotFound;
  if (lib.memory_v2) {
    NvmlMemoryV2 m{};
    m.version = kMemoryV2Version;
    *called = lib.memory_v2.name;
    rc = lib.memory_v2.fn(device, &m);
    if (rc == kSuccess) {
      *out = {m.total, m.used, m.free, m.reserved};
      return rc;
    }
    if (rc != kFunctionNotFound && rc != kArgumentVersionMismatch) return rc;
  }
  if (lib.memory_v1) {
    NvmlMemoryV1 m{};
    *called = lib.memory_v1.name;
    rc = lib.memory_v1.fn(device, &m);
    if (rc == kSuccess) *out = {m.total, m.used, m.free, std::nullopt};
  }
  return rc;
}

}  // namespace

std::size_t InferProcessInfoStride(const unsigned char* buffer, std::size_t buffer_size,
                                   std::uint32_t count, unsigned char sentinel) {
  if (count == 0) return 0;
  // How far the library wrote: one past the last byte that is not the sentinel.
  std::size_t extent = buffer_size;
  while (extent > 0 && buffer[extent - 1] == sentinel) --extent;
  for (std::size_t stride : {std::size_t{16}, std::size_t{24}, std::size_t{32}}) {
    const std::size_t end = stride * count;
    // Every layout ends with an 8-byte field (usedGpuMemory, the two instance ids,
    // usedGpuCcProtectedMemory), so the last record's final 8 bytes are written: the extent
    // lies in (end - 8, end]. These windows do not overlap for different strides.
    if (end > buffer_size || extent > end || extent + 8 <= end) continue;
    bool plausible = true;
    for (std::uint32_t i = 0; i < count && plausible; ++i) {
      const std::uint32_t pid = NvmlLoadU32(buffer + i * stride);
      plausible = pid != 0 && pid <= kPidMax;
    }
    if (plausible) return stride;
  }
  return 0;
}

NvmlCollector::NvmlCollector(NvmlOptions options, std::unique_ptr<NvmlLibrary> lib,
                             std::string library)
    : options_(std::move(options)), lib_(std::move(lib)), library_(std::move(library)) {}

NvmlCollector::~NvmlCollector() {
  if (lib_ && lib_->initialized && lib_->shutdown) lib_->shutdown.fn();
}

Result<std::unique_ptr<NvmlCollector>> NvmlCollector::Open(const NvmlOptions& options) {
  if (options.library_paths.empty()) {
    return Status::InvalidArgument("NVML: no library path to try");
  }
  void* handle = nullptr;
  std::string tried;
  std::string loaded;
  for (const std::string& path : options.library_paths) {
    dlerror();
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle != nullptr) {
      loaded = path;
      break;
    }
    const char* why = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += why != nullptr ? std::string(why) : path + ": cannot be loaded";
  }
  if (handle == nullptr) return Status::NotFound(tried);

  auto lib = std::make_unique<NvmlLibrary>(handle);
  lib->Resolve();
  const std::pair<bool, const char*> mandatory[] = {
      {static_cast<bool>(lib->init), "nvmlInit_v2 or nvmlInit"},
      {static_cast<bool>(lib->shutdown), "nvmlShutdown"},
      {static_cast<bool>(lib->count), "nvmlDeviceGetCount_v2 or nvmlDeviceGetCount"},
      {static_cast<bool>(lib->handle_by_index),
       "nvmlDeviceGetHandleByIndex_v2 or nvmlDeviceGetHandleByIndex"},
      {static_cast<bool>(lib->uuid), "nvmlDeviceGetUUID"},
  };
  for (const auto& [present, name] : mandatory) {
    if (!present) {
      return Status::Unimplemented(
          fmt::format("{}: does not export {} (not a usable NVML library)", loaded, name));
    }
  }
  NvmlReturn rc = lib->init.fn();
  if (rc == kFunctionNotFound && std::string_view(lib->init.name) == "nvmlInit_v2") {
    if (void* p = dlsym(handle, "nvmlInit"); p != nullptr) {
      std::memcpy(&lib->init.fn, &p, sizeof p);
      lib->init.name = "nvmlInit";
      rc = lib->init.fn();
    }
  }
  if (rc != kSuccess) {
    return Status::Unimplemented(
        fmt::format("{}: {}: {}", loaded, lib->init.name, lib->ErrorText(rc)));
  }
  lib->initialized = true;
  return std::unique_ptr<NvmlCollector>(new NvmlCollector(options, std::move(lib), loaded));
}

std::vector<std::pair<std::string, std::string>> NvmlCollector::ResolvedSymbols() const {
  return lib_->resolved();
}

std::string NvmlCollector::Describe(const char* function, std::uint32_t index, int code) const {
  return fmt::format("{}(GPU {}): {}", function, index, lib_->ErrorText(code));
}

Result<NodeGpuInfo> NvmlCollector::Collect() {
  NvmlLibrary& lib = *lib_;
  NodeGpuInfo node;
  node.nvml_library = library_;
  char text[kVersionBufferSize + 1] = {};
  if (lib.driver_version) {
    const NvmlReturn rc = lib.driver_version.fn(text, kVersionBufferSize);
    if (rc == kSuccess) {
      node.driver_version = FromBuffer(text, kVersionBufferSize);
    } else if (rc != kNotSupported) {
      node.errors.push_back(fmt::format("{}: {}", lib.driver_version.name, lib.ErrorText(rc)));
    }
  }
  if (lib.nvml_version) {
    std::memset(text, 0, sizeof text);
    if (lib.nvml_version.fn(text, kVersionBufferSize) == kSuccess) {
      node.nvml_version = FromBuffer(text, kVersionBufferSize);
    }
  }
  if (lib.cuda_version) {
    int v = 0;
    if (lib.cuda_version.fn(&v) == kSuccess) node.cuda_driver_version = v;
  }

  unsigned count = 0;
  NvmlReturn rc = lib.count.fn(&count);
  if (rc != kSuccess) {
    return Status::IoError(fmt::format("{}: {}", lib.count.name, lib.ErrorText(rc)));
  }
  if (count > options_.max_gpus) {
    return Status::Corruption(fmt::format("{}: {} GPUs, more than the limit of {}", lib.count.name,
                                          count, options_.max_gpus));
  }
  for (unsigned i = 0; i < count; ++i) {
    NvmlDevice device = nullptr;
    rc = lib.handle_by_index.fn(i, &device);
    if (rc != kSuccess) {
      return Status::IoError(Describe(lib.handle_by_index.name, i, rc));
    }
    GpuInfo gpu;
    CollectGpu(i, device, &gpu);
    node.gpus.push_back(std::move(gpu));
  }
  return node;
}

void NvmlCollector::CollectGpu(std::uint32_t index, void* device, GpuInfo* gpu) {
  NvmlLibrary& lib = *lib_;
  gpu->from_nvml = true;
  gpu->index = index;
  // Records a refused call; "not supported" only leaves the field unknown.
  auto refused = [&](const char* function, NvmlReturn rc) {
    if (rc != kNotSupported) gpu->errors.push_back(Describe(function, index, rc));
  };

  char uuid[kUuidBufferSize + 1] = {};
  NvmlReturn rc = lib.uuid.fn(device, uuid, kUuidBufferSize);
  if (rc == kSuccess) {
    gpu->uuid = FromBuffer(uuid, kUuidBufferSize);
  } else {
    refused(lib.uuid.name, rc);
  }
  if (lib.name) {
    char name[kNameBufferSize + 1] = {};
    rc = lib.name.fn(device, name, kNameBufferSize);
    if (rc == kSuccess) {
      gpu->name = FromBuffer(name, kNameBufferSize);
    } else {
      refused(lib.name.name, rc);
    }
  }
  if (lib.pci) {
    NvmlPciInfo pci{};
    rc = lib.pci.fn(device, &pci);
    if (rc == kSuccess) {
      gpu->pci_bus_id = FromBuffer(pci.bus_id, sizeof pci.bus_id);
    } else {
      refused(lib.pci.name, rc);
    }
  } else if (lib.pci_v1) {
    NvmlPciInfoV1 pci{};
    rc = lib.pci_v1.fn(device, &pci);
    if (rc == kSuccess) {
      gpu->pci_bus_id = FromBuffer(pci.bus_id, sizeof pci.bus_id);
    } else {
      refused(lib.pci_v1.name, rc);
    }
  }

  MemoryReading memory;
  const char* called = "nvmlDeviceGetMemoryInfo";
  rc = ReadMemory(lib, device, &memory, &called);
  if (rc == kSuccess) {
    gpu->memory_total_bytes = memory.total;
    gpu->memory_used_bytes = memory.used;
    gpu->memory_free_bytes = memory.free;
    gpu->memory_reserved_bytes = memory.reserved;
  } else if (lib.memory_v1 || lib.memory_v2) {
    refused(called, rc);
  }

  if (lib.bar1) {
    NvmlBar1Memory bar1{};
    rc = lib.bar1.fn(device, &bar1);
    if (rc == kSuccess) {
      gpu->bar1_total_bytes = bar1.total;
      gpu->bar1_used_bytes = bar1.used;
      gpu->bar1_free_bytes = bar1.free;
    } else {
      refused(lib.bar1.name, rc);
    }
  }

  CollectProcesses(index, device, gpu);
  CollectMig(index, device, gpu);
}

void NvmlCollector::CollectProcesses(std::uint32_t index, void* device, GpuInfo* gpu) {
  NvmlLibrary& lib = *lib_;
  if (!lib.processes) return;
  const char* fn_name = lib.processes.name;
  // Ask for the count first (a null buffer with room for 0 entries).
  unsigned needed = 0;
  NvmlReturn rc = lib.processes.fn(device, &needed, nullptr);
  if (rc == kSuccess) return;  // no processes
  if (rc != kInsufficientSize) {
    if (rc != kNotSupported) gpu->errors.push_back(Describe(fn_name, index, rc));
    return;
  }
  // Read into room for the largest record, filled with a sentinel, so the stride the library
  // really used can be seen afterwards (docs/gpu-sources.md). Processes may start between the
  // two calls: some slack, and a few tries.
  constexpr std::array<unsigned char, 2> kSentinels = {0xA5, 0x5A};
  for (int attempt = 0; attempt < 4; ++attempt) {
    if (needed > options_.max_processes) {
      gpu->errors.push_back(fmt::format("{}(GPU {}): {} processes, more than the limit of {}",
                                        fn_name, index, needed, options_.max_processes));
      return;
    }
    const unsigned capacity = std::min<unsigned>(needed + 8, options_.max_processes);
    const unsigned char sentinel = kSentinels[static_cast<std::size_t>(attempt) % 2];
    process_buffer_.assign(std::size_t{capacity} * kLargestProcessInfo, sentinel);
    unsigned n = capacity;
    rc = lib.processes.fn(device, &n, process_buffer_.data());
    if (rc == kInsufficientSize) {
      needed = std::max(n, needed + 1);
      continue;
    }
    if (rc != kSuccess) {
      gpu->errors.push_back(Describe(fn_name, index, rc));
      return;
    }
    if (n == 0) return;
    if (n > capacity) {
      gpu->errors.push_back(fmt::format("{}(GPU {}): returned {} entries into room for {}", fn_name,
                                        index, n, capacity));
      return;
    }
    const std::size_t stride =
        InferProcessInfoStride(process_buffer_.data(), process_buffer_.size(), n, sentinel);
    if (stride == 0) {
      // A record that happened to end in sentinel bytes: the next try uses the other one.
      needed = n;
      continue;
    }
    process_info_stride_ = stride;
    for (unsigned i = 0; i < n; ++i) {
      const unsigned char* p = process_buffer_.data() + std::size_t{i} * stride;
      GpuProcess process;
      process.pid = NvmlLoadU32(p);
      process.used_memory_bytes = Known(LoadU64(p + 8));
      if (stride >= 24) {
        const std::uint32_t gi = NvmlLoadU32(p + 16);
        const std::uint32_t ci = NvmlLoadU32(p + 20);
        if (gi != kInstanceIdNotAvailable) process.gpu_instance_id = gi;
        if (ci != kInstanceIdNotAvailable) process.compute_instance_id = ci;
      }
      gpu->processes.push_back(process);
    }
    return;
  }
  gpu->errors.push_back(fmt::format(
      "{}(GPU {}): cannot tell the process record size (16, 24 or 32 bytes) from what it wrote, "
      "or the process list kept changing",
      fn_name, index));
}

void NvmlCollector::CollectMig(std::uint32_t index, void* device, GpuInfo* gpu) {
  NvmlLibrary& lib = *lib_;
  if (!lib.mig_mode) return;
  unsigned current = 0;
  unsigned pending = 0;
  NvmlReturn rc = lib.mig_mode.fn(device, &current, &pending);
  if (rc != kSuccess) {
    if (rc != kNotSupported) gpu->errors.push_back(Describe(lib.mig_mode.name, index, rc));
    return;
  }
  gpu->mig_enabled = current == kMigEnabled;
  if (!gpu->mig_enabled || !lib.max_mig || !lib.mig_handle) return;
  unsigned max = 0;
  rc = lib.max_mig.fn(device, &max);
  if (rc != kSuccess) {
    gpu->errors.push_back(Describe(lib.max_mig.name, index, rc));
    return;
  }
  max = std::min(max, kMaxMigDevices);
  for (unsigned m = 0; m < max; ++m) {
    NvmlDevice mig = nullptr;
    rc = lib.mig_handle.fn(device, m, &mig);
    if (rc == kNotFound) continue;  // an empty slot
    if (rc != kSuccess) {
      gpu->errors.push_back(
          fmt::format("{}(GPU {}, MIG {}): {}", lib.mig_handle.name, index, m, lib.ErrorText(rc)));
      continue;
    }
    MigInstance instance;
    instance.index = m;
    char uuid[kUuidBufferSize + 1] = {};
    rc = lib.uuid.fn(mig, uuid, kUuidBufferSize);
    if (rc == kSuccess) {
      instance.uuid = FromBuffer(uuid, kUuidBufferSize);
    } else {
      gpu->errors.push_back(
          fmt::format("{}(GPU {}, MIG {}): {}", lib.uuid.name, index, m, lib.ErrorText(rc)));
    }
    unsigned id = 0;
    if (lib.gpu_instance_id && lib.gpu_instance_id.fn(mig, &id) == kSuccess) {
      instance.gpu_instance_id = id;
    }
    if (lib.compute_instance_id && lib.compute_instance_id.fn(mig, &id) == kSuccess) {
      instance.compute_instance_id = id;
    }
    MemoryReading memory;
    const char* called = "nvmlDeviceGetMemoryInfo";
    rc = ReadMemory(lib, mig, &memory, &called);
    if (rc == kSuccess) {
      instance.memory_total_bytes = memory.total;
      instance.memory_used_bytes = memory.used;
      instance.memory_free_bytes = memory.free;
    } else if ((lib.memory_v1 || lib.memory_v2) && rc != kNotSupported) {
      gpu->errors.push_back(
          fmt::format("{}(GPU {}, MIG {}): {}", called, index, m, lib.ErrorText(rc)));
    }
    gpu->mig_instances.push_back(std::move(instance));
  }
}

NodeGpuInfo CollectNvml(const NvmlOptions& options) {
  Result<std::unique_ptr<NvmlCollector>> collector = NvmlCollector::Open(options);
  if (!collector.ok()) {
    NodeGpuInfo node;
    node.nvml_unavailable_reason = collector.status().message();
    return node;
  }
  Result<NodeGpuInfo> node = (*collector)->Collect();
  if (!node.ok()) {
    NodeGpuInfo empty;
    empty.nvml_library = (*collector)->library();
    empty.nvml_unavailable_reason = node.status().message();
    return empty;
  }
  return std::move(node).value();
}

}  // namespace fragscope::gpu
