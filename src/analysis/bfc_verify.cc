#include "analysis/bfc_verify.h"

#include <algorithm>
#include <charconv>
#include <map>
#include <unordered_map>

#include <fmt/format.h>

#include "analysis/tune_bfc.h"
#include "common/units.h"

namespace fragscope::analysis {

namespace {

std::optional<bool> Boolean(std::string_view v) {
  if (v == "true" || v == "True" || v == "1") return true;
  if (v == "false" || v == "False" || v == "0") return false;
  return std::nullopt;
}

std::optional<double> Fraction(std::string_view v) {
  double f = 0;
  const auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), f);
  if (ec != std::errc() || end != v.data() + v.size() || !(f > 0.0) || f > 1.0) {
    return std::nullopt;
  }
  return f;
}

// The trace's live bytes (rounded to the BFC's 256 bytes) against `limit` per device: what an
// allocator with no pool to fragment could at best do. Event indices as the replayer counts.
RemedyCheck LiveBytesBound(const std::vector<Event>& requests, std::uint64_t limit) {
  RemedyCheck c;
  std::map<std::int32_t, std::uint64_t> live;
  std::map<std::int32_t, std::unordered_map<std::uint64_t, std::uint64_t>> size_of;
  std::int64_t step = -1;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Event& e = requests[i];
    if (e.action == Action::kStep) step = e.step;
    if (e.action == Action::kAlloc) {
      const std::uint64_t bytes = BfcRoundedBytes(e.size);
      std::uint64_t& used = live[e.device];
      if (used + bytes > limit) {
        c.oom = true;
        c.oom_event = i;
        c.oom_step = step;
        return c;
      }
      used += bytes;
      size_of[e.device][e.addr] = bytes;
      c.peak_reserved = std::max(c.peak_reserved, used);
    } else if (e.action == Action::kFreeRequested || e.action == Action::kFreeCompleted) {
      auto& sizes = size_of[e.device];
      if (const auto it = sizes.find(e.addr); it != sizes.end()) {
        live[e.device] -= it->second;
        sizes.erase(it);
      }
    }
  }
  return c;
}

RemedyCheck CheckOf(const BfcTuneOutcome& o) {
  RemedyCheck c;
  c.oom = o.oom;
  c.oom_event = o.oom_event;
  c.oom_step = o.oom_step;
  c.peak_reserved = o.peak_pool_bytes;
  return c;
}

}  // namespace

model::BfcSettings JobBfcSettings(const BfcReport& r, const BfcLogContext& ctx, std::string* why) {
  model::BfcSettings s;
  const std::uint64_t limit = r.memory_limit.value_or(r.Stat("Limit").value_or(0));
  if (limit > 0) s.memory_limit = limit;
  const std::uint64_t regions = std::max<std::uint64_t>(r.regions.size(), r.map_regions);
  const std::uint64_t pool = r.map_regions > 0 ? r.map_region_bytes : r.region_bytes.value_or(0);
  std::string said;
  if (r.growth) {
    s.allow_growth = *r.growth;
    said = *r.growth ? "the dump says \"growth enabled\"" : "the dump says growth is disabled";
  } else if (const auto v = ctx.Setting("TF_FORCE_GPU_ALLOW_GROWTH"); v && Boolean(*v)) {
    s.allow_growth = *Boolean(*v);
    said = "the log sets TF_FORCE_GPU_ALLOW_GROWTH=" + *v;
  } else if (const auto p = ctx.Setting("XLA_PYTHON_CLIENT_PREALLOCATE"); p && Boolean(*p)) {
    s.allow_growth = !*Boolean(*p);
    said = "the log sets XLA_PYTHON_CLIENT_PREALLOCATE=" + *p;
  } else if (regions > 1) {
    s.allow_growth = true;
    said = fmt::format("the pool grew in {} regions: memory growth", regions);
  } else if (pool > 0 && limit > 0 && pool < limit) {
    s.allow_growth = true;
    said = fmt::format("the pool ({}) is smaller than the limit: memory growth", FormatBytes(pool));
  } else if (regions == 1) {
    s.allow_growth = false;
    said = "the pool is one region of the whole limit: preallocation";
  } else {
    s.allow_growth = false;
    said = "the log shows no regions: preallocation, the frameworks' default on a GPU";
  }
  if (why != nullptr) {
    *why = limit > 0 ? fmt::format("memory limit {} from the log; {}", FormatBytes(limit), said)
                     : said;
  }
  return s;
}

std::optional<model::BfcSettings> ApplyBfcRemedy(const std::string& setting,
                                                 const model::BfcSettings& current,
                                                 bool capacity_known, BfcCheckKind* kind,
                                                 std::string* why_not) {
  if (why_not != nullptr) *why_not = "not a setting the BFC model replays";
  const std::size_t eq = setting.find('=');
  if (eq == std::string::npos) return std::nullopt;
  const std::string key = setting.substr(0, eq);
  const std::string value = setting.substr(eq + 1);
  model::BfcSettings s = current;
  *kind = BfcCheckKind::kModel;
  if (key == "TF_GPU_ALLOCATOR" || key == "XLA_PYTHON_CLIENT_ALLOCATOR") {
    *kind = BfcCheckKind::kBound;
    return s;
  }
  if (key == "TF_FORCE_GPU_ALLOW_GROWTH" || key == "XLA_PYTHON_CLIENT_PREALLOCATE") {
    const std::optional<bool> b = Boolean(value);
    if (!b) return std::nullopt;
    s.allow_growth = key == "TF_FORCE_GPU_ALLOW_GROWTH" ? *b : !*b;
    return s;
  }
  if (key == "TF_ENABLE_GPU_GARBAGE_COLLECTION") {
    const std::optional<bool> b = Boolean(value);
    if (!b) return std::nullopt;
    s.garbage_collection = *b;
    return s;
  }
  if (key == "per_process_gpu_memory_fraction" || key == "XLA_PYTHON_CLIENT_MEM_FRACTION") {
    const std::optional<double> f = Fraction(value);
    if (!f) return std::nullopt;
    if (!capacity_known) {
      if (why_not != nullptr) *why_not = "a fraction of the device needs its size (--capacity)";
      return std::nullopt;
    }
    s.memory_limit.reset();
    s.memory_fraction = *f;
    return s;
  }
  if (key == "memory_limit") {  // a logical device's memory_limit, in MB (MiB) as TF takes it
    std::uint64_t mb = 0;
    const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), mb);
    if (ec != std::errc() || end != value.data() + value.size() || mb == 0 || mb > (1ull << 40)) {
      return std::nullopt;
    }
    s.memory_limit = mb << 20;
    return s;
  }
  return std::nullopt;
}

Result<BfcVerification> VerifyBfcRemedies(const std::vector<Event>& requests,
                                          const BfcReport& report, const BfcLogContext& context,
                                          const BfcVerifyOptions& options,
                                          BfcExplanation* explanation) {
  BfcVerification v;
  v.options = options;
  v.request_events = requests.size();
  model::BfcSettings current;
  if (options.current_conf) {
    Result<model::BfcSettings> parsed = model::ParseBfcSettings(*options.current_conf);
    if (!parsed.ok()) return Status::InvalidArgument("--bfc-conf: " + parsed.status().message());
    current = *parsed;
    v.current_from = "--bfc-conf";
  } else {
    current = JobBfcSettings(report, context, &v.current_from);
  }
  if (!current.memory_limit && options.capacity_bytes == 0) {
    return Status::InvalidArgument(
        "the log gives no memory limit and no --capacity says the device's size: nothing bounds "
        "the replay (give --capacity, or --bfc-conf memory_limit:SIZE)");
  }
  v.current_conf = model::ToBfcConfString(current);

  // One replay per distinct setting: the job's first, then each remedy's.
  const bool capacity_known = options.capacity_bytes > 0;
  std::vector<std::string> confs = {v.current_conf};
  std::vector<std::optional<std::string>> conf_of(explanation->remedies.size());
  std::vector<BfcCheckKind> kind_of(explanation->remedies.size(), BfcCheckKind::kModel);
  std::vector<bool> bound(explanation->remedies.size(), false);
  for (std::size_t i = 0; i < explanation->remedies.size(); ++i) {
    const Remedy& r = explanation->remedies[i];
    if (r.setting.empty()) continue;
    std::string why_not;
    std::optional<model::BfcSettings> s =
        ApplyBfcRemedy(r.setting, current, capacity_known, &kind_of[i], &why_not);
    if (!s) {
      v.not_replayed.push_back(r.setting + ": " + why_not);
      continue;
    }
    if (kind_of[i] == BfcCheckKind::kBound) {
      bound[i] = true;
      continue;
    }
    conf_of[i] = model::ToBfcConfString(*s);
    if (std::find(confs.begin(), confs.end(), *conf_of[i]) == confs.end()) {
      confs.push_back(*conf_of[i]);
    }
  }
  Result<std::vector<BfcTuneOutcome>> tuned =
      TuneBfc(requests, options.capacity_bytes, options.used_by_others_bytes, confs);
  if (!tuned.ok()) return tuned.status();
  std::map<std::string, const BfcTuneOutcome*> by_conf;
  for (const BfcTuneOutcome& o : *tuned) by_conf[o.conf] = &o;
  const BfcTuneOutcome& job = *by_conf.at(v.current_conf);
  v.current = CheckOf(job);
  v.limit_bytes = job.limit_bytes;
  v.reproduced = job.oom;

  for (std::size_t i = 0; i < explanation->remedies.size(); ++i) {
    Remedy& r = explanation->remedies[i];
    RemedyCheck c;
    if (conf_of[i]) {
      c = CheckOf(*by_conf.at(*conf_of[i]));
    } else if (bound[i]) {
      c = LiveBytesBound(requests, v.limit_bytes);
    } else {
      continue;
    }
    c.worse = c.oom && (!v.current.oom || c.oom_event < v.current.oom_event);
    r.check = c;
    v.kinds.emplace_back(r.id, kind_of[i]);
  }

  // Fits in the model first (lowest peak pool), then fits by the bound (evidence of a weaker
  // kind), then the untested in their order, then still-OOM (later first), then worse than the
  // job's own settings.
  const auto is_bound = [&v](const Remedy& r) {
    return std::find(v.kinds.begin(), v.kinds.end(), std::pair(r.id, BfcCheckKind::kBound)) !=
           v.kinds.end();
  };
  const auto rank = [&is_bound](const Remedy& r) {
    if (!r.check) return 2;
    if (!r.check->oom) return is_bound(r) ? 1 : 0;
    return r.check->worse ? 4 : 3;
  };
  const auto before = [&rank](const Remedy& a, const Remedy& b) {
    const int ra = rank(a);
    const int rb = rank(b);
    if (ra != rb) return ra < rb;
    if (ra <= 1) return a.check->peak_reserved < b.check->peak_reserved;
    if (ra >= 3) return a.check->oom_event > b.check->oom_event;
    return false;
  };
  std::stable_sort(explanation->remedies.begin(), explanation->remedies.end(), before);
  return v;
}

}  // namespace fragscope::analysis
