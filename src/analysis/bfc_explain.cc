#include "analysis/bfc_explain.h"

#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "common/units.h"

namespace fragscope::analysis {
namespace {

std::string Bytes(std::uint64_t bytes) { return FormatBytesLikePyTorch(bytes); }

bool Is(const std::string& framework, std::string_view name) {
  return framework.empty() || framework == name;
}

// A fraction F of `total` that holds `need`, rounded up to a hundredth (at most .99).
std::string FractionFor(std::uint64_t need, std::uint64_t total) {
  const double f = std::min(
      0.99, std::ceil(100.0 * static_cast<double>(need) / static_cast<double>(total)) / 100.0);
  return fmt::format("{:.2f}", f);
}

void AddRemedy(BfcExplanation* e, std::string id, std::string setting, std::string action,
               std::string why) {
  Remedy r;
  r.id = std::move(id);
  r.setting = std::move(setting);
  r.action = std::move(action);
  r.why = std::move(why);
  e->remedies.push_back(std::move(r));
}

std::string WordingOf(const BfcReport& r) {
  switch (r.kind) {
    case BfcReportKind::kJaxOom:
      return "XLA's \"Out of memory while trying to allocate N bytes\" without the allocator's "
             "dump";
    case BfcReportKind::kCudaMallocAsync:
      return "cuda_malloc_async's \"cuMemAllocAsync failed to allocate\" (TF_GPU_ALLOCATOR="
             "cuda_malloc_async)";
    case BfcReportKind::kBfc:
      break;
  }
  std::string era = "BFC allocator dump";
  if (r.source_file.find("common_runtime/gpu/gpu_bfc") != std::string::npos) {
    era += " (TensorFlow 0.x gpu_bfc_allocator.cc)";
  } else if (r.source_file.find("core/common_runtime") != std::string::npos) {
    era += " (TensorFlow 1.x-2.8 core/common_runtime/bfc_allocator.cc)";
  } else if (r.source_file.find("tsl/framework") != std::string::npos &&
             r.source_file.find("xla/") == std::string::npos) {
    era += " (TensorFlow 2.9-2.15 tsl/framework/bfc_allocator.cc)";
  } else if (r.source_file.find("xla/tsl/framework") != std::string::npos) {
    era += " (XLA xla/tsl/framework/bfc_allocator.cc: TensorFlow 2.16+, JAX)";
  } else if (!r.source_file.empty()) {
    era += " (" + r.source_file + ")";
  }
  if (r.summary_largest || r.growth) era += ", with the allocator memory summary";
  return era;
}

// The remedies of a BFC failure, best first, in `framework`'s terms ("" for both).
void BfcRemedies(const BfcReport& r, const BfcLogContext& ctx, const std::string& framework,
                 BfcExplanation* e) {
  const bool tf = Is(framework, "tensorflow");
  const bool jax = Is(framework, "jax");
  const std::string tf_label = framework.empty() ? "TensorFlow: " : "";
  const std::string jax_label = framework.empty() ? "JAX: " : "";
  const std::optional<BfcFigures>& f = e->figures;
  const std::uint64_t need = f ? f->in_use + f->request : 0;  // U + S
  // Plain values, not optionals: GCC 12 warns of maybe-uninitialized optionals here.
  const bool has_total = f && f->device_total.has_value();
  const std::uint64_t total = has_total ? *f->device_total : 0;
  switch (e->verdict) {
    case OomVerdict::kFragmentation:
      if (tf) {
        AddRemedy(e, "cuda_malloc_async", "TF_GPU_ALLOCATOR=cuda_malloc_async",
                  tf_label +
                      "set TF_GPU_ALLOCATOR=cuda_malloc_async (CUDA's stream-ordered pool "
                      "in place of the BFC allocator)",
                  fmt::format("{} free in the pool were stranded in chunks smaller than the {} "
                              "request; CUDA's pool maps memory for each request and is not "
                              "bound to the BFC chunks",
                              Bytes(e->stranded), Bytes(f->request)));
      }
      if (jax) {
        AddRemedy(e, "platform_allocator", "XLA_PYTHON_CLIENT_ALLOCATOR=platform",
                  jax_label +
                      "set XLA_PYTHON_CLIENT_ALLOCATOR=platform (allocate and free "
                      "exactly what is needed, no pool to fragment; slower)",
                  fmt::format("{} free in the pool were stranded in chunks smaller than the {} "
                              "request",
                              Bytes(e->stranded), Bytes(f->request)));
      }
      if (r.regions.size() > 1 || r.map_regions > 1) {
        if (tf) {
          AddRemedy(e, "memory_growth_off", "TF_FORCE_GPU_ALLOW_GROWTH=false",
                    tf_label +
                        "turn memory growth off (no set_memory_growth, "
                        "TF_FORCE_GPU_ALLOW_GROWTH unset or false): the pool is one region "
                        "from the start",
                    fmt::format("the pool grew in {} regions; free chunks never coalesce across "
                                "region boundaries",
                                std::max<std::uint64_t>(r.regions.size(), r.map_regions)));
        }
        if (jax) {
          AddRemedy(e, "preallocate", "XLA_PYTHON_CLIENT_PREALLOCATE=true",
                    jax_label +
                        "keep XLA_PYTHON_CLIENT_PREALLOCATE at its default (true): the "
                        "pool is one region from the start",
                    fmt::format("the pool grew in {} regions; free chunks never coalesce across "
                                "region boundaries",
                                std::max<std::uint64_t>(r.regions.size(), r.map_regions)));
        }
      }
      if (tf && ctx.Setting("TF_ENABLE_GPU_GARBAGE_COLLECTION") == "false") {
        AddRemedy(e, "garbage_collection", "TF_ENABLE_GPU_GARBAGE_COLLECTION=true",
                  tf_label + "re-enable TF_ENABLE_GPU_GARBAGE_COLLECTION (the log sets it false)",
                  "with it, regions left wholly free are returned and a larger one allocated");
      }
      break;
    case OomVerdict::kCap:
      if (tf) {
        const std::string setting =
            has_total ? "per_process_gpu_memory_fraction=" + FractionFor(need, total)
                      : fmt::format("memory_limit={}", (need + (1u << 20) - 1) >> 20);
        AddRemedy(
            e, "memory_limit", setting,
            tf_label + (has_total
                            ? fmt::format("raise per_process_gpu_memory_fraction to {} "
                                          "(or a logical device's memory_limit to {} MB)",
                                          FractionFor(need, total), (need + (1u << 20) - 1) >> 20)
                            : fmt::format("raise the logical device's memory_limit (or "
                                          "per_process_gpu_memory_fraction) to at least "
                                          "{} MB",
                                          (need + (1u << 20) - 1) >> 20)),
            fmt::format("in use {} + request {} = {} > the limit {}", Bytes(f->in_use),
                        Bytes(f->request), Bytes(need), Bytes(f->limit)));
      }
      if (jax) {
        AddRemedy(e, "mem_fraction",
                  has_total ? "XLA_PYTHON_CLIENT_MEM_FRACTION=" + FractionFor(need, total)
                            : "XLA_PYTHON_CLIENT_MEM_FRACTION",
                  jax_label +
                      (has_total ? "set XLA_PYTHON_CLIENT_MEM_FRACTION=" + FractionFor(need, total)
                                 : std::string("raise XLA_PYTHON_CLIENT_MEM_FRACTION (the "
                                               "default .75 of the GPU)")),
                  fmt::format("in use {} + request {} = {} > the limit {}", Bytes(f->in_use),
                              Bytes(f->request), Bytes(need), Bytes(f->limit)));
      }
      break;
    case OomVerdict::kOtherProcesses:
      AddRemedy(e, "free_device", "",
                "free the GPU of other processes (nvidia-smi lists them), or give each its share",
                fmt::format("the pool could still grow by {} under its limit, but the device "
                            "refused the new region",
                            f ? Bytes(f->room) : std::string("?")));
      if (tf) {
        AddRemedy(e, "memory_growth", "TF_FORCE_GPU_ALLOW_GROWTH=true",
                  tf_label +
                      "in TensorFlow processes sharing the GPU, turn memory growth on "
                      "(TF_FORCE_GPU_ALLOW_GROWTH=true): each takes only what it uses",
                  "by default TensorFlow reserves nearly all of the GPU for one process");
      }
      if (jax) {
        AddRemedy(e, "no_preallocate", "XLA_PYTHON_CLIENT_PREALLOCATE=false",
                  jax_label +
                      "in JAX processes sharing the GPU, set "
                      "XLA_PYTHON_CLIENT_PREALLOCATE=false",
                  "by default each JAX process takes 75% of the GPU at its start");
      }
      break;
    case OomVerdict::kShortage:
    case OomVerdict::kUndetermined:
      break;
  }
  if (e->verdict == OomVerdict::kShortage || e->verdict == OomVerdict::kCap ||
      e->verdict == OomVerdict::kUndetermined) {
    const std::string shape =
        r.tensor_shape.empty() ? std::string() : " (the failing tensor: " + r.tensor_shape + ")";
    AddRemedy(e, "smaller_batch", "", "use a smaller batch or sequence" + shape,
              f ? fmt::format("the job needs at least {} at this point", Bytes(need))
                : "the log does not give the figures to say by how much");
    if (tf) {
      AddRemedy(e, "mixed_precision", "",
                tf_label +
                    "compute in mixed precision: "
                    "tf.keras.mixed_precision.set_global_policy(\"mixed_float16\")",
                "activations take half the bytes");
    }
    if (jax) {
      AddRemedy(e, "rematerialize", "",
                jax_label +
                    "recompute activations in the backward pass (jax.checkpoint) or keep "
                    "them in bfloat16",
                "activations are most of a training step's peak");
      if (!ctx.Setting("XLA_PYTHON_CLIENT_MEM_FRACTION") && e->verdict != OomVerdict::kCap) {
        AddRemedy(e, "mem_fraction", "XLA_PYTHON_CLIENT_MEM_FRACTION=.95",
                  jax_label +
                      "if the limit is JAX's default share of the GPU (75%), raise it: "
                      "XLA_PYTHON_CLIENT_MEM_FRACTION=.95",
                  f ? fmt::format("the limit {} may be 75% of the GPU", Bytes(f->limit))
                    : std::string("JAX takes 75% of the GPU by default"));
      }
    }
    if (f && (!has_total || need > total)) {
      AddRemedy(e, "larger_gpu", "",
                fmt::format("run on a GPU with more than {} free", Bytes(need)),
                "in use + request, with nothing else on the device");
    }
  }
}

void ExplainDump(const BfcReport& r, const BfcLogContext& ctx,
                 std::optional<std::uint64_t> capacity, BfcExplanation* e) {
  // S: the rounded request.
  std::optional<std::uint64_t> request = r.rounded;
  if (!request && r.request) {
    request = BfcRoundedBytes(*r.request);
    if (!r.request_exact) {
      e->notes.push_back(
          "the request is known only as printed (3 significant digits): "
          "comparisons within that rounding are uncertain");
    }
  }
  // U, P, L, G from the most exact source the log gives.
  std::optional<std::uint64_t> in_use = r.map_complete    ? std::optional(r.map_in_use)
                                        : r.Stat("InUse") ? r.Stat("InUse")
                                                          : r.sum_in_use;
  std::optional<std::uint64_t> pool =
      r.map_complete ? std::optional(r.map_region_bytes) : r.region_bytes;
  if (!pool && r.map_regions > 0) pool = r.map_region_bytes;
  const std::uint64_t limit_bytes = r.memory_limit.value_or(r.Stat("Limit").value_or(0));
  const bool limit = limit_bytes > 0;  // 0: not printed (cuda_malloc_async prints Limit 0)
  std::optional<std::uint64_t> largest;
  if (r.summary_largest) {
    largest = r.summary_largest;
  } else if (r.map_complete) {
    largest = r.map_largest_free;
  } else if (r.Stat("LargestFreeBlock").value_or(0) > 0) {
    largest = r.Stat("LargestFreeBlock");
  }
  if (!r.map_complete && r.map_regions > 0) {
    e->notes.push_back(fmt::format(
        "the chunk map is incomplete (lines missing or cut): its figures ({} in use, {} free, "
        "largest free chunk {}) cover only the chunks listed",
        Bytes(r.map_in_use), Bytes(r.map_free), Bytes(r.map_largest_free)));
    if (!largest && r.map_largest_free > 0) {
      e->notes.push_back(
          "the largest free chunk is at least the largest listed one; the verdict takes that");
      largest = r.map_largest_free;
    }
  }
  if (!request) e->missing.push_back("ran out of memory trying to allocate");
  if (!in_use) e->missing.push_back("Sum Total of in-use chunks (or Stats InUse)");
  if (!pool) e->missing.push_back("total_region_allocated_bytes_ (or the regions)");
  if (!limit) e->missing.push_back("memory_limit_ (or Stats Limit)");
  if (!request || !in_use || !pool) {
    e->summary = "undetermined: the log lacks figures the verdict needs (see Missing)";
    return;
  }
  BfcFigures f;
  f.request = *request;
  f.pool = *pool;
  f.in_use = *in_use;
  f.limit = limit_bytes;
  if (f.in_use > f.pool) {
    e->notes.push_back(
        fmt::format("in use {} exceeds the pool {}: the figures disagree (a "
                    "rounded print, or lines from different dumps?)",
                    Bytes(f.in_use), Bytes(f.pool)));
    f.in_use = f.pool;
  }
  f.free_in_pool = f.pool - f.in_use;
  f.largest_free = largest.value_or(0);
  f.largest_known = largest.has_value();
  f.room = limit && limit_bytes > f.pool ? (limit_bytes - f.pool) & ~(kBfcMinAllocation - 1) : 0;
  f.device_total = capacity ? capacity : ctx.device_total;
  e->figures = f;

  e->reasons.push_back(fmt::format("request S = {} (rounded to 256 bytes: {} bytes)",
                                   Bytes(f.request), FormatCount(f.request)));
  e->reasons.push_back(fmt::format("free in the pool F = pool P {} - in use U {} = {}",
                                   Bytes(f.pool), Bytes(f.in_use), Bytes(f.free_in_pool)));
  if (f.largest_known) {
    e->reasons.push_back(fmt::format("largest free chunk G = {} {} S", Bytes(f.largest_free),
                                     f.largest_free >= f.request ? ">=" : "<"));
  }
  if (limit) {
    e->reasons.push_back(fmt::format("room to grow A = limit L {} - P {} = {} {} S", Bytes(f.limit),
                                     Bytes(f.pool), Bytes(f.room),
                                     f.room >= f.request ? ">=" : "<"));
  }

  if (f.largest_known && f.largest_free >= f.request) {
    e->verdict = OomVerdict::kUndetermined;
    e->summary = fmt::format(
        "undetermined: a free chunk of {} (>= the request {}) was in the pool; what kept it from "
        "the request is not in the log (alignment, or a chunk freed on another stream and not yet "
        "safe to reuse)",
        Bytes(f.largest_free), Bytes(f.request));
  } else if (f.free_in_pool >= f.request) {
    e->verdict = OomVerdict::kFragmentation;
    e->stranded = f.free_in_pool;
    e->summary = fmt::format(
        "fragmentation: {} were free in the pool (F >= S = {}), but no free chunk was as large "
        "as the request{}",
        Bytes(f.free_in_pool), Bytes(f.request),
        f.largest_known ? fmt::format(" (the largest: {})", Bytes(f.largest_free)) : std::string());
    if (limit && f.room < f.request) {
      e->reasons.push_back("F >= S > G and A < S: fragmentation (the pool could not grow)");
    } else if (limit) {
      e->reasons.push_back(
          "F >= S > G; the pool could have grown by A >= S, but the device refused the region");
    }
  } else if (limit && f.room >= f.request) {
    e->verdict = OomVerdict::kOtherProcesses;
    e->summary = fmt::format(
        "the device ran out: the pool could grow by {} under its limit (A >= S = {}), but the "
        "GPU refused the new region; memory outside this allocator (other processes, another "
        "allocator) held it",
        Bytes(f.room), Bytes(f.request));
    e->reasons.push_back("F < S <= A: the limit allowed the growth, the device did not");
    if (ctx.driver_failures > 0) {
      e->reasons.push_back(
          fmt::format("the log shows {} \"failed to allocate ... from device: "
                      "CUDA_ERROR_OUT_OF_MEMORY\" line{}",
                      ctx.driver_failures, ctx.driver_failures == 1 ? "" : "s"));
    }
  } else {
    e->shortfall = f.request - std::min(f.request, f.free_in_pool + f.room);
    const std::uint64_t need = f.in_use + f.request;
    const std::optional<std::string> fraction =
        ctx.Setting("XLA_PYTHON_CLIENT_MEM_FRACTION")
            ? ctx.Setting("XLA_PYTHON_CLIENT_MEM_FRACTION")
        : ctx.Setting("XLA_CLIENT_MEM_FRACTION") ? ctx.Setting("XLA_CLIENT_MEM_FRACTION")
                                                 : ctx.Setting("per_process_gpu_memory_fraction");
    const bool below_card = f.device_total && need <= *f.device_total * 95 / 100;
    if (limit && (fraction || below_card)) {
      e->verdict = OomVerdict::kCap;
      e->summary = fmt::format(
          "cap: the allocator's limit {} was the bound: in use {} + request {} = {} > L{}",
          Bytes(f.limit), Bytes(f.in_use), Bytes(f.request), Bytes(need),
          below_card ? fmt::format(", on a GPU of {}", Bytes(*f.device_total)) : std::string());
      if (fraction) e->reasons.push_back("the log sets a memory fraction: " + *fraction);
      if (below_card) {
        e->reasons.push_back(
            fmt::format("U + S = {} <= 95% of the device's {}: it would fit "
                        "the card",
                        Bytes(need), Bytes(*f.device_total)));
      }
    } else {
      e->verdict = OomVerdict::kShortage;
      e->summary = fmt::format(
          "shortage: free in the pool {}{} < request {}: {} short even if every free byte were "
          "one chunk",
          Bytes(f.free_in_pool),
          limit ? fmt::format(" + room to grow {}", Bytes(f.room)) : std::string(),
          Bytes(f.request), Bytes(e->shortfall));
      if (f.free_in_pool + f.room >= f.request) {
        e->shortfall = 0;
        e->summary = fmt::format(
            "shortage at the limit: neither the pool's free bytes ({}) nor its room to grow ({}) "
            "holds the request {}, though together they would",
            Bytes(f.free_in_pool), Bytes(f.room), Bytes(f.request));
      }
      if (!limit) e->summary += " (the limit is unknown: the pool may have been able to grow)";
    }
  }
  if (ctx.garbage_collections > 0) {
    e->notes.push_back(
        fmt::format("TensorFlow's garbage collection of free regions ran {} time{} "
                    "before the failure",
                    ctx.garbage_collections, ctx.garbage_collections == 1 ? "" : "s"));
  }
}

void ExplainAsync(const BfcReport& r, BfcExplanation* e) {
  if (!r.request) e->missing.push_back("cuMemAllocAsync failed to allocate N bytes");
  if (!r.device_free) e->missing.push_back("Free memory/Total memory");
  if (!r.pool_reserved || !r.pool_used) {
    e->notes.push_back(
        "the pool's CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT / USED_MEM_CURRENT are "
        "not in the log: its cached free bytes are unknown");
  }
  if (!r.request || !r.device_free) {
    e->summary = "undetermined: the log lacks figures the verdict needs (see Missing)";
    return;
  }
  const std::uint64_t s = *r.request;
  const std::uint64_t free = *r.device_free;
  const std::uint64_t cached = r.pool_reserved && r.pool_used && *r.pool_reserved > *r.pool_used
                                   ? *r.pool_reserved - *r.pool_used
                                   : 0;
  BfcFigures f;
  f.request = s;
  f.pool = r.pool_reserved.value_or(0);
  f.in_use = r.pool_used ? *r.pool_used : r.Stat("InUse").value_or(0);
  f.free_in_pool = cached;
  f.room = free;
  f.limit = r.Stat("Limit").value_or(0);
  f.device_total = r.device_total;
  e->figures = f;
  e->reasons.push_back(
      fmt::format("request S = {}; the device's free memory D = {}{}", Bytes(s), Bytes(free),
                  r.device_total ? " of " + Bytes(*r.device_total) : std::string()));
  if (r.pool_reserved && r.pool_used) {
    e->reasons.push_back(fmt::format("the pool's cached free C = reserved {} - used {} = {}",
                                     Bytes(*r.pool_reserved), Bytes(*r.pool_used), Bytes(cached)));
  }
  if (free >= s) {
    e->verdict = OomVerdict::kUndetermined;
    e->summary = fmt::format(
        "undetermined: the device reported {} free (>= the request {}); a "
        "limit the log does not print (MIG slice, another pool) was the bound",
        Bytes(free), Bytes(s));
  } else if (cached >= s) {
    e->verdict = OomVerdict::kFragmentation;
    e->stranded = cached;
    e->summary = fmt::format(
        "fragmentation: the pool held {} free (C >= S = {}) but not in one "
        "piece, and the device had only {}",
        Bytes(cached), Bytes(s), Bytes(free));
  } else {
    e->verdict = OomVerdict::kShortage;
    e->shortfall = s - std::min(s, free + cached);
    e->summary = fmt::format("shortage: the device's free {} + the pool's cached {} < request {}",
                             Bytes(free), Bytes(cached), Bytes(s));
    if (e->shortfall == 0) {
      e->summary = fmt::format(
          "shortage: neither the device's free {} nor the pool's cached {} "
          "holds the request {}, though together they would",
          Bytes(free), Bytes(cached), Bytes(s));
    }
  }
}

}  // namespace

std::array<BfcBinUse, kBfcNumBins> BfcBinUses(const BfcReport& report) {
  std::array<BfcBinUse, kBfcNumBins> bins{};
  for (int i = 0; i < kBfcNumBins; ++i) bins[static_cast<std::size_t>(i)].bin = i;
  for (const BfcRegion& g : report.regions) {
    for (const BfcChunk& c : g.chunks) {
      BfcBinUse& b = bins[static_cast<std::size_t>(BfcBinForSize(c.size))];
      ++b.chunks;
      b.bytes += c.size;
      if (!c.in_use) {
        ++b.free_chunks;
        b.free_bytes += c.size;
        b.largest_free = std::max(b.largest_free, c.size);
      }
    }
  }
  return bins;
}

BfcExplanation ExplainBfc(const BfcReport& report, const BfcLogContext& context,
                          std::optional<std::uint64_t> capacity) {
  BfcExplanation e;
  e.framework = context.framework;
  e.allocator = report.allocator;
  e.wording = WordingOf(report);
  e.line = report.line;
  e.last_line = report.last_line;
  for (const std::string& n : report.notes) e.notes.push_back(n);
  switch (report.kind) {
    case BfcReportKind::kBfc:
      ExplainDump(report, context, capacity, &e);
      break;
    case BfcReportKind::kJaxOom:
      e.missing.push_back(
          "the BFC allocator's dump (\"ran out of memory trying to allocate\", "
          "the chunk map, Stats): run with TF_CPP_MIN_LOG_LEVEL=0 to get it");
      e.summary = fmt::format(
          "undetermined: XLA failed to allocate {} but the log has no "
          "allocator figures",
          report.request ? Bytes(*report.request) : std::string("?"));
      if (report.buffer_total) {
        e.notes.push_back(
            fmt::format("XLA's buffer assignment: this program needs {} on the "
                        "device",
                        Bytes(*report.buffer_total)));
      }
      if (e.framework.empty()) e.framework = "jax";
      break;
    case BfcReportKind::kCudaMallocAsync:
      ExplainAsync(report, &e);
      break;
  }
  if (!report.regions.empty()) e.bins = BfcBinUses(report);
  if (report.kind == BfcReportKind::kCudaMallocAsync) {
    if (e.verdict == OomVerdict::kFragmentation) {
      AddRemedy(&e, "bfc_allocator", "TF_GPU_ALLOCATOR unset",
                "go back to the BFC allocator (unset TF_GPU_ALLOCATOR), or lower the pool's "
                "release threshold so freed memory returns to the device",
                fmt::format("{} sat in the pool, cached but unusable for this request",
                            Bytes(e.stranded)));
    }
    const std::uint64_t need = e.figures ? e.figures->in_use + e.figures->request : 0;
    AddRemedy(&e, "smaller_batch", "", "use a smaller batch or sequence",
              e.figures ? fmt::format("the job needs at least {} at this point", Bytes(need))
                        : "the log does not give the figures to say by how much");
    AddRemedy(&e, "free_device", "", "free the GPU of other processes (nvidia-smi lists them)",
              "the device's free memory is what the pool grows into");
  } else {
    BfcRemedies(report, context, e.framework, &e);
  }
  return e;
}

}  // namespace fragscope::analysis
