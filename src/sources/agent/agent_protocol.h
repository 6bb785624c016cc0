// The agent wire protocol: how an in-process agent sends AgentSamples to the daemon over its
// Unix socket. docs/formats.md ("Agent protocol") is the specification; this is its code.
//
// A stream of frames, each:
//
//   offset 0  u32 LE  length   bytes after this field (header + payload), 8..max_frame_bytes
//   offset 4  4 bytes magic    "FSAG"
//   offset 8  u16 LE  version  kProtocolVersion (1)
//   offset 10 u16 LE  type     kTypeSample (1): the payload is one JSON object
//   offset 12 ...     payload  UTF-8 JSON, length - 8 bytes
//
// FrameDecoder cuts frames out of bytes as they arrive (any split across reads); DecodeSample
// turns one payload into an AgentSample. Both check every limit before they trust a byte.
//
// Thread safety: FrameDecoder is a value type used by one thread; the free functions are pure.
#ifndef FRAGSCOPE_SOURCES_AGENT_AGENT_PROTOCOL_H_
#define FRAGSCOPE_SOURCES_AGENT_AGENT_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "fragscope/status.h"
#include "sources/agent/agent_sample.h"

namespace fragscope::agent {

inline constexpr char kFrameMagic[4] = {'F', 'S', 'A', 'G'};
inline constexpr std::uint16_t kProtocolVersion = 1;
inline constexpr std::uint16_t kTypeSample = 1;
inline constexpr std::size_t kLengthFieldBytes = 4;
inline constexpr std::size_t kHeaderBytes = 8;  // magic + version + type
/// The default and the hard ceiling of a frame's length field.
inline constexpr std::size_t kDefaultMaxFrameBytes = 64 * 1024;
inline constexpr std::size_t kMaxFrameBytesCeiling = 16 * 1024 * 1024;
/// Limits inside a payload.
inline constexpr std::size_t kMaxStringBytes = 256;  // job, run, architecture, device_uuid
inline constexpr int kMaxJsonDepth = 3;              // object > array; no deeper nesting

/// Why a frame or a payload was refused. Each has a counter (and a metric label).
enum class RejectReason {
  kMalformed = 0,       // the payload is not a valid sample (JSON, field type, range)
  kBadMagic,            // the header does not start with "FSAG": not our protocol
  kUnsupportedVersion,  // a version or message type this daemon does not speak
  kOversized,           // the length field exceeds the limit (or is below the header size)
  kRateLimited,         // the connection sent faster than its allowed rate
  kTruncated,           // the connection closed in the middle of a frame
};
inline constexpr int kRejectReasonCount = 6;
/// "malformed", "bad_magic", "unsupported_version", "oversized", "rate_limited", "truncated".
std::string_view RejectReasonName(RejectReason reason);

/// A rejection: the reason (for counters) and a message that says where and what.
struct ProtocolError {
  RejectReason reason = RejectReason::kMalformed;
  std::string message;
};

/// Cuts frames out of a byte stream. Feed() appends bytes; Next() returns the next complete
/// frame's payload, nothing when more bytes are needed, or an error (after which the stream
/// cannot be resynchronised: the caller closes the connection).
class FrameDecoder {
 public:
  explicit FrameDecoder(std::size_t max_frame_bytes = kDefaultMaxFrameBytes)
      : max_frame_bytes_(max_frame_bytes) {}

  void Feed(const char* data, std::size_t size) { buffer_.append(data, size); }

  /// On success: a payload (true) or "need more bytes" (false); `payload` is set on true.
  /// Header errors are reported as soon as the first 12 bytes are in, before the payload.
  bool Next(std::string* payload, ProtocolError* error, bool* failed);

  /// Bytes received but not yet returned as a frame (0 between frames).
  std::size_t buffered() const { return buffer_.size() - offset_; }
  /// Stream offset of the next unread byte (for error messages).
  std::uint64_t stream_offset() const { return consumed_ + offset_; }

 private:
  std::size_t max_frame_bytes_;
  std::string buffer_;
  std::size_t offset_ = 0;      // start of the unread part of buffer_
  std::uint64_t consumed_ = 0;  // bytes dropped from buffer_'s front so far
};

/// One frame around `payload` (length + header + payload), as an agent writes it.
std::string EncodeFrame(std::string_view payload, std::uint16_t version = kProtocolVersion,
                        std::uint16_t type = kTypeSample);

/// Parses one payload. Errors name the field ("field \"reserved_bytes\": ..."). Summary
/// figures the agent leaves out (or sends as null) are derived where the sample allows
/// (DeriveAgentSummary), else stay unknown.
Result<AgentSample> DecodeSample(std::string_view payload);

/// Fills the unknown summary figures that docs/metrics.md's definitions give from the rest of
/// the sample: cached_free_bytes = reserved − allocated and fragmentation_ratio = cached free /
/// reserved (0 when reserved is 0), and max_allocatable = max(largest_free_block, the largest
/// request a new segment of device_free_bytes holds) when both are known. Sent figures are
/// kept as sent; largest_free_block and stranded_bytes stay unknown unless sent.
void DeriveAgentSummary(AgentSample* s);

/// The JSON payload for `sample` (every field; what DecodeSample reads back unchanged).
std::string EncodeSampleJson(const AgentSample& sample);

}  // namespace fragscope::agent

#endif  // FRAGSCOPE_SOURCES_AGENT_AGENT_PROTOCOL_H_
