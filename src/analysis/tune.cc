#include "analysis/tune.h"

#include <algorithm>
#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string_view>
#include <thread>
#include <utility>

#include <fmt/format.h>

#include "common/units.h"
#include "model/request_replayer.h"

namespace fragscope::analysis {

namespace {

struct RunResult {
  Status status;  // a trace error (not an OOM)
  TuneOutcome outcome;
  std::unique_ptr<model::RequestReplayer> replayer;  // the finished run, for WouldMatch
};

// One replay of the whole trace on devices of `capacity` bytes, or with the options' own
// sizes (`capacity` unset).
RunResult ReplayOnce(const std::vector<Event>& events, const model::AllocatorConfig& config,
                     const TuneOptions& options, std::optional<std::uint64_t> capacity) {
  RunResult r;
  auto sim_options = [&](std::int32_t device) {
    model::SimOptions o;
    o.config = config;
    o.version = options.version;
    o.driver.capacity_bytes = options.capacity_bytes;
    if (capacity) {
      o.driver.capacity_bytes = *capacity;
    } else if (const auto own = options.device_capacity_bytes.find(device);
               own != options.device_capacity_bytes.end()) {
      o.driver.capacity_bytes = own->second;
    }
    o.driver.used_by_others_bytes = options.used_by_others_bytes;
    if (const auto plan = options.addresses.find(device); plan != options.addresses.end()) {
      plan->second.Attach(&o.driver);
    }
    return o;
  };
  r.replayer = std::make_unique<model::RequestReplayer>(sim_options, model::OomPolicy::kStop,
                                                        std::function<void(const Event&)>());
  model::RequestReplayer& replayer = *r.replayer;
  // The requests that rebuild a snapshot's start state are not part of the run: each device's
  // peaks restart where its recorded requests begin (or, without any, at the end).
  std::vector<std::pair<std::size_t, std::int32_t>> resets;
  for (const auto& [device, from] : options.recorded_from) resets.emplace_back(from, device);
  std::sort(resets.begin(), resets.end());
  std::size_t done = 0;
  Status replayed;
  // Each device's device allocations when its recorded requests begin (the rebuild's).
  std::map<std::int32_t, std::int64_t> allocs_before;
  for (const auto& [from, device] : resets) {
    const std::size_t upto = std::min(from, events.size());
    if (upto > done) {
      replayed = replayer.ConsumeAll(std::span<const Event>(events).subspan(done, upto - done));
      done = upto;
      if (!replayed.ok()) break;
    }
    replayer.ResetPeakStats(device);
    if (const model::CachingAllocatorSim* sim = replayer.sim(device)) {
      allocs_before[device] = sim->stats().num_device_alloc;
    }
  }
  if (replayed.ok() && done < events.size()) {
    replayed = replayer.ConsumeAll(std::span<const Event>(events).subspan(done));
  }
  if (!replayed.ok() && replayed.code() != StatusCode::kOutOfMemory) {
    r.status = replayed.WithPrefix(fmt::format("event {}", FormatCount(replayer.events() - 1)));
    return r;
  }
  TuneOutcome& o = r.outcome;
  if (!replayer.ooms().empty()) {
    o.oom = true;
    o.oom_event = replayer.ooms().front().event_index;
    o.oom_step = replayer.ooms().front().step;
    o.oom_reserved = replayer.ooms().front().details.reserved;
    o.oom_allocated = replayer.ooms().front().details.allocated;
  }
  // Several devices: the figures of the one with the highest peak reserved.
  for (const auto& [device, sim] : replayer.devices()) {
    const model::MemoryStats& st = sim->stats();
    const auto before = allocs_before.find(device);
    const std::int64_t since =
        st.num_device_alloc - (before == allocs_before.end() ? 0 : before->second);
    o.device_allocs_recorded += static_cast<std::uint64_t>(std::max<std::int64_t>(since, 0));
    const auto reserved = static_cast<std::uint64_t>(st.reserved_bytes[0].peak);
    if (reserved < o.peak_reserved) continue;
    o.peak_reserved = reserved;
    o.peak_allocated = static_cast<std::uint64_t>(st.allocated_bytes[0].peak);
    o.peak_requested = static_cast<std::uint64_t>(st.requested_bytes[0].peak);
    o.num_alloc_retries = static_cast<std::uint64_t>(st.num_alloc_retries);
    o.num_device_alloc = static_cast<std::uint64_t>(st.num_device_alloc);
  }
  o.waste_at_peak =
      o.peak_reserved == 0
          ? 0.0
          : static_cast<double>(o.peak_reserved - std::min(o.peak_requested, o.peak_reserved)) /
                static_cast<double>(o.peak_reserved);
  return r;
}

// The smallest capacity (a multiple of the granularity) on which the trace replays without an
// OOM. Below used_by_others + peak allocated (with unlimited memory) nothing can fit. On a
// device of used_by_others + (peak reserved with unlimited memory) no cudaMalloc fails unless a
// setting shrinks the usable memory (per_process_memory_fraction, a set_memory_fraction
// control): so that upper bound is replayed too, and doubled until it fits: the answer is
// always a size a replay with the same setting fits on. Bisection in between assumes more
// memory never hurts, which holds for the allocator's decisions except in contrived cases
// (documented in docs/simulator.md). nullopt: nothing up to 1 PiB fits.
Result<std::optional<std::uint64_t>> MinCapacity(const std::vector<Event>& events,
                                                 const model::AllocatorConfig& config,
                                                 const TuneOptions& options) {
  constexpr std::uint64_t kUnlimited = std::uint64_t{1} << 50;  // 1 PiB
  RunResult free_run = ReplayOnce(events, config, options, kUnlimited);
  if (!free_run.status.ok()) return free_run.status;
  const std::uint64_t g = options.min_capacity_granularity;
  auto round_up = [g](std::uint64_t n) { return (n + g - 1) / g * g; };
  std::uint64_t hi = round_up(options.used_by_others_bytes + free_run.outcome.peak_reserved);
  std::uint64_t lo = options.used_by_others_bytes + free_run.outcome.peak_allocated;
  lo = lo >= g ? lo / g * g - g : 0;  // known (or assumed) to fail
  while (true) {
    RunResult r = ReplayOnce(events, config, options, hi);
    if (!r.status.ok()) return r.status;
    if (!r.outcome.oom) break;
    if (hi >= kUnlimited) return std::optional<std::uint64_t>();
    lo = hi;
    hi = std::min(round_up(hi * 2), kUnlimited);
  }
  while (hi - lo > g) {
    const std::uint64_t mid = lo + (hi - lo) / g / 2 * g;
    RunResult r = ReplayOnce(events, config, options, mid);
    if (!r.status.ok()) return r.status;
    if (r.outcome.oom)
      lo = mid;
    else
      hi = mid;
  }
  return std::optional<std::uint64_t>(hi);
}

// How many keys a setting string sets ("" = none): "a:1,b:2" sets two.
std::size_t KeysSet(std::string_view conf) {
  std::size_t keys = 0;
  for (std::size_t begin = 0; begin <= conf.size();) {
    std::size_t end = conf.find(',', begin);
    if (end == std::string_view::npos) end = conf.size();
    if (conf.substr(begin, end - begin).find_first_not_of(" \t") != std::string_view::npos) ++keys;
    begin = end + 1;
  }
  return keys;
}

}  // namespace

std::vector<std::string> DefaultTuneGrid(model::ConfigVersion version) {
  // Only keys the version knows: 1.13 has no expandable segments, and before 2.9 the memory
  // fraction is set by torch.cuda.set_per_process_memory_fraction, not by the conf string.
  const bool expandable_known = version != model::ConfigVersion::kV1_13;
  const bool fraction_known = version == model::ConfigVersion::kNewest;
  std::vector<std::string> grid;
  for (bool expandable : {false, true}) {
    if (expandable && !expandable_known) continue;
    for (std::uint64_t split : {0, 32, 64, 128, 256, 512}) {
      for (std::uint64_t divisions : {0, 4, 8}) {
        for (bool gc : {false, true}) {
          model::AllocatorConfig c;
          c.expandable_segments = expandable;
          if (split) c.max_split_size = split * kMiB;
          c.roundup_power2_divisions.fill(divisions);
          if (gc) {
            c.garbage_collection_threshold = 0.8;
            if (fraction_known) c.per_process_memory_fraction = 0.95;
          }
          grid.push_back(model::ToConfString(c));
        }
      }
    }
  }
  return grid;
}

Result<std::vector<TuneOutcome>> Tune(const std::vector<Event>& events,
                                      const TuneOptions& options) {
  const std::vector<std::string> settings =
      options.settings.empty() ? DefaultTuneGrid(options.version) : options.settings;
  std::vector<model::AllocatorConfig> configs;
  for (const std::string& conf : settings) {
    Result<model::AllocatorConfig> c = model::ParseUserAllocatorConf(conf, options.version);
    if (!c.ok()) return c.status().WithPrefix(fmt::format("setting '{}'", conf));
    configs.push_back(*c);
  }
  std::vector<TuneOutcome> outcomes(settings.size());
  std::vector<Status> errors(settings.size());

  // Settings that differ only in max_split_size_mb, garbage_collection_threshold or
  // per_process_memory_fraction often make the same decisions on a trace (no block reaches the
  // split limit, the fraction limit is never approached). They form a family; one replay of a
  // member settles every member whose decisions it proves identical (WouldMatch), and only the
  // rest are replayed. Families run in parallel; a thread with no family to start replays a
  // pending member of a running family rather than wait (the replay may turn out unneeded).
  auto family_key = [](model::AllocatorConfig c) {
    c.max_split_size = 0;
    c.garbage_collection_threshold = 0.0;
    c.per_process_memory_fraction = 1.0;
    return c;
  };
  struct Family {
    std::vector<std::size_t> pending;  // settings not settled nor started, in grid order
    int running = 0;
  };
  std::vector<Family> families;
  {
    std::vector<model::AllocatorConfig> keys;
    for (std::size_t i = 0; i < configs.size(); ++i) {
      const model::AllocatorConfig key = family_key(configs[i]);
      std::size_t f = 0;
      while (f < keys.size() && !(keys[f] == key)) ++f;
      if (f == keys.size()) {
        keys.push_back(key);
        families.emplace_back();
      }
      families[f].pending.push_back(i);
    }
  }
  std::mutex mu;
  // Picks the next setting to replay: the first pending member of an idle family, else the last
  // pending member of a busy one. Returns false when nothing is left to start.
  auto pick = [&](std::size_t* family, std::size_t* setting) {
    for (int pass = 0; pass < 2; ++pass) {
      for (std::size_t f = 0; f < families.size(); ++f) {
        Family& fam = families[f];
        if (fam.pending.empty() || (pass == 0 && fam.running > 0)) continue;
        *family = f;
        if (pass == 0) {
          *setting = fam.pending.front();
          fam.pending.erase(fam.pending.begin());
        } else {
          *setting = fam.pending.back();
          fam.pending.pop_back();
        }
        ++fam.running;
        return true;
      }
    }
    return false;
  };
  auto worker = [&] {
    while (true) {
      std::size_t f = 0, i = 0;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (!pick(&f, &i)) return;
      }
      RunResult r = ReplayOnce(events, configs[i], options, std::nullopt);
      std::vector<std::size_t> settled;  // members this run stands for
      {
        std::lock_guard<std::mutex> lock(mu);
        --families[f].running;
        if (r.status.ok()) {
          std::vector<std::size_t>& pending = families[f].pending;
          for (auto it = pending.begin(); it != pending.end();) {
            bool match = true;
            for (const auto& [device, sim] : r.replayer->devices()) {
              match = match && sim->WouldMatch(configs[*it]);
            }
            if (match) {
              settled.push_back(*it);
              it = pending.erase(it);
            } else {
              ++it;
            }
          }
        }
      }
      r.replayer.reset();
      settled.insert(settled.begin(), i);
      for (const std::size_t j : settled) {
        if (!r.status.ok()) {
          errors[j] = r.status;
          continue;
        }
        outcomes[j] = r.outcome;
        outcomes[j].conf = std::string(model::StripConfAssignment(settings[j]));
      }
    }
  };
  // The bisections replay at other capacities, where members of a family may diverge: one
  // per setting, in parallel, after the main replays.
  std::atomic<std::size_t> next{0};
  auto min_capacity_worker = [&] {
    for (std::size_t i = next++; i < settings.size(); i = next++) {
      if (!errors[i].ok()) continue;
      Result<std::optional<std::uint64_t>> min = MinCapacity(events, configs[i], options);
      if (!min.ok()) {
        errors[i] = min.status();
        continue;
      }
      outcomes[i].min_capacity = *min;
    }
  };
  unsigned threads = options.threads != 0 ? options.threads : std::thread::hardware_concurrency();
  threads = std::max(1u, std::min<unsigned>(threads, static_cast<unsigned>(settings.size())));
  auto run_on_all_threads = [threads](const std::function<void()>& fn) {
    std::vector<std::thread> pool;
    for (unsigned t = 1; t < threads; ++t) pool.emplace_back(fn);
    fn();
    for (std::thread& t : pool) t.join();
  };
  run_on_all_threads(worker);
  if (options.find_min_capacity) run_on_all_threads(min_capacity_worker);
  for (const Status& s : errors) {
    if (!s.ok()) return s;
  }
  std::vector<std::size_t> order(outcomes.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const TuneOutcome& x = outcomes[a];
    const TuneOutcome& y = outcomes[b];
    if (x.oom != y.oom) return !x.oom;
    // Among settings that run out of memory, the one that gets furthest is the better guess.
    if (x.oom && x.oom_event != y.oom_event) return x.oom_event > y.oom_event;
    // The smallest device a setting fits on is its headroom on this one (find_min_capacity).
    if (x.min_capacity != y.min_capacity) {
      if (!x.min_capacity || !y.min_capacity) return x.min_capacity.has_value();
      return *x.min_capacity < *y.min_capacity;
    }
    if (x.peak_reserved != y.peak_reserved) return x.peak_reserved < y.peak_reserved;
    // Same requests, same peak reserved: what a setting's rounding adds to the blocks bought
    // nothing here, and it brings an OOM closer when the requests grow.
    if (x.peak_allocated != y.peak_allocated) return x.peak_allocated < y.peak_allocated;
    return KeysSet(x.conf) < KeysSet(y.conf);  // the smallest change that does as well
  });
  std::vector<TuneOutcome> ranked;
  for (std::size_t i : order) ranked.push_back(outcomes[i]);
  return ranked;
}

std::string TuneCannotRank(const std::vector<TuneOutcome>& ranked, const TuneOptions& options) {
  if (ranked.empty() || !options.recorded_device_allocs || *options.recorded_device_allocs > 0) {
    return "";
  }
  std::size_t grew = 0;  // settings whose rebuilt start state left the recorded requests short
  for (const TuneOutcome& o : ranked) grew += o.device_allocs_recorded > 0;
  return fmt::format(
      "the recorded history cannot tell the settings apart: it holds no segment allocation "
      "(every byte its requests used was reserved before recording began), and that start "
      "state is rebuilt under each setting (docs/snapshots.md), so the {} of each setting "
      "compare rebuilds{}, not how the settings would have run the job. Record the history "
      "from the job's start (torch.cuda.memory._record_memory_history() before the first "
      "allocation) or capture a request trace (docs/capturing-traces.md) to rank them",
      options.find_min_capacity ? "peaks, waste and min capacities" : "peaks and waste",
      grew == 0 ? std::string()
                : fmt::format(" ({} of the {} needed more memory only because their rebuild "
                              "was laid out differently)",
                              grew, ranked.size()));
}

}  // namespace fragscope::analysis
