#include "sinks/report/replay_report.h"

#include <algorithm>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/terminal_text.h"
#include "common/units.h"

namespace fragscope::sinks {

namespace {

using Json = nlohmann::ordered_json;

std::int64_t Stat(const analysis::DeviceReplay& d, const std::string& key) {
  auto it = d.memory_stats.find(key);
  return it == d.memory_stats.end() ? 0 : it->second;
}

std::string Bytes(std::int64_t n) { return FormatBytes(n < 0 ? 0 : static_cast<std::uint64_t>(n)); }

// ", step 3"; ", setup (before the first step)"; nothing when the trace has no step markers.
std::string StepText(std::int64_t step, bool has_steps) {
  if (step >= 0) return fmt::format(", step {}", step);
  return has_steps ? std::string(", setup (before the first step)") : std::string();
}

std::string SignedBytes(std::uint64_t sim, std::uint64_t real) {
  if (sim == real) return "same";
  return sim > real ? "+" + FormatBytes(sim - real) : "-" + FormatBytes(real - sim);
}

void RenderFidelity(const analysis::ReplayResult& replay, std::string* out) {
  if (replay.fidelity.empty()) return;
  *out += "  re-simulation against the recorded run (final segments matched as multisets):\n";
  for (const analysis::DeviceFidelity& f : replay.fidelity) {
    *out += fmt::format(
        "    device {}: segments {} recorded / {} simulated; same layout {} ({:.1f}%), same size "
        "{} ({:.1f}%){}\n",
        f.device, f.real_segments, f.sim_segments, f.matched_segments,
        100.0 * f.segment_agreement(), f.matched_by_size, 100.0 * f.size_agreement(),
        f.history_entries == 0 ? "; no recorded history: this compares the rebuilt final state "
                                 "only"
        : f.complete_history
            ? "; complete history"
            : "; the history starts mid-run (segments existed before its first event), so "
              "its start state was rebuilt with requests");
    *out += fmt::format(
        "      reserved at the end {} recorded, {} simulated ({}); peak reserved {} recorded, {} "
        "simulated ({})\n",
        FormatBytes(f.real_reserved), FormatBytes(f.sim_reserved),
        SignedBytes(f.sim_reserved, f.real_reserved), FormatBytes(f.real_peak_reserved),
        FormatBytes(f.sim_peak_reserved), SignedBytes(f.sim_peak_reserved, f.real_peak_reserved));
  }
}

}  // namespace

std::string RenderReplayText(const analysis::ReplayResult& replay,
                             const analysis::AnalysisResult& analysis, const TextOptions& options) {
  // Input-derived strings (the trace's name, its recorded settings, notes) are escaped as
  // fields (common/terminal_text.h).
  std::string out = fmt::format("fragscope replay: {}\n", TerminalSafe(replay.trace));
  const bool bfc = replay.allocator == "bfc";
  for (const analysis::DeviceReplay& d : replay.devices) {
    if (bfc) {
      out += fmt::format(
          "  device {}: BFC allocator (TensorFlow / JAX) with a limit of {}{}, settings \"{}\"\n",
          d.device, Bytes(Stat(d, "bytes_limit")),
          d.capacity_bytes == 0
              ? std::string()
              : fmt::format(" on a device of {} ({} used by others)", FormatBytes(d.capacity_bytes),
                            FormatBytes(d.used_by_others_bytes)),
          TerminalSafe(d.alloc_conf));
      continue;
    }
    out += fmt::format(
        "  device {}: virtual GPU of {} ({} used by others), "
        "PYTORCH_CUDA_ALLOC_CONF=\"{}\"\n",
        d.device,
        d.capacity_bytes >= analysis::kUnlimitedCapacity ? std::string("unlimited memory")
                                                         : FormatBytes(d.capacity_bytes),
        FormatBytes(d.used_by_others_bytes), TerminalSafe(d.alloc_conf));
  }
  if (replay.ooms.empty()) {
    out += fmt::format("  result: no out-of-memory error in {} request events\n",
                       FormatCount(replay.request_events));
  } else {
    const model::ReplayOom& first = replay.ooms.front();
    // The analysis below numbers the simulated allocator trace's events: name both.
    std::string simulated;
    for (const analysis::DeviceReport& r : analysis.devices) {
      if (r.device == first.device && !r.oom_diagnoses.empty()) {
        simulated = fmt::format(", simulated allocator event {}",
                                FormatCount(r.oom_diagnoses.front().event_index));
      }
    }
    out += fmt::format("  result: OUT OF MEMORY at request event {} (device {}{}{}){}\n",
                       FormatCount(first.event_index), first.device,
                       StepText(first.step, analysis.steps > 0), simulated,
                       replay.stopped_at_oom ? "; the replay stops there, as the job would" : "");
    out += fmt::format(
        "    {}: {}\n",
        bfc ? "ResourceExhaustedError (TensorFlow's allocator log)" : "torch.OutOfMemoryError",
        first.details.message);
    // Rounded 0: the request never reached the allocator (PyTorch's 1 EiB guard).
    out += fmt::format(
        "    request {} ({}); {} {}, {} {}, {} {}\n", FormatBytes(first.details.requested),
        first.details.rounded == 0 ? std::string("refused before the allocator ran")
                                   : "rounded " + FormatBytes(first.details.rounded),
        bfc ? "pool" : "reserved", FormatBytes(first.details.reserved),
        bfc ? "in use" : "allocated", FormatBytes(first.details.allocated),
        bfc ? "left under the limit" : "driver free", FormatBytes(first.details.device_free));
    if (replay.ooms.size() > 1) {
      out += fmt::format("    {} more OOMs were caught and the replay went on (--json lists all)\n",
                         replay.ooms.size() - 1);
    }
  }
  for (const analysis::DeviceReplay& d : replay.devices) {
    if (bfc) {
      out += fmt::format(
          "  memory_stats (device {}): pool {} (peak {}), in use {} (peak {}), largest free "
          "chunk {}, regions {}, allocations {}, OOMs {}\n",
          d.device, Bytes(Stat(d, "pool_bytes")), Bytes(Stat(d, "peak_pool_bytes")),
          Bytes(Stat(d, "bytes_in_use")), Bytes(Stat(d, "peak_bytes_in_use")),
          Bytes(Stat(d, "largest_free_block_bytes")), d.segments.size(), Stat(d, "num_allocs"),
          Stat(d, "num_ooms"));
      continue;
    }
    out += fmt::format(
        "  memory_stats (device {}): reserved peak {}, allocated peak {}, segments {} "
        "(peak {}), cudaMalloc calls {}, cudaFree calls {}, alloc retries {}, OOMs {}\n",
        d.device, Bytes(Stat(d, "reserved_bytes.all.peak")),
        Bytes(Stat(d, "allocated_bytes.all.peak")), Stat(d, "segment.all.current"),
        Stat(d, "segment.all.peak"), Stat(d, "num_device_alloc"), Stat(d, "num_device_free"),
        Stat(d, "num_alloc_retries"), Stat(d, "num_ooms"));
    // PyTorch's memory_stats() does not count expandable segments (their mappings change
    // reserved memory, not "segment"): say so where the memory snapshot has more.
    if (static_cast<std::size_t>(std::max<std::int64_t>(Stat(d, "segment.all.current"), 0)) !=
        d.segments.size()) {
      out += fmt::format(
          "    segments in its memory snapshot: {} (memory_stats' segment count leaves out "
          "expandable segments, as PyTorch's does)\n",
          d.segments.size());
    }
  }
  RenderFidelity(replay, &out);
  for (const std::string& note : replay.notes) out += "  note: " + TerminalSafe(note) + "\n";
  out += "\n";
  out +=
      "  The analysis of the simulated allocator trace follows; its event numbers count that "
      "trace's events, not the request events above.\n\n";
  out += RenderText(analysis, options);
  return out;
}

std::string RenderReplayJson(const analysis::ReplayResult& replay,
                             const analysis::AnalysisResult& analysis, const JsonOptions& options) {
  Json j = Json::object();
  j["schema"] = kReplaySchemaName;
  j["schema_version"] = kReplaySchemaVersion;
  j["trace"] = replay.trace;
  j["allocator"] = replay.allocator;
  j["on_oom"] = replay.policy == model::OomPolicy::kStop ? "stop" : "continue";
  j["stopped_at_oom"] = replay.stopped_at_oom;
  j["request_events"] = replay.request_events;
  Json ooms = Json::array();
  for (const model::ReplayOom& o : replay.ooms) {
    Json x = Json::object();
    x["event_index"] = o.event_index;
    x["step"] = o.step < 0 ? Json(nullptr) : Json(o.step);
    x["device"] = o.device;
    x["requested_bytes"] = o.details.requested;
    // 0: refused before the allocator ran (a request of 1 EiB or more): nothing was rounded.
    x["rounded_bytes"] = o.details.rounded == 0 ? Json(nullptr) : Json(o.details.rounded);
    x["tried_to_allocate_bytes"] =
        o.details.rounded == 0 ? Json(nullptr) : Json(o.details.reported);
    x["device_total_bytes"] = o.details.device_total;
    x["device_free_bytes"] = o.details.device_free;
    x["allocated_bytes"] = o.details.allocated;
    x["reserved_bytes"] = o.details.reserved;
    x["limit_bytes"] = o.details.limit ? Json(*o.details.limit) : Json(nullptr);
    x["message"] = o.details.message;
    ooms.push_back(std::move(x));
  }
  j["oom"] = ooms.empty() ? Json(nullptr) : ooms.front();
  j["ooms"] = std::move(ooms);
  Json fidelity = Json::array();
  for (const analysis::DeviceFidelity& f : replay.fidelity) {
    Json x = Json::object();
    x["device"] = f.device;
    x["complete_history"] = f.complete_history;
    x["history_entries"] = f.history_entries;
    x["real_segments"] = f.real_segments;
    x["sim_segments"] = f.sim_segments;
    x["matched_segments"] = f.matched_segments;
    x["matched_by_size"] = f.matched_by_size;
    x["segment_agreement"] = f.segment_agreement();
    x["size_agreement"] = f.size_agreement();
    x["real_reserved_bytes"] = f.real_reserved;
    x["sim_reserved_bytes"] = f.sim_reserved;
    x["real_allocated_bytes"] = f.real_allocated;
    x["sim_allocated_bytes"] = f.sim_allocated;
    x["real_peak_reserved_bytes"] = f.real_peak_reserved;
    x["sim_peak_reserved_bytes"] = f.sim_peak_reserved;
    x["recorded_addresses"] = f.recorded_addresses ? Json(*f.recorded_addresses) : Json(nullptr);
    x["addresses_taken"] = f.addresses_taken ? Json(*f.addresses_taken) : Json(nullptr);
    fidelity.push_back(std::move(x));
  }
  j["fidelity"] = replay.fidelity.empty() ? Json(nullptr) : std::move(fidelity);
  j["notes"] = replay.notes;
  Json devices = Json::array();
  for (const analysis::DeviceReplay& d : replay.devices) {
    Json x = Json::object();
    x["device"] = d.device;
    x["capacity_bytes"] = d.capacity_bytes;
    x["used_by_others_bytes"] = d.used_by_others_bytes;
    x["alloc_conf"] = d.alloc_conf;
    // The BFC's pool is what it reserved from the device; its chunks in use are allocated.
    const bool bfc = replay.allocator == "bfc";
    x["peak_reserved_bytes"] = Stat(d, bfc ? "peak_pool_bytes" : "reserved_bytes.all.peak");
    x["peak_allocated_bytes"] = Stat(d, bfc ? "peak_bytes_in_use" : "allocated_bytes.all.peak");
    Json stats = Json::object();
    for (const auto& [key, value] : d.memory_stats) stats[key] = value;
    x["memory_stats"] = std::move(stats);
    Json segments = Json::array();
    for (const model::SnapshotSegment& s : d.segments) {
      Json seg = Json::object();
      seg["address"] = s.address;
      seg["total_size"] = s.total_size;
      seg["allocated_size"] = s.allocated_size;
      seg["active_size"] = s.active_size;
      seg["requested_size"] = s.requested_size;
      seg["stream"] = s.stream;
      seg["segment_type"] = s.segment_type;
      seg["is_expandable"] = s.is_expandable;
      Json blocks = Json::array();
      for (const model::SnapshotBlock& b : s.blocks) {
        Json blk = Json::object();
        blk["address"] = b.address;
        blk["size"] = b.size;
        blk["requested_size"] = b.requested_size;
        blk["state"] = b.state;
        blk["stream"] = s.stream;
        blk["pool"] = s.segment_type;
        blocks.push_back(std::move(blk));
      }
      seg["blocks"] = std::move(blocks);
      segments.push_back(std::move(seg));
    }
    x["segments"] = std::move(segments);
    devices.push_back(std::move(x));
  }
  j["devices"] = std::move(devices);
  // The analysis is spliced in as RenderJson writes it, indented one level deeper: parsing it
  // back into an ordered_json inserted each key with a linear search for duplicates, O(n^2) in
  // the trace's labels (150k labels took 23 s; issue 30 item 8). It is the last member.
  j["analysis"] = nullptr;
  std::string out = j.dump(options.indent, ' ', false, Json::error_handler_t::replace);
  const std::string placeholder = options.indent >= 0 ? "\"analysis\": null" : "\"analysis\":null";
  const std::size_t at = out.rfind(placeholder);
  std::string inner = RenderJson(analysis, options);
  if (!inner.empty() && inner.back() == '\n') inner.pop_back();
  std::string nested;
  nested.reserve(inner.size() + inner.size() / 8);
  const std::string newline = "\n" + std::string(std::max(options.indent, 0), ' ');
  for (const char c : inner) {
    if (c == '\n') {
      nested += newline;  // JSON strings hold no raw newline: each one is a line break
    } else {
      nested += c;
    }
  }
  out.replace(at + placeholder.size() - 4, 4, nested);
  return out + "\n";
}

}  // namespace fragscope::sinks
