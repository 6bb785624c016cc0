#include "analysis/explain.h"

#include <algorithm>
#include <cmath>
#include <string_view>

#include <fmt/format.h>

#include "analysis/tune.h"
#include "common/units.h"

namespace fragscope::analysis {
namespace {

std::string B(std::uint64_t bytes) { return FormatBytesLikePyTorch(bytes); }

std::uint64_t Sub(std::uint64_t a, std::uint64_t b) { return a > b ? a - b : 0; }

// What the "Tried to allocate" figure says about the tensor: PyTorch prints the size of the
// segment it asked the driver for (spec §4.3/§12), not the tensor's size.
std::string TriedNote(std::uint64_t tried) {
  if (tried == 2 * kMiB) {
    return "\"Tried to allocate 2.00 MiB\" is the small pool's segment size: the tensor itself "
           "was at most 1 MiB";
  }
  if (tried == 20 * kMiB) {
    return "\"Tried to allocate 20.00 MiB\" is the large pool's smallest segment: the tensor "
           "itself was between 1 MiB and 10 MiB";
  }
  return fmt::format(
      "\"Tried to allocate {}\" is the segment size the allocator asked the driver for (the "
      "request rounded up, to 2 MiB at least), not necessarily the tensor's size",
      B(tried));
}

// max_split_size_mb for a fragmentation OOM: half the failing size, down to a power of two,
// at least 20 (PyTorch's minimum). Blocks of that size and more are then never split, so the
// smaller tensors cannot carve up the blocks that requests of the failing size need.
std::optional<std::uint64_t> SplitLimitMiB(std::uint64_t tried) {
  const std::uint64_t half_mib = tried / kMiB / 2;
  if (half_mib < 20) return std::nullopt;
  std::uint64_t p = 1;
  while (p * 2 <= half_mib) p *= 2;
  return std::max<std::uint64_t>(p, 20);
}

void AddSmallerBatch(OomExplanation* e, std::uint64_t at_least) {
  e->remedies.push_back(
      {"smaller_batch", "",
       "Use a smaller batch (or micro-batches with gradient accumulation), shorter sequences, "
       "activation checkpointing or lower precision",
       at_least > 0
           ? fmt::format("the failing step needs at least {} less at its peak", B(at_least))
           : std::string("less live memory at the peak always helps"),
       std::nullopt});
}

bool IsXpu(const OomExplanation& e) { return e.message.backend == "XPU"; }

// The environment variable a remedy names: the one the message's own hint names
// (PYTORCH_HIP_ALLOC_CONF for a "HIP out of memory" message; ROCm builds read it when
// PYTORCH_CUDA_ALLOC_CONF is unset, docs/explain.md). XPU messages name none; PyTorch's XPU
// allocator reads PYTORCH_XPU_ALLOC_CONF (builds with the shared parser also read
// PYTORCH_ALLOC_CONF).
std::string_view ConfVariable(const OomExplanation& e) {
  if (IsXpu(e)) return "PYTORCH_XPU_ALLOC_CONF";
  return e.message.backend == "HIP" ? "PYTORCH_HIP_ALLOC_CONF" : "PYTORCH_CUDA_ALLOC_CONF";
}

// The Python module of the message's device: torch.xpu for XPU, torch.cuda otherwise (ROCm
// builds keep torch.cuda).
std::string_view TorchModule(const OomExplanation& e) {
  return IsXpu(e) ? "torch.xpu" : "torch.cuda";
}

void AddExpandable(OomExplanation* e, const OomFigures& f) {
  std::string why = fmt::format(
      "{} was cached by PyTorch but free only in pieces; expandable segments grow one segment "
      "by mapping pages, so freed memory is reused wherever it lies",
      B(f.unallocated));
  if (IsXpu(*e)) {
    why +=
        "; on XPU it needs a build whose SYCL runtime maps virtual memory (builds with "
        "PyTorch's shared allocator config read PYTORCH_ALLOC_CONF too)";
  } else if (e->message.wording == OomWording::kClassic) {
    why += "; needs PyTorch 2.1 or newer (this message's wording is from 2.0 or older)";
  }
  e->remedies.push_back({"expandable_segments", "expandable_segments:True",
                         fmt::format("Set {}=expandable_segments:True", ConfVariable(*e)), why,
                         std::nullopt});
}

void AddSplitLimit(OomExplanation* e, const OomFigures& f) {
  const std::optional<std::uint64_t> mib = SplitLimitMiB(f.tried);
  if (!mib) {
    e->notes.push_back(fmt::format(
        "max_split_size_mb is not proposed: it cannot go below 20 MiB, and a {} request is "
        "too small for a limit at half its size to protect it",
        B(f.tried)));
    return;
  }
  e->remedies.push_back(
      {"max_split_size_mb", fmt::format("max_split_size_mb:{}", *mib),
       fmt::format("Set {}=max_split_size_mb:{}", ConfVariable(*e), *mib),
       fmt::format("blocks of {} MiB or more are then never split, so smaller tensors cannot "
                   "carve up the blocks {} requests need ({} MiB = half the request, down to a "
                   "power of two, at least 20)",
                   *mib, B(f.tried), *mib),
       std::nullopt});
}

void AddGarbageCollection(OomExplanation* e) {
  e->remedies.push_back(
      {"garbage_collection_threshold",
       "garbage_collection_threshold:0.6,per_process_memory_fraction:0.99",
       fmt::format("Set {}=garbage_collection_threshold:0.6 with a memory fraction below 1 "
                   "(per_process_memory_fraction:0.99 in 2.9+, else "
                   "{}.set_per_process_memory_fraction(0.99))",
                   ConfVariable(*e), TorchModule(*e)),
       "returns unused cached blocks to the driver before reserved memory reaches 60% of the "
       "allowed memory, so fewer idle segments pin the address space; it acts only under a "
       "memory fraction",
       std::nullopt});
}

void AddRecordSnapshot(OomExplanation* e) {
  e->remedies.push_back(
      {"record_snapshot", "",
       fmt::format("Record a memory snapshot at the failure ({0}.memory._record_memory_"
                   "history(); {0}.memory._dump_snapshot(path) in an except OutOfMemoryError "
                   "block) and run `fragscope explain LOG --snapshot snapshot.pickle`",
                   TorchModule(*e)),
       "a snapshot holds every segment and block, so the cause is measured, not inferred",
       std::nullopt});
}

// Whether PyTorch's reserved and free figures together exceed the GPU's total by more than
// the printing can explain. Each figure is printed with two decimals in the largest unit it
// reaches (at least 1.00), so it is off by at most 0.5%; 2% of the total covers three of them.
bool BeyondTheCard(const OomFigures& f) {
  const std::uint64_t used = f.reserved + f.free;
  return used < f.reserved || used > f.total + f.total / 50;  // the first: overflow
}

// Figures beyond the card are Windows' WDDM "sysmem fallback" (the driver moved allocations to
// shared system memory once the card's own memory was full) when they show that state: a card
// of some size (T > 0), its own memory full (F within the 2% printing slack of T, i.e. about
// nothing free), and PyTorch's allocated within its reserved. Anything else beyond the card — a
// total of 0, free memory beside more than the card reserved — is a garbled message (a figure
// cut in two by stray characters parses into such numbers). docs/explain.md, "Figures beyond
// the card".
bool SysmemFallback(const OomFigures& f, const OomMessage& m) {
  if (f.total == 0 || f.free > f.total / 50) return false;
  if (m.allocated && *m.allocated > f.reserved + f.reserved / 50) return false;
  return true;
}

void AddFixedShapes(OomExplanation* e) {
  e->remedies.push_back(
      {"fixed_shapes", "",
       "Pad inputs to a few fixed shapes (bucket sequence lengths and batch sizes)",
       "tensors of ever-changing sizes leave gaps that fit no later request; fixed shapes let "
       "every freed block be reused whole",
       std::nullopt});
}

// The figures, when the message has them.
std::optional<OomFigures> Figures(const OomMessage& m, std::vector<std::string>* notes) {
  const std::optional<std::uint64_t> reserved = m.Reserved();
  if (!m.tried || !m.total || !m.free || !reserved || !m.allocated) return std::nullopt;
  OomFigures f;
  f.tried = *m.tried;
  f.total = *m.total;
  f.free = *m.free;
  f.reserved = *reserved;
  f.private_pools = m.private_pools.value_or(0);
  f.allocated = std::min(*m.allocated, f.reserved);
  f.unallocated = Sub(f.reserved, f.allocated);
  if (m.unallocated) f.unallocated = *m.unallocated;
  f.headroom = f.free;
  if (m.allowed) f.headroom = std::min(f.free, Sub(*m.allowed, f.reserved));
  f.outside = Sub(Sub(f.total, f.free), f.reserved);
  if (m.this_process) {
    // "this process has M in use": every "Process P" line is another process.
    std::uint64_t sum = 0;
    for (const OomProcess& p : m.processes) sum += p.bytes;
    f.others = sum;
  } else if (!m.processes.empty()) {
    // No "this process" line: NVML did not recognise this process's pid (a container's pid
    // namespace), so it is probably one of the listed ones. Take the largest entry that holds
    // at least what PyTorch reserved to be this process.
    const OomProcess* self = nullptr;
    for (const OomProcess& p : m.processes) {
      if (p.bytes >= f.reserved && (self == nullptr || p.bytes > self->bytes)) self = &p;
    }
    std::uint64_t sum = 0;
    for (const OomProcess& p : m.processes) {
      if (&p != self) sum += p.bytes;
    }
    f.others = sum;
    if (self != nullptr) {
      f.self_pid = self->pid;
      notes->push_back(fmt::format(
          "no \"this process\" line: process {} ({}) holds at least the {} PyTorch reserved, so "
          "it is taken to be this process (in a container NVML reports host pids)",
          self->pid, B(self->bytes), B(f.reserved)));
    }
  }
  return f;
}

}  // namespace

std::string_view OomVerdictName(OomVerdict verdict) {
  switch (verdict) {
    case OomVerdict::kFragmentation:
      return "fragmentation";
    case OomVerdict::kShortage:
      return "shortage";
    case OomVerdict::kOtherProcesses:
      return "other_processes";
    case OomVerdict::kCap:
      return "cap";
    case OomVerdict::kUndetermined:
      break;
  }
  return "undetermined";
}

std::vector<std::string> MissingFigures(const OomMessage& m) {
  std::vector<std::string> missing;
  if (!m.tried) missing.emplace_back("Tried to allocate");
  if (!m.total) missing.emplace_back("total capacity");
  if (!m.free) missing.emplace_back("free");
  if (!m.allocated) missing.emplace_back("allocated");
  if (!m.Reserved()) {
    missing.emplace_back(m.wording == OomWording::kCapacityOf ? "reserved but unallocated"
                                                              : "reserved");
  }
  return missing;
}

namespace {

// Whether the device's free figure is above the request by more than the printing and the
// driver explain: each figure is printed to half a hundredth of its unit (at most 0.5% of it),
// and the driver maps memory in 2 MiB pages. docs/explain.md, "Verdict".
bool FarAbove(std::uint64_t free, std::uint64_t tried) {
  return free > tried && free - tried > free / 200 + tried / 200 + 2 * kMiB;
}

// How to raise or remove the per-process memory fraction on the message's device.
std::string RaiseFractionAction(const OomExplanation& e) {
  return fmt::format(
      "Raise the per-process memory fraction ({}.set_per_process_memory_fraction{}) or remove it",
      TorchModule(e),
      IsXpu(e) ? std::string()
               : fmt::format(", or per_process_memory_fraction in {} in 2.9+", ConfVariable(e)));
}

// The verdict when the message prints the cap and the request would have crossed it: PyTorch
// refuses a new segment beyond the allowed memory before it asks the driver (spec §7, §4.5), so
// the cap, not the device's free memory, was the bound.
void DecidePrintedCap(const OomFigures& f, std::uint64_t allowed, OomExplanation* e) {
  e->verdict = OomVerdict::kCap;
  const std::uint64_t over = f.reserved + f.tried - allowed;
  const bool device_had_room = f.free >= f.tried;
  e->summary = fmt::format(
      "cap: the process hit its allowed share: the {} PyTorch reserved plus the {} request "
      "come to {}, {} beyond the {} allowed (a per-process memory fraction); {}",
      B(f.reserved), B(f.tried), B(f.reserved + f.tried), B(over), B(allowed),
      device_had_room
          ? fmt::format("the device itself had {} free, enough for the request", B(f.free))
          : fmt::format("the device itself had only {} free, so raising the cap alone does not "
                        "make room",
                        B(f.free)));
  e->reasons.push_back(fmt::format(
      "R + S = {} > allowed L = {}: PyTorch refuses a new segment beyond the cap before it asks "
      "the driver",
      B(f.reserved + f.tried), B(allowed)));
  if (f.unallocated >= f.tried) {
    e->notes.push_back(fmt::format(
        "{} was cached within the allowed share, as much as the request, but not in one block",
        B(f.unallocated)));
  }
  e->remedies.push_back({"raise_memory_fraction", "", RaiseFractionAction(*e),
                         fmt::format("the job needed {} beyond the {} allowed{}", B(over),
                                     B(allowed), device_had_room ? "; the device had room" : ""),
                         std::nullopt});
  if (f.unallocated * 20 >= f.tried) AddExpandable(e, f);
  AddSmallerBatch(e, over);
}

// The verdict when the device reported far more free memory than the request and PyTorch still
// failed: something limited this process's memory. Classic wordings and the newest print the
// memory fraction ("L allowed;"); the "total capacity of" wording of some 2.x releases computes
// it but does not print it.
void DecideUnprintedLimit(const OomFigures& f, OomExplanation* e) {
  e->verdict = OomVerdict::kCap;
  const bool fraction_unprinted =
      !e->message.allowed && e->message.wording == OomWording::kCapacityOf;
  e->summary = fmt::format(
      "cap: the device reported {} free, more than the {} request, yet PyTorch could not get "
      "it: a limit on this process's memory was the bound{}",
      B(f.free), B(f.tried),
      fraction_unprinted
          ? fmt::format(", most likely a per-process memory fraction set in code ({}"
                        ".set_per_process_memory_fraction), which this wording does not print "
                        "(some 2.x releases compute it but leave \"allowed\" out)",
                        TorchModule(*e))
          : std::string(", one the message's figures do not show (PyTorch's own memory "
                        "fraction would be printed as \"allowed\" here)"));
  e->reasons.push_back(fmt::format(
      "S = {} <= F = {}, by more than the printing's rounding and the driver's 2 MiB pages",
      B(f.tried), B(f.free)));
  e->notes.push_back(
      "unless another process freed that much memory between the failed allocation and the "
      "message (PyTorch reads the free figure right after the failure)");
  e->remedies.push_back(
      {"raise_memory_fraction", "",
       fmt::format("Find the limit and raise or remove it: a memory fraction set in code "
                   "({}.set_per_process_memory_fraction{}), or a limit on the process's GPU "
                   "memory set outside PyTorch",
                   TorchModule(*e),
                   IsXpu(*e)
                       ? std::string()
                       : fmt::format(", per_process_memory_fraction in {}", ConfVariable(*e))),
       fmt::format("the device had {} free, {} more than the request", B(f.free),
                   B(f.free - f.tried)),
       std::nullopt});
  AddSmallerBatch(e, 0);
}

// The verdict and the remedies it calls for (ExplainOom adds those of the device's state).
OomExplanation Decide(const OomMessage& message) {
  OomExplanation e;
  e.message = message;
  e.missing = MissingFigures(message);
  if (message.tried) e.notes.push_back(TriedNote(*message.tried));
  if (message.text_truncated) {
    e.notes.push_back("the message is cut short in the input; figures after the cut are lost");
  }
  e.figures = Figures(message, &e.notes);
  if (!e.figures) {
    e.verdict = OomVerdict::kUndetermined;
    if (message.text.rfind("CUDA error: out of memory", 0) == 0) {
      e.summary =
          "\"CUDA error: out of memory\" comes from the CUDA runtime (a kernel launch, cuBLAS or "
          "NCCL workspace, context creation), not from the caching allocator: it carries no "
          "figures";
    } else {
      std::string list;
      for (const std::string& m : e.missing) list += (list.empty() ? "'" : ", '") + m + "'";
      e.summary = fmt::format("the message has no {} figure{}, which the verdict needs", list,
                              e.missing.size() > 1 ? "s" : "");
    }
    AddRecordSnapshot(&e);
    AddSmallerBatch(&e, 0);
    return e;
  }
  OomFigures& f = *e.figures;
  if (message.quoted) {
    e.notes.push_back(fmt::format(
        "the message is quoted from \"Tried to allocate\" on; its backend ({}) is taken from "
        "what the text names",
        message.backend));
  }
  if (message.wording == OomWording::kClassic && !message.reserved && message.unallocated) {
    e.notes.push_back(
        "PyTorch 1.0-1.3 wording: \"cached\" is memory PyTorch reserved but had not allocated "
        "(U), so reserved R = allocated + cached");
  }
  if (BeyondTheCard(f) && SysmemFallback(f, message)) {
    f.sysmem_fallback = f.reserved + f.free - f.total;
    e.notes.push_back(fmt::format(
        "PyTorch held {} on a card of {}: the {} beyond the card lived in shared system memory. "
        "On Windows (and WSL2) NVIDIA's WDDM driver lets allocations spill there once the "
        "card's own memory is full (\"CUDA - Sysmem Fallback Policy\", drivers 536.40 and "
        "newer); kernels reach it over PCIe, so a job in this state runs many times slower "
        "long before it runs out of memory",
        B(f.reserved), B(f.total), B(f.sysmem_fallback)));
    e.reasons.push_back(fmt::format(
        "R + F = {} > T = {} with F about 0: the card was full and {} had spilled to system "
        "memory (sysmem fallback)",
        B(f.reserved + f.free), B(f.total), B(f.sysmem_fallback)));
  }
  if (BeyondTheCard(f) && !f.sysmem_fallback) {
    // A garbled line (a figure cut in two, stray characters) can parse into figures no GPU
    // shows; a verdict drawn from them would be confident and wrong.
    e.verdict = OomVerdict::kUndetermined;
    e.figures_agree = false;
    e.missing.emplace_back("figures that agree with each other");
    e.summary = fmt::format(
        "undetermined: the figures contradict each other ({} reserved and {} free on a GPU of "
        "{}, which neither a GPU nor Windows' sysmem fallback shows); the message is probably "
        "garbled",
        B(f.reserved), B(f.free), B(f.total));
    e.reasons.push_back(fmt::format("R + F = {} > T = {}", B(f.reserved + f.free), B(f.total)));
    AddRecordSnapshot(&e);
    AddSmallerBatch(&e, 0);
    return e;
  }
  if (IsXpu(e) && f.outside == 0) {
    e.notes.push_back(
        "on an XPU device that cannot report its free memory, PyTorch prints total minus "
        "reserved as the free figure: memory held outside PyTorch, if any, does not show");
  }
  e.stranded = f.unallocated;
  e.shortfall = Sub(f.tried, f.headroom);
  // What the regular allocator could reach for the request: the device's usable free memory
  // and its own cache. The private pools' cache is not part of it: only their CUDA graphs and
  // MemPools allocate from it (PyTorch prints it inside "allocated" and outside "reserved but
  // unallocated", spec §12.1).
  const std::uint64_t cached = f.headroom + f.unallocated;

  e.reasons.push_back(fmt::format("request S = {}; device free F = {}{}", B(f.tried), B(f.free),
                                  message.allowed ? fmt::format(", usable under the {} allowed "
                                                                "H = min(F, allowed - R) = {}",
                                                                B(*message.allowed), B(f.headroom))
                                                  : std::string()));
  e.reasons.push_back(fmt::format(
      "reserved R = {} = allocated A {} + unallocated U {}{}", B(f.reserved), B(f.allocated),
      B(f.unallocated),
      f.private_pools ? fmt::format(" (A includes {} cached in private pools P, which only their "
                                    "CUDA graphs or MemPools can use)",
                                    B(f.private_pools))
                      : std::string()));
  e.reasons.push_back(fmt::format("outside PyTorch's cache O = T - F - R = {} - {} - {} = {}",
                                  B(f.total), B(f.free), B(f.reserved), B(f.outside)));
  if (f.others) e.reasons.push_back(fmt::format("other processes hold {}", B(*f.others)));

  if (f.tried > f.total) {
    e.verdict = OomVerdict::kShortage;
    e.summary = fmt::format(
        "shortage: the request ({}) is larger than the whole GPU ({}); no setting helps",
        B(f.tried), B(f.total));
    e.reasons.push_back(fmt::format("S = {} > T = {}", B(f.tried), B(f.total)));
    e.remedies.push_back(
        {"check_request", "",
         "Check the shape of the tensor being made: a size this large is usually a bug (a "
         "wrong dimension, an accidental outer product) or needs sharding across GPUs",
         fmt::format("{} > total capacity {}", B(f.tried), B(f.total)), std::nullopt});
    AddSmallerBatch(&e, Sub(f.tried, f.total));
    return e;
  }
  if (message.allowed && f.reserved + f.tried > *message.allowed) {
    DecidePrintedCap(f, *message.allowed, &e);
    return e;
  }
  if (f.tried <= f.headroom) {
    if (FarAbove(f.free, f.tried)) {
      DecideUnprintedLimit(f, &e);
      return e;
    }
    e.verdict = OomVerdict::kUndetermined;
    e.missing.emplace_back("a free figure below the request");
    e.summary = fmt::format(
        "undetermined: the device reported {} free, about the {} request (within the printing's "
        "rounding and the driver's 2 MiB pages), when the message was written; the driver "
        "could not map that much at once, or memory was freed in between (another process, a "
        "concurrent free)",
        B(f.headroom), B(f.tried));
    e.reasons.push_back(fmt::format("S = {} <= H = {}", B(f.tried), B(f.headroom)));
    e.remedies.push_back({"check_other_processes", "",
                          "Watch the GPU's other users (nvidia-smi --query-compute-apps="
                          "pid,used_memory --format=csv -l 1) around the failure",
                          "memory that comes and goes outside this process makes the figures "
                          "inconsistent",
                          std::nullopt});
    AddSmallerBatch(&e, 0);
    return e;
  }
  if (f.tried <= cached) {
    e.verdict = OomVerdict::kFragmentation;
    e.summary = fmt::format(
        "fragmentation: {} was cached by PyTorch but unallocated, enough with the {} free for "
        "the {} request, but not in one block",
        B(e.stranded), B(f.headroom), B(f.tried));
    e.reasons.push_back(
        fmt::format("H + U = {} >= S = {} > H = {}", B(cached), B(f.tried), B(f.headroom)));
    AddExpandable(&e, f);
    if (IsXpu(e)) {
      // PyTorch's XPU allocator never splits by max_split_size and has no garbage collection:
      // of the allocator settings it reads expandable_segments only.
      e.notes.push_back(
          "PyTorch's XPU allocator reads expandable_segments only: max_split_size_mb, "
          "garbage_collection_threshold and roundup_power2_divisions do not change it");
    } else {
      AddSplitLimit(&e, f);
    }
    AddFixedShapes(&e);
    if (!IsXpu(e)) AddGarbageCollection(&e);
    AddSmallerBatch(&e, Sub(f.tried, f.headroom));
    return e;
  }
  if (f.others && f.tried <= cached + *f.others) {
    e.verdict = OomVerdict::kOtherProcesses;
    e.summary = fmt::format(
        "other processes: {} held by other processes on this GPU; without it the {} request "
        "would have fit",
        B(*f.others), B(f.tried));
    e.reasons.push_back(fmt::format("H + U + others = {} >= S = {} > H + U = {}",
                                    B(cached + *f.others), B(f.tried), B(cached)));
    std::string pids;
    for (const OomProcess& p : message.processes) {
      if (f.self_pid && p.pid == *f.self_pid) continue;
      if (!pids.empty()) pids += ", ";
      pids += fmt::format("{} ({})", p.pid, B(p.bytes));
    }
    e.remedies.push_back(
        {"free_other_processes", "",
         fmt::format("Stop or move the other processes on GPU {}{} (one job per GPU: "
                     "CUDA_VISIBLE_DEVICES), or check for leftover processes of earlier runs",
                     message.gpu ? *message.gpu : 0, pids.empty() ? "" : ": " + pids),
         fmt::format("they hold {}; the job lacked {}", B(*f.others), B(f.tried - cached)),
         std::nullopt});
    if (f.unallocated * 20 >= f.tried) AddExpandable(&e, f);
    AddSmallerBatch(&e, f.tried - cached);
    return e;
  }
  // Shortage: even every byte free on the device and cached by PyTorch (and, when listed,
  // other processes' memory) would not hold the request. Whatever holds the rest of the card
  // outside PyTorch's cache does not change that verdict; the report says what it can be. Nor
  // does the private pools' cache: only their own graphs and pools allocate from it.
  e.verdict = OomVerdict::kShortage;
  const std::uint64_t reachable = cached + f.others.value_or(0);
  const std::uint64_t missing = f.tried - reachable;
  e.summary = fmt::format(
      "shortage: the {} request exceeds the {} free on the device plus the {} PyTorch had "
      "cached{}; the job needs {} more",
      B(f.tried), B(f.headroom), B(f.unallocated),
      f.others ? fmt::format(" and the {} other processes held", B(*f.others)) : std::string(),
      B(missing));
  e.reasons.push_back(
      fmt::format("S = {} > H + U{} = {}", B(f.tried), f.others ? " + others" : "", B(reachable)));
  if (f.private_pools > 0) {
    e.reasons.push_back(fmt::format(
        "the {} cached in private pools is not counted: the regular allocator cannot use it",
        B(f.private_pools)));
    if (f.tried <= reachable + f.private_pools) {
      e.notes.push_back(fmt::format(
          "the {} cached in private pools (CUDA graphs, MemPools) would cover the {} missing if "
          "it were released to the regular allocator",
          B(f.private_pools), B(missing)));
      e.remedies.push_back(
          {"private_pools", "",
           "Free CUDA graphs that are no longer replayed (their private pool is released with "
           "them), or let graphs share one memory pool (torch.cuda.graph_pool_handle())",
           fmt::format("{} sits cached in private pools, more than the {} missing",
                       B(f.private_pools), B(missing)),
           std::nullopt});
    }
  }
  // Memory outside PyTorch's cache that no listed process accounts for.
  const std::uint64_t unexplained = Sub(f.outside, f.others.value_or(0));
  if (unexplained > 0) {
    e.reasons.push_back(fmt::format(
        "{} of the device was outside PyTorch's cache{}: {}this process's CUDA context, NCCL "
        "buffers, cuBLAS/cuDNN workspaces, or memory allocated beside PyTorch's allocator "
        "(cudaMalloc from other libraries)",
        B(unexplained), f.others ? " beyond the listed processes" : "",
        f.others ? "" : "other processes, "));
  }
  AddSmallerBatch(&e, missing);
  e.remedies.push_back(
      {"larger_gpu", "",
       fmt::format("Use a GPU with at least {} (or shard the model: FSDP, "
                   "tensor parallelism)",
                   B(std::max(f.total, f.reserved + f.free) + missing)),
       fmt::format("{} {} + the {} missing", f.sysmem_fallback ? "reserved + free" : "total",
                   B(std::max(f.total, f.reserved + f.free)), B(missing)),
       std::nullopt});
  if (unexplained > 0) {
    e.remedies.push_back(
        {"see_outside_memory", "",
         fmt::format("See what holds the {0} outside PyTorch's cache: nvidia-smi "
                     "--query-compute-apps=pid,used_memory --format=csv (or `fragscope gpus`) "
                     "lists each process's memory; inside the job, total - free of "
                     "{1}.mem_get_info(), minus {1}.memory_reserved(), is what other processes "
                     "and this process's memory outside PyTorch's cache take",
                     B(unexplained), TorchModule(e)),
         f.others ? "the message lists other processes, but they do not account for all of it"
                  : "this wording does not say how much of it other processes held",
         std::nullopt});
  }
  if (f.unallocated * 20 >= f.tried) AddExpandable(&e, f);
  return e;
}

}  // namespace

OomExplanation ExplainOom(const OomMessage& message) {
  OomExplanation e = Decide(message);
  if (e.figures && e.figures->sysmem_fallback > 0) {
    e.remedies.push_back(
        {"sysmem_fallback", "",
         fmt::format("In the NVIDIA Control Panel (Manage 3D settings), set \"CUDA - Sysmem "
                     "Fallback Policy\" to \"Prefer No Sysmem Fallback\" for the job's "
                     "python.exe, and size the job to the card's own {}",
                     B(e.figures->total)),
         fmt::format("the {} that spilled to system memory was served over PCIe; without the "
                     "fallback the job fails fast at the card's size instead of crawling",
                     B(e.figures->sysmem_fallback)),
         std::nullopt});
  }
  return e;
}

void OmitRemediesInEffect(const model::AllocatorConfig& current, std::string_view source,
                          model::ConfigVersion version, OomExplanation* explanation) {
  const std::string base = model::ToConfString(current);
  std::vector<Remedy> kept;
  for (Remedy& r : explanation->remedies) {
    if (!r.alloc_conf.empty()) {
      const Result<model::AllocatorConfig> with = model::ParseAllocatorConfig(
          base.empty() ? r.alloc_conf : base + "," + r.alloc_conf, version);
      if (with.ok() && *with == current) {
        explanation->notes.push_back(
            fmt::format("{} is not proposed: the job already has it ({})", r.alloc_conf, source));
        continue;
      }
    }
    kept.push_back(std::move(r));
  }
  explanation->remedies = std::move(kept);
}

Result<Verification> VerifyRemedies(const std::vector<Event>& requests,
                                    const VerifyOptions& options, OomExplanation* explanation) {
  TuneOptions tune;
  tune.capacity_bytes = options.capacity_bytes;
  tune.used_by_others_bytes = options.used_by_others_bytes;
  tune.version = options.version;
  tune.threads = options.threads;
  tune.addresses = options.addresses;
  tune.recorded_from = options.recorded_from;
  tune.recorded_device_allocs = options.recorded_device_allocs;
  auto combined = [&](const std::string& conf) {
    if (options.current_conf.empty()) return conf;
    return options.current_conf + "," + conf;
  };
  auto add = [&](const std::string& conf) {
    // A setting the chosen PyTorch cannot say in its conf string (per_process_memory_fraction
    // before 2.9) stays untested rather than failing the others.
    if (!model::ParseAllocatorConfig(conf, options.version).ok()) return;
    if (std::find(tune.settings.begin(), tune.settings.end(), conf) == tune.settings.end()) {
      tune.settings.push_back(conf);
    }
  };
  tune.settings.push_back(options.current_conf);
  for (const Remedy& r : explanation->remedies) {
    if (!r.alloc_conf.empty()) add(r.whole_setting ? r.alloc_conf : combined(r.alloc_conf));
  }
  // The search (`fragscope tune`'s grid) runs in the same replays. PyTorch's XPU allocator
  // reads expandable_segments only, so of the search it tries the settings of that key alone.
  std::vector<std::string> searched;
  for (const std::string& conf : options.search) {
    if (IsXpu(*explanation)) {
      Result<model::AllocatorConfig> c = model::ParseAllocatorConfig(conf, options.version);
      model::AllocatorConfig only_expandable;
      if (c.ok()) only_expandable.expandable_segments = c->expandable_segments;
      if (!c.ok() || !(*c == only_expandable)) continue;
    }
    searched.push_back(conf);
    add(conf);
  }
  Result<std::vector<TuneOutcome>> outcomes = Tune(requests, tune);
  if (!outcomes.ok()) return outcomes.status();
  auto check_of = [&](const std::string& conf) -> std::optional<RemedyCheck> {
    for (const TuneOutcome& o : *outcomes) {
      if (o.conf != conf) continue;
      RemedyCheck c;
      c.oom = o.oom;
      c.oom_event = o.oom_event;
      c.oom_step = o.oom_step;
      c.peak_reserved = o.peak_reserved;
      if (o.oom && o.oom_reserved > 0) {
        c.fragmentation_at_oom = static_cast<double>(Sub(o.oom_reserved, o.oom_allocated)) /
                                 static_cast<double>(o.oom_reserved);
      }
      return c;
    }
    return std::nullopt;
  };
  Verification v;
  v.request_events = requests.size();
  v.options = options;
  v.current = *check_of(options.current_conf);
  v.reproduced = v.current.oom;
  v.cannot_rank = TuneCannotRank(*outcomes, tune);
  if (!v.cannot_rank.empty()) return v;  // replays of a rebuilt start state rank nothing
  auto worse = [&](const RemedyCheck& c) {
    return c.oom && (!v.current.oom || c.oom_event < v.current.oom_event);
  };
  std::optional<std::uint64_t> best_fix;  // the lowest peak of a remedy setting that fits
  for (Remedy& r : explanation->remedies) {
    if (r.alloc_conf.empty()) continue;
    r.check = check_of(r.whole_setting ? r.alloc_conf : combined(r.alloc_conf));
    if (!r.check) continue;
    r.check->worse = worse(*r.check);
    if (r.id == "expandable_segments" && r.check->worse && !IsXpu(*explanation)) {
      // The why above promises reuse; say what the replay found against it (docs/simulator.md,
      // "Expandable segments": the sample on 520 MiB fails at step 5 instead of step 18).
      r.why +=
          "; but in the replay it runs out sooner than the job's own settings: an expandable "
          "segment gives memory back to the driver only in whole pages (20 MiB for blocks over "
          "1 MiB), so freed ranges holding no whole page stay reserved, in pieces, whereas a "
          "freed cudaMalloc'd segment goes back whole";
    }
    if (!r.check->oom && (!best_fix || r.check->peak_reserved < *best_fix)) {
      best_fix = r.check->peak_reserved;
    }
  }
  // The search's best setting (Tune ranks fits first, then the lowest peak) joins the remedies
  // when it fits and no proposed setting fits with a peak as low: what `tune` finds is never
  // missing here.
  const Result<model::AllocatorConfig> current =
      model::ParseAllocatorConfig(options.current_conf, options.version);
  for (const TuneOutcome& o : *outcomes) {
    if (std::find(searched.begin(), searched.end(), o.conf) == searched.end()) continue;
    if (o.oom || (best_fix && *best_fix <= o.peak_reserved)) break;
    const Result<model::AllocatorConfig> c = model::ParseAllocatorConfig(o.conf, options.version);
    if (c.ok() && current.ok() && *c == *current) break;  // the job's own settings fit already
    Remedy r;
    r.id = "searched_setting";
    r.alloc_conf = o.conf;
    r.whole_setting = true;
    r.action =
        fmt::format("Set {}={}{}", ConfVariable(*explanation),
                    o.conf.empty() ? "\"\" (PyTorch's defaults)" : o.conf,
                    options.current_conf.empty() ? "" : " in place of the job's own setting");
    r.why = fmt::format(
        "the best of the {} settings `fragscope tune` tries by default, replayed with the "
        "remedies: no proposed setting fits with a peak as low",
        searched.size());
    r.check = check_of(o.conf);
    explanation->remedies.push_back(std::move(r));
    break;
  }
  // Re-rank: measured fixes (lowest peak first), untestable remedies, settings that fail (the
  // later OOM first), settings worse than the job's own.
  auto group = [](const Remedy& r) {
    if (!r.check) return 1;
    if (!r.check->oom) return 0;
    return r.check->worse ? 3 : 2;
  };
  std::stable_sort(explanation->remedies.begin(), explanation->remedies.end(),
                   [&](const Remedy& a, const Remedy& b) {
                     const int ga = group(a), gb = group(b);
                     if (ga != gb) return ga < gb;
                     if (ga == 0) return a.check->peak_reserved < b.check->peak_reserved;
                     if (ga >= 2) return a.check->oom_event > b.check->oom_event;
                     return false;
                   });
  return v;
}

}  // namespace fragscope::analysis
