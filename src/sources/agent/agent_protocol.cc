// The agent wire protocol (agent_protocol.h; docs/formats.md, "Agent protocol").
#include "sources/agent/agent_protocol.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "model/allocator_rules.h"

namespace fragscope::agent {
namespace {

// A summary figure for the wire: null when unknown.
template <typename T>
nlohmann::json OrNull(const std::optional<T>& v) {
  return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
}

using Json = nlohmann::json;

std::uint32_t LoadU32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<std::uint32_t>(u[0]) | static_cast<std::uint32_t>(u[1]) << 8 |
         static_cast<std::uint32_t>(u[2]) << 16 | static_cast<std::uint32_t>(u[3]) << 24;
}

std::uint16_t LoadU16(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return static_cast<std::uint16_t>(u[0] | u[1] << 8);
}

void StoreU32(std::string* out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

void StoreU16(std::string* out, std::uint16_t v) {
  out->push_back(static_cast<char>(v & 0xff));
  out->push_back(static_cast<char>(v >> 8));
}

// Deepest nesting of arrays/objects, strings skipped. nlohmann's parser is iterative, but a
// sample never nests deeper than object > array, so anything deeper is refused before parsing.
int MaxDepth(std::string_view text) {
  int depth = 0;
  int max_depth = 0;
  bool in_string = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      max_depth = std::max(max_depth, ++depth);
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

Status FieldError(std::string_view field, std::string_view what) {
  return Status::Corruption(fmt::format("field \"{}\": {}", field, what));
}

// Integer field within [min, max]; absent leaves *out unchanged.
template <typename T>
Status ReadInt(const Json& obj, const char* field, std::int64_t min, T* out) {
  const auto it = obj.find(field);
  if (it == obj.end()) return Status::Ok();
  constexpr auto kMax = std::numeric_limits<T>::max();
  if (it->is_number_unsigned()) {
    const auto v = it->get<std::uint64_t>();
    if (v > static_cast<std::uint64_t>(kMax)) {
      return FieldError(field, fmt::format("{} is above the limit {}", v, kMax));
    }
    if (min > 0 && v < static_cast<std::uint64_t>(min)) {
      return FieldError(field, fmt::format("{} is below the minimum {}", v, min));
    }
    *out = static_cast<T>(v);
    return Status::Ok();
  }
  if (it->is_number_integer()) {
    const auto v = it->get<std::int64_t>();
    if (v < min) return FieldError(field, fmt::format("{} is below the minimum {}", v, min));
    if (v > 0 && static_cast<std::uint64_t>(v) > static_cast<std::uint64_t>(kMax)) {
      return FieldError(field, fmt::format("{} is above the limit {}", v, kMax));
    }
    *out = static_cast<T>(v);
    return Status::Ok();
  }
  return FieldError(field, fmt::format("expected an integer, got {}", it->type_name()));
}

Status ReadString(const Json& obj, const char* field, std::string* out) {
  const auto it = obj.find(field);
  if (it == obj.end()) return Status::Ok();
  if (!it->is_string()) {
    return FieldError(field, fmt::format("expected a string, got {}", it->type_name()));
  }
  const auto& s = it->get_ref<const std::string&>();
  if (s.size() > kMaxStringBytes) {
    return FieldError(field,
                      fmt::format("{} bytes, above the limit of {}", s.size(), kMaxStringBytes));
  }
  for (std::size_t i = 0; i < s.size(); ++i) {
    if (static_cast<unsigned char>(s[i]) < 0x20 || s[i] == 0x7f) {
      return FieldError(field, fmt::format("control character at byte {}", i));
    }
  }
  *out = s;
  return Status::Ok();
}

Status ReadBuckets(const Json& obj, const char* field,
                   std::array<std::uint64_t, kFreeBlockBuckets>* out) {
  const auto it = obj.find(field);
  if (it == obj.end()) return Status::Ok();
  if (!it->is_array()) {
    return FieldError(field, fmt::format("expected an array, got {}", it->type_name()));
  }
  if (it->size() > static_cast<std::size_t>(kFreeBlockBuckets)) {
    return FieldError(
        field, fmt::format("{} buckets, above the limit of {}", it->size(), kFreeBlockBuckets));
  }
  for (std::size_t b = 0; b < it->size(); ++b) {
    const Json& v = (*it)[b];
    if (v.is_number_unsigned() || (v.is_number_integer() && v.get<std::int64_t>() >= 0)) {
      (*out)[b] = v.get<std::uint64_t>();
    } else {
      return FieldError(
          field, fmt::format("bucket {}: expected a non-negative integer, got {}", b, v.dump()));
    }
  }
  return Status::Ok();
}

Status ReadLevel(const Json& obj, RiskLevel* out) {
  const auto it = obj.find("forecast_level");
  if (it == obj.end() || it->is_null()) return Status::Ok();
  if (!it->is_string()) {
    return FieldError("forecast_level", fmt::format("expected a string, got {}", it->type_name()));
  }
  const auto& s = it->get_ref<const std::string&>();
  for (RiskLevel level : {RiskLevel::kUnknown, RiskLevel::kOk, RiskLevel::kWatch,
                          RiskLevel::kWarning, RiskLevel::kCritical}) {
    if (s == RiskLevelName(level)) {
      *out = level;
      return Status::Ok();
    }
  }
  return FieldError(
      "forecast_level",
      fmt::format("\"{}\" is not one of unknown, ok, watch, warning, critical", s.substr(0, 40)));
}

Status DecodeObject(const Json& obj, AgentSample* s) {
  if (!obj.is_object()) {
    return Status::Corruption(fmt::format("expected a JSON object, got {}", obj.type_name()));
  }
  if (!obj.contains("pid")) return FieldError("pid", "missing (required)");
  if (!obj.contains("device_uuid")) return FieldError("device_uuid", "missing (required)");
  FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, "pid", 1, &s->pid));
  FRAGSCOPE_RETURN_IF_ERROR(ReadString(obj, "device_uuid", &s->device_uuid));
  if (s->device_uuid.empty()) return FieldError("device_uuid", "empty");
  FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, "rank", -1, &s->rank));
  FRAGSCOPE_RETURN_IF_ERROR(ReadString(obj, "job", &s->job));
  FRAGSCOPE_RETURN_IF_ERROR(ReadString(obj, "run", &s->run));
  FRAGSCOPE_RETURN_IF_ERROR(ReadString(obj, "architecture", &s->architecture));
  FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, "device_index", -1, &s->device_index));
  FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, "step", -1, &s->step));
  FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, "time_us", 0, &s->time_us));
  const std::pair<const char*, std::uint64_t*> counts[] = {
      {"reserved_bytes", &s->reserved_bytes},
      {"allocated_bytes", &s->allocated_bytes},
      {"active_bytes", &s->active_bytes},
      {"requested_bytes", &s->requested_bytes},
      {"peak_reserved_bytes", &s->peak_reserved_bytes},
      {"peak_allocated_bytes", &s->peak_allocated_bytes},
      {"num_alloc_retries", &s->num_alloc_retries},
      {"num_ooms", &s->num_ooms},
      {"largest_request_bytes", &s->largest_request_bytes},
  };
  for (const auto& [field, out] : counts) {
    FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, field, 0, out));
  }
  // The block-level summary: absent or null = unknown (not 0).
  const std::pair<const char*, std::optional<std::uint64_t>*> summary[] = {
      {"cached_free_bytes", &s->cached_free_bytes},
      {"largest_free_block", &s->largest_free_block},
      {"max_allocatable", &s->max_allocatable},
      {"stranded_bytes", &s->stranded_bytes},
  };
  for (const auto& [field, out] : summary) {
    if (const auto it = obj.find(field); it != obj.end() && !it->is_null()) {
      std::uint64_t v = 0;
      FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, field, 0, &v));
      *out = v;
    }
  }
  if (const auto it = obj.find("fragmentation_ratio"); it != obj.end() && !it->is_null()) {
    if (!it->is_number()) {
      return FieldError("fragmentation_ratio",
                        fmt::format("expected a number, got {}", it->type_name()));
    }
    const double r = it->get<double>();
    if (!(r >= 0.0 && r <= 1.0)) {
      return FieldError("fragmentation_ratio", fmt::format("{} is outside [0, 1]", r));
    }
    s->fragmentation_ratio = r;
  }
  if (const auto it = obj.find("device_free_bytes"); it != obj.end() && !it->is_null()) {
    std::uint64_t free = 0;
    FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, "device_free_bytes", 0, &free));
    s->device_free_bytes = free;
  }
  DeriveAgentSummary(s);
  FRAGSCOPE_RETURN_IF_ERROR(ReadBuckets(obj, "free_block_count", &s->free_block_count));
  FRAGSCOPE_RETURN_IF_ERROR(ReadBuckets(obj, "free_block_bytes", &s->free_block_bytes));
  FRAGSCOPE_RETURN_IF_ERROR(ReadLevel(obj, &s->forecast_level));
  if (const auto it = obj.find("steps_to_oom"); it != obj.end() && !it->is_null()) {
    std::int64_t steps = 0;
    FRAGSCOPE_RETURN_IF_ERROR(ReadInt(obj, "steps_to_oom", 0, &steps));
    s->steps_to_oom = steps;
  }
  return Status::Ok();
}

}  // namespace

void DeriveAgentSummary(AgentSample* s) {
  // reserved_bytes and allocated_bytes are always known (absent = 0, as the protocol says), so
  // the derivation is the same for a sample and for its encoding decoded again.
  if (!s->cached_free_bytes) {
    s->cached_free_bytes =
        s->reserved_bytes > s->allocated_bytes ? s->reserved_bytes - s->allocated_bytes : 0;
  }
  if (!s->fragmentation_ratio) {
    s->fragmentation_ratio = s->reserved_bytes == 0
                                 ? 0.0
                                 : std::min(1.0, static_cast<double>(*s->cached_free_bytes) /
                                                     static_cast<double>(s->reserved_bytes));
  }
  if (!s->max_allocatable && s->largest_free_block && s->device_free_bytes) {
    // max(cached part, driver part); the cached part is the largest free block (its pool is
    // not sent), the driver part counts the device's free memory only (releasable cached
    // segments are not sent): a lower bound of what docs/metrics.md defines.
    s->max_allocatable =
        std::max(*s->largest_free_block,
                 model::AllocatorRules::LargestRequestForNewSegment(*s->device_free_bytes));
  }
}

std::string_view RejectReasonName(RejectReason reason) {
  switch (reason) {
    case RejectReason::kMalformed:
      return "malformed";
    case RejectReason::kBadMagic:
      return "bad_magic";
    case RejectReason::kUnsupportedVersion:
      return "unsupported_version";
    case RejectReason::kOversized:
      return "oversized";
    case RejectReason::kRateLimited:
      return "rate_limited";
    case RejectReason::kTruncated:
      return "truncated";
  }
  return "unknown";
}

bool FrameDecoder::Next(std::string* payload, ProtocolError* error, bool* failed) {
  *failed = false;
  const std::size_t available = buffer_.size() - offset_;
  const char* p = buffer_.data() + offset_;
  auto fail = [&](RejectReason reason, std::string message) {
    *failed = true;
    error->reason = reason;
    error->message = fmt::format("byte {}: {}", stream_offset(), message);
    return false;
  };
  if (available >= kLengthFieldBytes) {
    const std::uint32_t length = LoadU32(p);
    if (length < kHeaderBytes) {
      return fail(RejectReason::kOversized,
                  fmt::format("frame length {} is below the header size {}", length, kHeaderBytes));
    }
    if (length > max_frame_bytes_) {
      return fail(
          RejectReason::kOversized,
          fmt::format("frame length {} is above the limit of {} bytes", length, max_frame_bytes_));
    }
    if (available >= kLengthFieldBytes + kHeaderBytes) {
      if (std::memcmp(p + 4, kFrameMagic, 4) != 0) {
        return fail(RejectReason::kBadMagic, "bad magic (expected \"FSAG\")");
      }
      const std::uint16_t version = LoadU16(p + 8);
      const std::uint16_t type = LoadU16(p + 10);
      if (version != kProtocolVersion) {
        return fail(
            RejectReason::kUnsupportedVersion,
            fmt::format("protocol version {} (this daemon speaks {})", version, kProtocolVersion));
      }
      if (type != kTypeSample) {
        return fail(RejectReason::kUnsupportedVersion,
                    fmt::format("message type {} (version {} knows only type {})", type, version,
                                kTypeSample));
      }
      if (available >= kLengthFieldBytes + length) {
        payload->assign(p + kLengthFieldBytes + kHeaderBytes, length - kHeaderBytes);
        offset_ += kLengthFieldBytes + length;
        // Compact once the consumed prefix dominates, so the buffer stays O(one frame).
        if (offset_ == buffer_.size() || offset_ > 4096) {
          buffer_.erase(0, offset_);
          consumed_ += offset_;
          offset_ = 0;
        }
        return true;
      }
    }
  }
  return false;
}

std::string EncodeFrame(std::string_view payload, std::uint16_t version, std::uint16_t type) {
  std::string out;
  out.reserve(kLengthFieldBytes + kHeaderBytes + payload.size());
  StoreU32(&out, static_cast<std::uint32_t>(kHeaderBytes + payload.size()));
  out.append(kFrameMagic, 4);
  StoreU16(&out, version);
  StoreU16(&out, type);
  out.append(payload);
  return out;
}

Result<AgentSample> DecodeSample(std::string_view payload) {
  if (MaxDepth(payload) > kMaxJsonDepth) {
    return Status::Corruption(fmt::format(
        "JSON nests deeper than {} levels (a sample is an object of arrays)", kMaxJsonDepth));
  }
  Json obj;
  try {
    obj = Json::parse(payload.begin(), payload.end());
  } catch (const Json::exception& e) {
    return Status::Corruption(fmt::format("invalid JSON: {}", e.what()));
  }
  AgentSample sample;
  Status status = DecodeObject(obj, &sample);
  if (!status.ok()) return status;
  return sample;
}

std::string EncodeSampleJson(const AgentSample& s) {
  Json obj = {
      {"pid", s.pid},
      {"rank", s.rank},
      {"job", s.job},
      {"run", s.run},
      {"architecture", s.architecture},
      {"device_uuid", s.device_uuid},
      {"device_index", s.device_index},
      {"step", s.step},
      {"time_us", s.time_us},
      {"reserved_bytes", s.reserved_bytes},
      {"allocated_bytes", s.allocated_bytes},
      {"active_bytes", s.active_bytes},
      {"requested_bytes", s.requested_bytes},
      {"peak_reserved_bytes", s.peak_reserved_bytes},
      {"peak_allocated_bytes", s.peak_allocated_bytes},
      {"num_alloc_retries", s.num_alloc_retries},
      {"num_ooms", s.num_ooms},
      {"cached_free_bytes", OrNull(s.cached_free_bytes)},
      {"largest_free_block", OrNull(s.largest_free_block)},
      {"max_allocatable", OrNull(s.max_allocatable)},
      {"stranded_bytes", OrNull(s.stranded_bytes)},
      {"largest_request_bytes", s.largest_request_bytes},
      {"fragmentation_ratio", OrNull(s.fragmentation_ratio)},
      {"free_block_count", s.free_block_count},
      {"free_block_bytes", s.free_block_bytes},
      {"forecast_level", std::string(RiskLevelName(s.forecast_level))},
  };
  if (s.steps_to_oom) {
    obj["steps_to_oom"] = *s.steps_to_oom;
  } else {
    obj["steps_to_oom"] = nullptr;
  }
  if (s.device_free_bytes) {
    obj["device_free_bytes"] = *s.device_free_bytes;
  } else {
    obj["device_free_bytes"] = nullptr;
  }
  return obj.dump();
}

}  // namespace fragscope::agent
