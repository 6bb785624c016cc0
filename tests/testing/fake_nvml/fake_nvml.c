/* A stand-in libnvidia-ml for tests: the same exported function names and C ABI as NVIDIA's
 * library (declared here from the documented interface), answering from a fixture file named
 * by the FRAGSCOPE_FAKE_NVML_FIXTURE environment variable. Built as several shared libraries
 * (tests/testing/fake_nvml/CMakeLists.txt) that differ in what they export:
 *
 *   FAKE_NVML_OLD       only the unversioned functions of an old driver (no _v2/_v3, no BAR1,
 *                       no MIG, no nvmlErrorString, no version queries)
 *   FAKE_NVML_R535      nvmlDeviceGetComputeRunningProcesses_v3 writes the 32-byte record of
 *                       R535's headers (with usedGpuCcProtectedMemory) instead of 24 bytes
 *   FAKE_NVML_NO_INIT   exports neither nvmlInit_v2 nor nvmlInit
 *
 * Fixture format (tests/data/nvml/README.md): one statement per line, '#' starts a comment.
 *   driver 535.104.05            nvml 12.535.104.05            cuda 12020
 *   gpu GPU-<uuid>               starts a GPU; the lines below describe it
 *   name <rest of the line>      pci <bus id>
 *   memory total=N used=N free=N reserved=N
 *   bar1 total=N used=N free=N
 *   process pid=N used=N|na [gi=N] [ci=N]
 *   mig_mode 0|1
 *   mig slot=N uuid=MIG-… gi=N ci=N total=N used=N free=N
 *   error <exported function name> <code>   (before any gpu line: for every call; after one:
 *                                            only for calls about that GPU)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
  OK = 0,
  ERR_UNINITIALIZED = 1,
  ERR_INVALID_ARGUMENT = 2,
  ERR_NOT_SUPPORTED = 3,
  ERR_NOT_FOUND = 6,
  ERR_INSUFFICIENT_SIZE = 7,
  ERR_DRIVER_NOT_LOADED = 9,
  ERR_ARGUMENT_VERSION_MISMATCH = 25,
  ERR_UNKNOWN = 999
};
#define NOT_AVAILABLE_U64 (~0ULL)
#define NOT_AVAILABLE_U32 (~0U)

enum { kMaxGpus = 16, kMaxProcesses = 64, kMaxMig = 8, kMaxErrors = 32 };

typedef struct {
  int kind; /* 0: GPU, 1: MIG device; handles point here */
  int gpu;  /* owning GPU index */
  unsigned slot;
  char uuid[80];
  unsigned gi, ci;
  unsigned long long total, used, free;
} Mig;

typedef struct {
  unsigned pid;
  unsigned long long used;
  unsigned gi, ci;
} Process;

typedef struct {
  int kind;
  int index;
  char uuid[80];
  char name[96];
  char pci[32];
  int has_memory, has_bar1;
  unsigned long long total, used, free, reserved;
  unsigned long long bar1_total, bar1_used, bar1_free;
  Process processes[kMaxProcesses];
  int process_count;
  unsigned mig_mode;
  Mig migs[kMaxMig];
  int mig_count;
} Gpu;

typedef struct {
  char function[64];
  int gpu; /* -1: every call */
  nvmlReturn_t code;
} Error;

static struct {
  int refs;
  char driver[80], nvml[80];
  int cuda;
  Gpu gpus[kMaxGpus];
  int gpu_count;
  Error errors[kMaxErrors];
  int error_count;
} g;

static nvmlReturn_t Injected(const char* function, int gpu) {
  for (int i = 0; i < g.error_count; ++i) {
    if (strcmp(g.errors[i].function, function) == 0 &&
        (g.errors[i].gpu < 0 || g.errors[i].gpu == gpu)) {
      return g.errors[i].code;
    }
  }
  return OK;
}

/* Copies `src` into dst[size], cut to fit and always terminated. */
static void Copy(char* dst, size_t size, const char* src) {
  size_t n = strlen(src);
  if (n >= size) n = size - 1;
  memcpy(dst, src, n);
  dst[n] = 0;
}

/* value of "key=" in `line`, or NULL; "na" reads as the not-available value. */
static int Field(const char* line, const char* key, unsigned long long* out) {
  char pattern[32];
  snprintf(pattern, sizeof pattern, "%s=", key);
  const char* p = line;
  size_t n = strlen(pattern);
  while ((p = strstr(p, pattern)) != NULL) {
    if (p == line || p[-1] == ' ' || p[-1] == '\t') break;
    p += n;
  }
  if (p == NULL) return 0;
  p += n;
  if (strncmp(p, "na", 2) == 0) {
    *out = NOT_AVAILABLE_U64;
  } else {
    *out = strtoull(p, NULL, 0);
  }
  return 1;
}

static int FieldString(const char* line, const char* key, char* out, size_t size) {
  char pattern[32];
  snprintf(pattern, sizeof pattern, " %s=", key);
  const char* p = strstr(line, pattern);
  if (p == NULL) return 0;
  p += strlen(pattern);
  size_t len = strcspn(p, " \t\n");
  if (len >= size) len = size - 1;
  memcpy(out, p, len);
  out[len] = 0;
  return 1;
}

__attribute__((unused)) static nvmlReturn_t Load(void) {
  const int refs = g.refs;
  memset(&g, 0, sizeof g);
  g.refs = refs;
  const char* path = getenv("FRAGSCOPE_FAKE_NVML_FIXTURE");
  if (path == NULL) return ERR_DRIVER_NOT_LOADED;
  FILE* f = fopen(path, "r");
  if (f == NULL) return ERR_DRIVER_NOT_LOADED;
  char line[512];
  Gpu* gpu = NULL;
  while (fgets(line, sizeof line, f) != NULL) {
    char* hash = strchr(line, '#');
    if (hash != NULL) *hash = 0;
    line[strcspn(line, "\n")] = 0;
    char word[32] = {0};
    char rest[480] = {0};
    if (sscanf(line, " %31s %479[^\n]", word, rest) < 1) continue;
    char padded[512];
    snprintf(padded, sizeof padded, " %s", rest);
    unsigned long long v = 0;
    if (strcmp(word, "driver") == 0) {
      Copy(g.driver, sizeof g.driver, rest);
    } else if (strcmp(word, "nvml") == 0) {
      Copy(g.nvml, sizeof g.nvml, rest);
    } else if (strcmp(word, "cuda") == 0) {
      g.cuda = atoi(rest);
    } else if (strcmp(word, "gpu") == 0 && g.gpu_count < kMaxGpus) {
      gpu = &g.gpus[g.gpu_count];
      memset(gpu, 0, sizeof *gpu);
      gpu->index = g.gpu_count++;
      Copy(gpu->uuid, sizeof gpu->uuid, rest);
    } else if (strcmp(word, "error") == 0 && g.error_count < kMaxErrors) {
      Error* e = &g.errors[g.error_count++];
      int code = 0;
      if (sscanf(rest, "%63s %d", e->function, &code) != 2) {
        fclose(f);
        return ERR_UNKNOWN;
      }
      e->code = code;
      e->gpu = gpu != NULL ? gpu->index : -1;
    } else if (gpu == NULL) {
      fclose(f);
      return ERR_UNKNOWN; /* a GPU line before any gpu */
    } else if (strcmp(word, "name") == 0) {
      Copy(gpu->name, sizeof gpu->name, rest);
    } else if (strcmp(word, "pci") == 0) {
      Copy(gpu->pci, sizeof gpu->pci, rest);
    } else if (strcmp(word, "memory") == 0) {
      gpu->has_memory = 1;
      Field(padded, "total", &gpu->total);
      Field(padded, "used", &gpu->used);
      Field(padded, "free", &gpu->free);
      Field(padded, "reserved", &gpu->reserved);
    } else if (strcmp(word, "bar1") == 0) {
      gpu->has_bar1 = 1;
      Field(padded, "total", &gpu->bar1_total);
      Field(padded, "used", &gpu->bar1_used);
      Field(padded, "free", &gpu->bar1_free);
    } else if (strcmp(word, "process") == 0 && gpu->process_count < kMaxProcesses) {
      Process* p = &gpu->processes[gpu->process_count++];
      p->gi = p->ci = NOT_AVAILABLE_U32;
      p->used = NOT_AVAILABLE_U64;
      if (Field(padded, "pid", &v)) p->pid = (unsigned)v;
      Field(padded, "used", &p->used);
      if (Field(padded, "gi", &v)) p->gi = (unsigned)v;
      if (Field(padded, "ci", &v)) p->ci = (unsigned)v;
    } else if (strcmp(word, "mig_mode") == 0) {
      gpu->mig_mode = (unsigned)atoi(rest);
    } else if (strcmp(word, "mig") == 0 && gpu->mig_count < kMaxMig) {
      Mig* m = &gpu->migs[gpu->mig_count++];
      m->kind = 1;
      m->gpu = gpu->index;
      if (Field(padded, "slot", &v)) m->slot = (unsigned)v;
      FieldString(padded, "uuid", m->uuid, sizeof m->uuid);
      if (Field(padded, "gi", &v)) m->gi = (unsigned)v;
      if (Field(padded, "ci", &v)) m->ci = (unsigned)v;
      Field(padded, "total", &m->total);
      Field(padded, "used", &m->used);
      Field(padded, "free", &m->free);
    } else {
      fclose(f);
      return ERR_UNKNOWN;
    }
  }
  fclose(f);
  return OK;
}

/* The GPU or MIG device behind a handle; `gpu` receives the owning GPU's index. */
static Gpu* AsGpu(void* device) {
  if (device == NULL || *(int*)device != 0) return NULL;
  return (Gpu*)device;
}
static Mig* AsMig(void* device) {
  if (device == NULL || *(int*)device != 1) return NULL;
  return (Mig*)device;
}
static int OwnerIndex(void* device) {
  if (AsGpu(device) != NULL) return AsGpu(device)->index;
  if (AsMig(device) != NULL) return AsMig(device)->gpu;
  return -1;
}

#define CHECK(function, device)                                      \
  do {                                                               \
    if (g.refs == 0) return ERR_UNINITIALIZED;                       \
    if (OwnerIndex(device) < 0) return ERR_INVALID_ARGUMENT;         \
    nvmlReturn_t injected_ = Injected(function, OwnerIndex(device)); \
    if (injected_ != OK) return injected_;                           \
  } while (0)

#ifndef FAKE_NVML_NO_INIT
static nvmlReturn_t Init(const char* function) {
  nvmlReturn_t injected = Injected(function, -1);
  if (g.refs == 0) {
    nvmlReturn_t rc = Load();
    if (rc != OK) return rc;
    injected = Injected(function, -1);
  }
  if (injected != OK) return injected;
  ++g.refs;
  return OK;
}

EXPORT nvmlReturn_t nvmlInit(void) { return Init("nvmlInit"); }
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlInit_v2(void) { return Init("nvmlInit_v2"); }
#endif
#endif

EXPORT nvmlReturn_t nvmlShutdown(void) {
  if (g.refs == 0) return ERR_UNINITIALIZED;
  --g.refs;
  return OK;
}

#ifndef FAKE_NVML_OLD
EXPORT const char* nvmlErrorString(nvmlReturn_t code) {
  switch (code) {
    case 0:
      return "Success";
    case 1:
      return "Uninitialized";
    case 2:
      return "Invalid Argument";
    case 3:
      return "Not Supported";
    case 4:
      return "Insufficient Permissions";
    case 6:
      return "Not Found";
    case 7:
      return "Insufficient Size";
    case 9:
      return "Driver Not Loaded";
    case 13:
      return "Function Not Found";
    case 15:
      return "GPU is lost";
    case 25:
      return "Argument version mismatch";
    default:
      return "Unknown Error";
  }
}
#endif

static nvmlReturn_t GetCount(const char* function, unsigned* count) {
  if (g.refs == 0) return ERR_UNINITIALIZED;
  nvmlReturn_t injected = Injected(function, -1);
  if (injected != OK) return injected;
  if (count == NULL) return ERR_INVALID_ARGUMENT;
  *count = (unsigned)g.gpu_count;
  return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned* count) {
  return GetCount("nvmlDeviceGetCount", count);
}

static nvmlReturn_t GetHandle(const char* function, unsigned index, void** device) {
  if (g.refs == 0) return ERR_UNINITIALIZED;
  nvmlReturn_t injected = Injected(function, (int)index);
  if (injected != OK) return injected;
  if (device == NULL || index >= (unsigned)g.gpu_count) return ERR_INVALID_ARGUMENT;
  *device = &g.gpus[index];
  return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned index, void** device) {
  return GetHandle("nvmlDeviceGetHandleByIndex", index, device);
}

#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned* count) {
  return GetCount("nvmlDeviceGetCount_v2", count);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned index, void** device) {
  return GetHandle("nvmlDeviceGetHandleByIndex_v2", index, device);
}
#endif

EXPORT nvmlReturn_t nvmlDeviceGetUUID(void* device, char* uuid, unsigned length) {
  CHECK("nvmlDeviceGetUUID", device);
  const char* value = AsGpu(device) != NULL ? AsGpu(device)->uuid : AsMig(device)->uuid;
  if (uuid == NULL) return ERR_INVALID_ARGUMENT;
  if (strlen(value) + 1 > length) return ERR_INSUFFICIENT_SIZE;
  strcpy(uuid, value);
  return OK;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(void* device, char* name, unsigned length) {
  CHECK("nvmlDeviceGetName", device);
  Gpu* gpu = AsGpu(device);
  if (gpu == NULL) return ERR_NOT_SUPPORTED;
  if (strlen(gpu->name) + 1 > length) return ERR_INSUFFICIENT_SIZE;
  strcpy(name, gpu->name);
  return OK;
}

/* nvmlPciInfo_t as the _v2/_v3 functions fill it, and the old (v1) layout. */
typedef struct {
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
} PciInfo;
typedef struct {
  char busId[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  unsigned reserved[4];
} PciInfoV1;

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(void* device, PciInfoV1* pci) {
  CHECK("nvmlDeviceGetPciInfo", device);
  Gpu* gpu = AsGpu(device);
  if (gpu == NULL) return ERR_NOT_SUPPORTED;
  memset(pci, 0, sizeof *pci);
  /* the old 16-byte field held "0000:3B:00.0" (4-digit domain) */
  Copy(pci->busId, sizeof pci->busId, strlen(gpu->pci) > 4 ? gpu->pci + 4 : gpu->pci);
  return OK;
}
#ifndef FAKE_NVML_OLD
static nvmlReturn_t PciV2(const char* function, void* device, PciInfo* pci) {
  CHECK(function, device);
  Gpu* gpu = AsGpu(device);
  if (gpu == NULL) return ERR_NOT_SUPPORTED;
  memset(pci, 0, sizeof *pci);
  Copy(pci->busId, sizeof pci->busId, gpu->pci);
  Copy(pci->busIdLegacy, sizeof pci->busIdLegacy, strlen(gpu->pci) > 4 ? gpu->pci + 4 : gpu->pci);
  return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(void* device, PciInfo* pci) {
  return PciV2("nvmlDeviceGetPciInfo_v2", device, pci);
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(void* device, PciInfo* pci) {
  return PciV2("nvmlDeviceGetPciInfo_v3", device, pci);
}
#endif

typedef struct {
  unsigned long long total, free, used;
} Memory;
typedef struct {
  unsigned version;
  unsigned long long total, reserved, free, used;
} MemoryV2;

static int MemoryOf(void* device, unsigned long long* total, unsigned long long* used,
                    unsigned long long* free_bytes, unsigned long long* reserved) {
  Gpu* gpu = AsGpu(device);
  Mig* mig = AsMig(device);
  if (gpu != NULL) {
    if (!gpu->has_memory) return 0;
    *total = gpu->total;
    *used = gpu->used;
    *free_bytes = gpu->free;
    *reserved = gpu->reserved;
  } else {
    *total = mig->total;
    *used = mig->used;
    *free_bytes = mig->free;
    *reserved = 0;
  }
  return 1;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(void* device, Memory* memory) {
  CHECK("nvmlDeviceGetMemoryInfo", device);
  unsigned long long total, used, free_bytes, reserved;
  if (!MemoryOf(device, &total, &used, &free_bytes, &reserved)) return ERR_NOT_SUPPORTED;
  memory->total = total;
  memory->used = used + reserved; /* v1's "used" counts what v2 calls reserved */
  memory->free = free_bytes;
  return OK;
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(void* device, MemoryV2* memory) {
  CHECK("nvmlDeviceGetMemoryInfo_v2", device);
  if (memory->version != ((unsigned)sizeof(MemoryV2) | (2u << 24))) {
    return ERR_ARGUMENT_VERSION_MISMATCH;
  }
  unsigned long long total, used, free_bytes, reserved;
  if (!MemoryOf(device, &total, &used, &free_bytes, &reserved)) return ERR_NOT_SUPPORTED;
  memory->total = total;
  memory->used = used;
  memory->free = free_bytes;
  memory->reserved = reserved;
  return OK;
}

typedef struct {
  unsigned long long total, free, used;
} Bar1;
EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(void* device, Bar1* bar1) {
  CHECK("nvmlDeviceGetBAR1MemoryInfo", device);
  Gpu* gpu = AsGpu(device);
  if (gpu == NULL || !gpu->has_bar1) return ERR_NOT_SUPPORTED;
  bar1->total = gpu->bar1_total;
  bar1->free = gpu->bar1_free;
  bar1->used = gpu->bar1_used;
  return OK;
}
#endif

/* The three record layouts: v1 (16 bytes), v2 (24), and R535's v3 (32). */
typedef struct {
  unsigned pid;
  unsigned long long usedGpuMemory;
} ProcessV1;
typedef struct {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId, computeInstanceId;
} ProcessV2;
typedef struct {
  unsigned pid;
  unsigned long long usedGpuMemory;
  unsigned gpuInstanceId, computeInstanceId;
  unsigned long long usedGpuCcProtectedMemory;
} ProcessR535;

static nvmlReturn_t Processes(const char* function, void* device, unsigned* count, void* infos,
                              int layout) {
  CHECK(function, device);
  Gpu* gpu = AsGpu(device);
  if (gpu == NULL) return ERR_NOT_SUPPORTED;
  if (count == NULL) return ERR_INVALID_ARGUMENT;
  const unsigned n = (unsigned)gpu->process_count;
  if (infos == NULL || *count < n) {
    *count = n;
    return n == 0 ? OK : ERR_INSUFFICIENT_SIZE;
  }
  for (unsigned i = 0; i < n; ++i) {
    const Process* p = &gpu->processes[i];
    if (layout == 1) {
      ProcessV1 r = {p->pid, p->used};
      memcpy((char*)infos + i * sizeof r, &r, sizeof r);
    } else if (layout == 2) {
      ProcessV2 r = {p->pid, p->used, p->gi, p->ci};
      memcpy((char*)infos + i * sizeof r, &r, sizeof r);
    } else {
      ProcessR535 r = {p->pid, p->used, p->gi, p->ci, 0};
      memcpy((char*)infos + i * sizeof r, &r, sizeof r);
    }
  }
  *count = n;
  return OK;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(void* device, unsigned* count,
                                                         void* infos) {
  return Processes("nvmlDeviceGetComputeRunningProcesses", device, count, infos, 1);
}
#ifndef FAKE_NVML_OLD
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(void* device, unsigned* count,
                                                            void* infos) {
  return Processes("nvmlDeviceGetComputeRunningProcesses_v2", device, count, infos, 2);
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(void* device, unsigned* count,
                                                            void* infos) {
#ifdef FAKE_NVML_R535
  return Processes("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos, 3);
#else
  return Processes("nvmlDeviceGetComputeRunningProcesses_v3", device, count, infos, 2);
#endif
}

EXPORT nvmlReturn_t nvmlDeviceGetMigMode(void* device, unsigned* current, unsigned* pending) {
  CHECK("nvmlDeviceGetMigMode", device);
  Gpu* gpu = AsGpu(device);
  if (gpu == NULL) return ERR_NOT_SUPPORTED;
  *current = *pending = gpu->mig_mode;
  return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(void* device, unsigned* count) {
  CHECK("nvmlDeviceGetMaxMigDeviceCount", device);
  *count = 7;
  return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(void* device, unsigned index, void** mig) {
  CHECK("nvmlDeviceGetMigDeviceHandleByIndex", device);
  Gpu* gpu = AsGpu(device);
  if (gpu == NULL || gpu->mig_mode != 1) return ERR_NOT_SUPPORTED;
  for (int i = 0; i < gpu->mig_count; ++i) {
    if (gpu->migs[i].slot == index) {
      *mig = &gpu->migs[i];
      return OK;
    }
  }
  return ERR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(void* device, unsigned* id) {
  CHECK("nvmlDeviceGetGpuInstanceId", device);
  if (AsMig(device) == NULL) return ERR_NOT_SUPPORTED;
  *id = AsMig(device)->gi;
  return OK;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(void* device, unsigned* id) {
  CHECK("nvmlDeviceGetComputeInstanceId", device);
  if (AsMig(device) == NULL) return ERR_NOT_SUPPORTED;
  *id = AsMig(device)->ci;
  return OK;
}

static nvmlReturn_t SystemString(const char* function, const char* value, char* out,
                                 unsigned length) {
  if (g.refs == 0) return ERR_UNINITIALIZED;
  nvmlReturn_t injected = Injected(function, -1);
  if (injected != OK) return injected;
  if (value[0] == 0) return ERR_NOT_SUPPORTED;
  if (strlen(value) + 1 > length) return ERR_INSUFFICIENT_SIZE;
  strcpy(out, value);
  return OK;
}
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char* version, unsigned length) {
  return SystemString("nvmlSystemGetDriverVersion", g.driver, version, length);
}
EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char* version, unsigned length) {
  return SystemString("nvmlSystemGetNVMLVersion", g.nvml, version, length);
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int* version) {
  if (g.refs == 0) return ERR_UNINITIALIZED;
  if (g.cuda == 0) return ERR_NOT_SUPPORTED;
  *version = g.cuda;
  return OK;
}
#endif
