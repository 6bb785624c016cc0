// The process API (process_api.h): rows from the registry, their JSON, and the parser `top`
// reads them back with.
#include "sinks/live/process_api.h"

#include <cmath>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

namespace fragscope::sinks::live {
namespace {

using Json = nlohmann::ordered_json;  // keys in the documented order

// ---- Rows from the registry -------------------------------------------------------------

std::uint32_t Fnv1a(std::string_view text) {
  std::uint32_t h = 2166136261u;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 16777619u;
  }
  return h;
}

template <typename T>
Json OrNull(const std::optional<T>& v) {
  return v ? Json(*v) : Json(nullptr);
}

Json RowJson(const ProcessRow& r, bool with_map) {
  Json history = Json::object();
  Json steps = Json::array(), reserved = Json::array(), allocated = Json::array();
  for (const HistoryPoint& p : r.history) {
    steps.push_back(p.step);
    reserved.push_back(p.reserved_bytes);
    allocated.push_back(p.allocated_bytes);
  }
  history["step"] = std::move(steps);
  history["reserved_bytes"] = std::move(reserved);
  history["allocated_bytes"] = std::move(allocated);
  Json j = {
      {"id", r.id},
      {"job", r.job},
      {"rank", r.rank >= 0 ? Json(r.rank) : Json(nullptr)},
      {"pid", r.pid},
      {"host", r.host},
      {"device_uuid", r.device_uuid},
      {"device_index", r.device_index >= 0 ? Json(r.device_index) : Json(nullptr)},
      {"step", r.step >= 0 ? Json(r.step) : Json(nullptr)},
      {"reserved_bytes", r.reserved_bytes},
      {"allocated_bytes", r.allocated_bytes},
      {"fragmentation_ratio", OrNull(r.fragmentation_ratio)},
      {"cached_free_bytes", OrNull(r.cached_free_bytes)},
      {"largest_free_block_bytes", OrNull(r.largest_free_block_bytes)},
      {"largest_request_bytes", OrNull(r.largest_request_bytes)},
      {"max_allocatable_bytes", OrNull(r.max_allocatable_bytes)},
      {"stranded_bytes", OrNull(r.stranded_bytes)},
      {"oom_risk_horizon_steps", kRiskHorizonSteps},
      {"oom_risk", OrNull(r.oom_risk)},
      {"oom_risk_explanation", r.oom_risk_explanation},
      {"level", std::string(RiskLevelName(r.level))},
      {"steps_to_oom", OrNull(r.steps_to_oom)},
      {"last_sample_unix_ms", r.last_sample_unix_ms},
      {"connected", r.connected},
      {"history", std::move(history)},
  };
  if (with_map) {
    Json buckets = Json::array();
    for (const FreeBucket& b : r.free_blocks) {
      buckets.push_back({{"min_bytes", b.min_bytes}, {"count", b.count}, {"bytes", b.bytes}});
    }
    j["free_blocks"] = std::move(buckets);
  }
  return j;
}

Json Head(const ProcessList& list) {
  return {{"schema", kProcessesSchema},
          {"schema_version", kProcessesSchemaVersion},
          {"host", list.host},
          {"time_unix_ms", list.time_unix_ms}};
}

std::string Dump(const Json& j) {
  // Agents' strings were checked as UTF-8 on the way in; "replace" keeps the page valid anyway.
  return j.dump(-1, ' ', false, Json::error_handler_t::replace) + "\n";
}

// ---- Parsing ------------------------------------------------------------------------------

// Where a field is ("processes[3].history.step[7]") and what was wrong with it.
Status FieldError(const std::string& where, std::string_view what) {
  return Status::Corruption(fmt::format("{}: {}", where, what));
}

std::string Sub(const std::string& where, std::string_view field) {
  return where.empty() ? std::string(field) : fmt::format("{}.{}", where, field);
}

// The field of `obj`, or an error when it is missing.
Result<const Json*> Need(const Json& obj, const std::string& where, const char* field) {
  const auto it = obj.find(field);
  if (it == obj.end()) return FieldError(Sub(where, field), "missing");
  return &*it;
}

Status ReadU64(const Json& v, const std::string& where, std::uint64_t* out) {
  if (!v.is_number_unsigned()) {
    return FieldError(
        where, fmt::format("expected an unsigned integer, got {}",
                           v.is_number() ? "a negative or fractional number" : v.type_name()));
  }
  *out = v.get<std::uint64_t>();
  return Status::Ok();
}

Status ReadI64(const Json& v, const std::string& where, std::int64_t min, std::int64_t max,
               std::int64_t* out) {
  if (!v.is_number_integer()) {
    return FieldError(where, fmt::format("expected an integer, got {}", v.type_name()));
  }
  if (v.is_number_unsigned() &&
      v.get<std::uint64_t>() >
          static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    return FieldError(where, fmt::format("{} is above the limit {}", v.get<std::uint64_t>(), max));
  }
  const std::int64_t x = v.get<std::int64_t>();
  if (x < min || x > max) {
    return FieldError(where, fmt::format("{} is outside [{}, {}]", x, min, max));
  }
  *out = x;
  return Status::Ok();
}

template <typename T>
Status ReadOptional(const Json& obj, const std::string& where, const char* field,
                    std::optional<T>* out) {
  Result<const Json*> v = Need(obj, where, field);
  if (!v.ok()) return v.status();
  if ((*v)->is_null()) {
    out->reset();
    return Status::Ok();
  }
  if constexpr (std::is_same_v<T, double>) {
    if (!(*v)->is_number()) {
      return FieldError(Sub(where, field),
                        fmt::format("expected a number or null, got {}", (*v)->type_name()));
    }
    const double x = (*v)->template get<double>();
    if (!std::isfinite(x) || x < 0 || x > 1) {
      return FieldError(Sub(where, field), fmt::format("{} is outside [0, 1]", x));
    }
    *out = x;
  } else if constexpr (std::is_same_v<T, std::int64_t>) {
    std::int64_t x = 0;
    if (Status s = ReadI64(**v, Sub(where, field), 0, std::numeric_limits<std::int64_t>::max(), &x);
        !s.ok()) {
      return s;
    }
    *out = x;
  } else {
    std::uint64_t x = 0;
    if (Status s = ReadU64(**v, Sub(where, field), &x); !s.ok()) return s;
    *out = x;
  }
  return Status::Ok();
}

Status ReadString(const Json& obj, const std::string& where, const char* field, std::string* out) {
  Result<const Json*> v = Need(obj, where, field);
  if (!v.ok()) return v.status();
  if (!(*v)->is_string()) {
    return FieldError(Sub(where, field),
                      fmt::format("expected a string, got {}", (*v)->type_name()));
  }
  // The agent protocol bounds these at 256 bytes; a longer one is not the daemon's.
  const auto& s = (*v)->get_ref<const std::string&>();
  if (s.size() > 4096) {
    return FieldError(Sub(where, field), fmt::format("{} bytes, above the limit 4096", s.size()));
  }
  *out = s;
  return Status::Ok();
}

// A list of integers of at most kRecentPoints elements.
template <typename T>
Status ReadSeries(const Json& history, const std::string& where, const char* field,
                  std::vector<T>* out) {
  Result<const Json*> v = Need(history, where, field);
  if (!v.ok()) return v.status();
  const std::string here = Sub(where, field);
  if (!(*v)->is_array()) {
    return FieldError(here, fmt::format("expected an array, got {}", (*v)->type_name()));
  }
  if ((*v)->size() > agent::kRecentPoints) {
    return FieldError(
        here, fmt::format("{} points, above the limit {}", (*v)->size(), agent::kRecentPoints));
  }
  for (std::size_t i = 0; i < (*v)->size(); ++i) {
    const std::string at = fmt::format("{}[{}]", here, i);
    const Json& e = (**v)[i];
    if constexpr (std::is_same_v<T, std::int64_t>) {
      std::int64_t x = -1;
      if (!e.is_null()) {
        if (Status s = ReadI64(e, at, 0, std::numeric_limits<std::int64_t>::max(), &x); !s.ok()) {
          return s;
        }
      }
      out->push_back(x);
    } else {
      std::uint64_t x = 0;
      if (Status s = ReadU64(e, at, &x); !s.ok()) return s;
      out->push_back(x);
    }
  }
  return Status::Ok();
}

Status ReadRow(const Json& j, const std::string& where, bool with_map, ProcessRow* r) {
  if (!j.is_object()) {
    return FieldError(where, fmt::format("expected an object, got {}", j.type_name()));
  }
  std::optional<std::int64_t> rank, device_index, step;
  std::optional<std::uint64_t> pid, reserved, allocated;
  Status s = ReadString(j, where, "id", &r->id);
  if (s.ok()) s = ReadString(j, where, "job", &r->job);
  if (s.ok()) s = ReadString(j, where, "host", &r->host);
  if (s.ok()) s = ReadString(j, where, "device_uuid", &r->device_uuid);
  if (s.ok()) s = ReadOptional(j, where, "rank", &rank);
  if (s.ok()) s = ReadOptional(j, where, "pid", &pid);
  if (s.ok()) s = ReadOptional(j, where, "device_index", &device_index);
  if (s.ok()) s = ReadOptional(j, where, "step", &step);
  if (s.ok()) s = ReadOptional(j, where, "reserved_bytes", &reserved);
  if (s.ok()) s = ReadOptional(j, where, "allocated_bytes", &allocated);
  if (s.ok()) s = ReadOptional(j, where, "fragmentation_ratio", &r->fragmentation_ratio);
  if (s.ok()) s = ReadOptional(j, where, "cached_free_bytes", &r->cached_free_bytes);
  if (s.ok()) s = ReadOptional(j, where, "largest_free_block_bytes", &r->largest_free_block_bytes);
  if (s.ok()) s = ReadOptional(j, where, "largest_request_bytes", &r->largest_request_bytes);
  if (s.ok()) s = ReadOptional(j, where, "max_allocatable_bytes", &r->max_allocatable_bytes);
  if (s.ok()) s = ReadOptional(j, where, "stranded_bytes", &r->stranded_bytes);
  if (s.ok()) s = ReadOptional(j, where, "oom_risk", &r->oom_risk);
  if (s.ok()) s = ReadOptional(j, where, "steps_to_oom", &r->steps_to_oom);
  // Added with schema version 1 kept: a daemon from before it sends none.
  if (s.ok() && j.contains("oom_risk_explanation")) {
    s = ReadString(j, where, "oom_risk_explanation", &r->oom_risk_explanation);
  }
  if (!s.ok()) return s;
  if (!pid || *pid > std::numeric_limits<std::uint32_t>::max()) {
    return FieldError(Sub(where, "pid"), "expected a process id");
  }
  if (!reserved || !allocated) {
    return FieldError(Sub(where, reserved ? "allocated_bytes" : "reserved_bytes"),
                      "expected an unsigned integer, got null");
  }
  if (rank && *rank > std::numeric_limits<std::int32_t>::max()) {
    return FieldError(Sub(where, "rank"), fmt::format("{} is above the limit", *rank));
  }
  if (device_index && *device_index > std::numeric_limits<std::int32_t>::max()) {
    return FieldError(Sub(where, "device_index"),
                      fmt::format("{} is above the limit", *device_index));
  }
  r->pid = static_cast<std::uint32_t>(*pid);
  r->rank = rank ? static_cast<std::int32_t>(*rank) : -1;
  r->device_index = device_index ? static_cast<std::int32_t>(*device_index) : -1;
  r->step = step.value_or(-1);
  r->reserved_bytes = *reserved;
  r->allocated_bytes = *allocated;
  std::string level;
  if (s = ReadString(j, where, "level", &level); !s.ok()) return s;
  const std::optional<RiskLevel> parsed = ParseRiskLevel(level);
  if (!parsed) {
    return FieldError(Sub(where, "level"), "expected one of unknown, ok, watch, warning, critical");
  }
  r->level = *parsed;
  Result<const Json*> ms = Need(j, where, "last_sample_unix_ms");
  if (!ms.ok()) return ms.status();
  if (s = ReadI64(**ms, Sub(where, "last_sample_unix_ms"), 0,
                  std::numeric_limits<std::int64_t>::max(), &r->last_sample_unix_ms);
      !s.ok()) {
    return s;
  }
  Result<const Json*> connected = Need(j, where, "connected");
  if (!connected.ok()) return connected.status();
  if (!(*connected)->is_boolean()) {
    return FieldError(Sub(where, "connected"),
                      fmt::format("expected true or false, got {}", (*connected)->type_name()));
  }
  r->connected = (*connected)->get<bool>();
  Result<const Json*> history = Need(j, where, "history");
  if (!history.ok()) return history.status();
  const std::string hw = Sub(where, "history");
  if (!(*history)->is_object()) {
    return FieldError(hw, fmt::format("expected an object, got {}", (*history)->type_name()));
  }
  std::vector<std::int64_t> steps;
  std::vector<std::uint64_t> res, alloc;
  if (s = ReadSeries(**history, hw, "step", &steps); !s.ok()) return s;
  if (s = ReadSeries(**history, hw, "reserved_bytes", &res); !s.ok()) return s;
  if (s = ReadSeries(**history, hw, "allocated_bytes", &alloc); !s.ok()) return s;
  if (res.size() != steps.size() || alloc.size() != steps.size()) {
    return FieldError(hw, fmt::format("step, reserved_bytes and allocated_bytes differ in length "
                                      "({}, {}, {})",
                                      steps.size(), res.size(), alloc.size()));
  }
  for (std::size_t i = 0; i < steps.size(); ++i) r->history.push_back({steps[i], res[i], alloc[i]});
  if (!with_map) return Status::Ok();
  Result<const Json*> buckets = Need(j, where, "free_blocks");
  if (!buckets.ok()) return buckets.status();
  const std::string bw = Sub(where, "free_blocks");
  if (!(*buckets)->is_array()) {
    return FieldError(bw, fmt::format("expected an array, got {}", (*buckets)->type_name()));
  }
  if ((*buckets)->size() > agent::kFreeBlockBuckets) {
    return FieldError(bw, fmt::format("{} buckets, above the limit {}", (*buckets)->size(),
                                      agent::kFreeBlockBuckets));
  }
  for (std::size_t i = 0; i < (*buckets)->size(); ++i) {
    const Json& b = (**buckets)[i];
    const std::string at = fmt::format("{}[{}]", bw, i);
    if (!b.is_object()) {
      return FieldError(at, fmt::format("expected an object, got {}", b.type_name()));
    }
    std::optional<std::uint64_t> min, count, bytes;
    if (s = ReadOptional(b, at, "min_bytes", &min); !s.ok()) return s;
    if (s = ReadOptional(b, at, "count", &count); !s.ok()) return s;
    if (s = ReadOptional(b, at, "bytes", &bytes); !s.ok()) return s;
    if (!min || !count || !bytes) return FieldError(at, "min_bytes, count and bytes are required");
    r->free_blocks.push_back({*min, *count, *bytes});
  }
  return Status::Ok();
}

// The document, its format and version checked; errors say where the JSON broke.
Result<Json> ParseHead(std::string_view text, ProcessList* head) {
  // nlohmann's parser is iterative, but an answer never nests deeper than object > processes
  // > row > history > array: anything deeper is dropped as it is parsed, then refused.
  bool too_deep = false;
  const auto limit_depth = [&too_deep](int depth, Json::parse_event_t, Json&) {
    too_deep = too_deep || depth > 6;
    return !too_deep;
  };
  Json doc;
  try {
    doc = Json::parse(text.begin(), text.end(), limit_depth);
  } catch (const Json::parse_error& e) {
    return Status::Corruption(fmt::format("not JSON (byte {}): {}", e.byte, e.what()));
  }
  if (too_deep) return Status::Corruption("JSON nested deeper than the process API's 6 levels");
  if (!doc.is_object()) {
    return Status::Corruption(
        fmt::format("expected a JSON object at the top, got {}", doc.type_name()));
  }
  std::string schema;
  if (Status s = ReadString(doc, "", "schema", &schema); !s.ok()) return s;
  if (schema != kProcessesSchema) {
    return FieldError("schema", fmt::format("\"{}\" is not \"{}\"", schema, kProcessesSchema));
  }
  std::optional<std::uint64_t> version;
  if (Status s = ReadOptional(doc, "", "schema_version", &version); !s.ok()) return s;
  if (version != static_cast<std::uint64_t>(kProcessesSchemaVersion)) {
    return FieldError("schema_version",
                      fmt::format("this fragscope reads version {}", kProcessesSchemaVersion));
  }
  if (Status s = ReadString(doc, "", "host", &head->host); !s.ok()) return s;
  std::optional<std::int64_t> now;
  if (Status s = ReadOptional(doc, "", "time_unix_ms", &now); !s.ok()) return s;
  head->time_unix_ms = now.value_or(0);
  return doc;
}

}  // namespace

std::string ProcessId(std::uint32_t pid, std::string_view device_uuid) {
  return fmt::format("{}-{:08x}", pid, Fnv1a(device_uuid));
}

ProcessRow MakeProcessRow(const agent::AgentView& view, const std::string& host) {
  const agent::AgentSample& s = view.entry.sample;
  ProcessRow r;
  r.id = ProcessId(s.pid, s.device_uuid);
  r.job = s.job;
  r.rank = s.rank;
  r.pid = s.pid;
  r.host = host;
  r.device_uuid = s.device_uuid;
  r.device_index = s.device_index;
  r.step = s.step;
  r.reserved_bytes = s.reserved_bytes;
  r.allocated_bytes = s.allocated_bytes;
  r.fragmentation_ratio = s.fragmentation_ratio;
  r.cached_free_bytes = s.cached_free_bytes;
  r.largest_free_block_bytes = s.largest_free_block;
  if (s.largest_request_bytes > 0) r.largest_request_bytes = s.largest_request_bytes;
  r.max_allocatable_bytes = s.max_allocatable;
  r.stranded_bytes = s.stranded_bytes;
  for (const auto& [horizon, p] : s.oom_risk) {
    if (horizon == kRiskHorizonSteps) r.oom_risk = p;
  }
  if (r.oom_risk) r.oom_risk_explanation = s.oom_risk_explanation;
  r.level = s.forecast_level;
  r.steps_to_oom = s.steps_to_oom;
  r.last_sample_unix_ms = view.entry.received_unix_ms;
  r.connected = !view.entry.closed.has_value();
  for (const agent::RecentPoint& p : view.recent) {
    r.history.push_back({p.step, p.reserved_bytes, p.allocated_bytes});
  }
  for (int b = 0; b < agent::kFreeBlockBuckets; ++b) {
    const auto i = static_cast<std::size_t>(b);
    if (s.free_block_count[i] == 0 && s.free_block_bytes[i] == 0) continue;
    r.free_blocks.push_back(
        {b == 0 ? 0 : std::uint64_t{1} << b, s.free_block_count[i], s.free_block_bytes[i]});
  }
  return r;
}

std::string RenderProcessesJson(const ProcessList& list) {
  Json j = Head(list);
  Json rows = Json::array();
  for (const ProcessRow& r : list.processes) rows.push_back(RowJson(r, false));
  j["processes"] = std::move(rows);
  return Dump(j);
}

std::string RenderProcessMapJson(const ProcessList& list, const ProcessRow& row) {
  Json j = Head(list);
  j["process"] = RowJson(row, true);
  return Dump(j);
}

Result<ProcessList> ParseProcessesJson(std::string_view text) {
  ProcessList list;
  Result<Json> doc = ParseHead(text, &list);
  if (!doc.ok()) return doc.status();
  Result<const Json*> rows = Need(*doc, "", "processes");
  if (!rows.ok()) return rows.status();
  if (!(*rows)->is_array()) {
    return FieldError("processes", fmt::format("expected an array, got {}", (*rows)->type_name()));
  }
  if ((*rows)->size() > kMaxProcesses) {
    return FieldError("processes",
                      fmt::format("{} rows, above the limit {}", (*rows)->size(), kMaxProcesses));
  }
  list.processes.resize((*rows)->size());
  for (std::size_t i = 0; i < (*rows)->size(); ++i) {
    if (Status s = ReadRow((**rows)[i], fmt::format("processes[{}]", i), false, &list.processes[i]);
        !s.ok()) {
      return s;
    }
  }
  return list;
}

Result<ProcessRow> ParseProcessMapJson(std::string_view text) {
  ProcessList head;
  Result<Json> doc = ParseHead(text, &head);
  if (!doc.ok()) return doc.status();
  Result<const Json*> row = Need(*doc, "", "process");
  if (!row.ok()) return row.status();
  ProcessRow r;
  if (Status s = ReadRow(**row, "process", true, &r); !s.ok()) return s;
  return r;
}

prometheus::ApiAnswer AnswerProcessApi(std::string_view target,
                                       const std::vector<agent::AgentView>& views,
                                       const std::string& host, std::int64_t now_unix_ms) {
  ProcessList list;
  list.host = host;
  list.time_unix_ms = now_unix_ms;
  constexpr std::string_view kList = "/api/v1/processes";
  if (target == kList || target == "/api/v1/processes/") {
    for (const agent::AgentView& v : views) {
      list.processes.push_back(MakeProcessRow(v, host));
      list.processes.back().free_blocks.clear();
    }
    return {200, RenderProcessesJson(list)};
  }
  constexpr std::string_view kMap = "/map";
  if (target.size() > kList.size() + 1 + kMap.size() && target.substr(0, kList.size()) == kList &&
      target[kList.size()] == '/' && target.substr(target.size() - kMap.size()) == kMap) {
    const std::string_view id =
        target.substr(kList.size() + 1, target.size() - kList.size() - 1 - kMap.size());
    for (const agent::AgentView& v : views) {
      const agent::AgentSample& s = v.entry.sample;
      if (ProcessId(s.pid, s.device_uuid) == id) {
        return {200, RenderProcessMapJson(list, MakeProcessRow(v, host))};
      }
    }
  }
  return {404, Dump(Json{{"error", fmt::format("no such process API path: {}",
                                               std::string(target.substr(0, 200)))}})};
}

}  // namespace fragscope::sinks::live
