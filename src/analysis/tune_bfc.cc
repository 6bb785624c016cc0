#include "analysis/tune_bfc.h"

#include <algorithm>

#include <fmt/format.h>

#include "model/bfc_request_replayer.h"

namespace fragscope::analysis {

std::vector<std::string> DefaultBfcTuneGrid() {
  std::vector<std::string> grid;
  for (const char* growth : {"", "allow_growth:false"}) {
    for (const char* fraction :
         {"", "memory_fraction:0.95", "memory_fraction:0.9", "memory_fraction:0.75"}) {
      for (const char* gc : {"", "garbage_collection:true"}) {
        std::vector<std::string> keys;
        for (const char* k : {growth, fraction, gc}) {
          if (*k != '\0') keys.emplace_back(k);
        }
        grid.push_back(fmt::format("{}", fmt::join(keys, ",")));
      }
    }
  }
  return grid;
}

Result<std::vector<BfcTuneOutcome>> TuneBfc(const std::vector<Event>& events,
                                            std::uint64_t capacity_bytes,
                                            std::uint64_t used_by_others_bytes,
                                            std::vector<std::string> settings) {
  if (settings.empty()) settings = DefaultBfcTuneGrid();
  std::vector<BfcTuneOutcome> out;
  std::vector<std::size_t> keys;  // keys set, per outcome: the smaller change ranks first
  for (const std::string& conf : settings) {
    Result<model::BfcSettings> parsed = model::ParseBfcSettings(conf);
    if (!parsed.ok()) {
      return Status::InvalidArgument(
          fmt::format("setting \"{}\": {}", conf, parsed.status().message()));
    }
    if (!parsed->memory_limit && capacity_bytes == 0) {
      return Status::InvalidArgument(fmt::format(
          "setting \"{}\": no memory_limit, and no --capacity to take a fraction of", conf));
    }
    model::BfcDevice device;
    device.capacity_bytes = capacity_bytes;
    device.used_by_others_bytes = used_by_others_bytes;
    model::BfcRequestReplayer replayer(*parsed, [&](std::int32_t) { return device; },
                                       model::OomPolicy::kStop, {});
    BfcTuneOutcome o;
    o.conf = conf;
    for (const Event& e : events) {
      Status s = replayer.Consume(e);
      if (s.code() == StatusCode::kOutOfMemory) break;
      if (!s.ok())
        return Status::InvalidArgument(
            fmt::format("request event {}: {}", replayer.events() - 1, s.message()));
    }
    if (!replayer.ooms().empty()) {
      o.oom = true;
      o.oom_event = replayer.ooms().front().event_index;
      o.oom_step = replayer.ooms().front().step;
    }
    for (const auto& [index, sim] : replayer.devices()) {
      if (o.limit_bytes == 0) o.limit_bytes = sim->memory_limit();
      o.peak_pool_bytes += static_cast<std::uint64_t>(sim->stats().peak_pool_bytes);
      o.peak_in_use_bytes += static_cast<std::uint64_t>(sim->stats().peak_bytes_in_use);
      o.regions += sim->Regions().size();
      o.regions_freed += static_cast<std::uint64_t>(sim->stats().num_regions_freed);
    }
    keys.push_back(static_cast<std::size_t>(std::count(conf.begin(), conf.end(), ':')));
    out.push_back(std::move(o));
  }
  std::vector<std::size_t> order(out.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  const auto better = [&](std::size_t a, std::size_t b) {
    const BfcTuneOutcome& x = out[a];
    const BfcTuneOutcome& y = out[b];
    if (x.oom != y.oom) return !x.oom;
    if (x.oom && x.oom_event != y.oom_event) return x.oom_event > y.oom_event;
    if (x.peak_pool_bytes != y.peak_pool_bytes) return x.peak_pool_bytes < y.peak_pool_bytes;
    if (keys[a] != keys[b]) return keys[a] < keys[b];
    return a < b;
  };
  std::stable_sort(order.begin(), order.end(), better);
  std::vector<BfcTuneOutcome> ranked;
  for (const std::size_t i : order) ranked.push_back(out[i]);
  return ranked;
}

}  // namespace fragscope::analysis
