#include "sources/agent/agent_protocol.h"

#include <string>

#include <gtest/gtest.h>

namespace fragscope::agent {
namespace {

constexpr char kMinimal[] = R"({"pid":42,"device_uuid":"GPU-1"})";

// Feeds `bytes` into a decoder and returns every payload; stops at the first error.
struct Decoded {
  std::vector<std::string> payloads;
  bool failed = false;
  ProtocolError error;
};

Decoded DecodeAll(FrameDecoder& d, const std::string& bytes, std::size_t step) {
  Decoded out;
  for (std::size_t i = 0; i < bytes.size() && !out.failed; i += step) {
    d.Feed(bytes.data() + i, std::min(step, bytes.size() - i));
    std::string payload;
    while (d.Next(&payload, &out.error, &out.failed)) out.payloads.push_back(payload);
  }
  return out;
}

TEST(AgentProtocolTest, FrameLayoutIsLengthMagicVersionTypePayload) {
  const std::string frame = EncodeFrame("{}");
  ASSERT_EQ(frame.size(), 14u);
  EXPECT_EQ(frame.substr(0, 4), std::string("\x0a\x00\x00\x00", 4));
  EXPECT_EQ(frame.substr(4, 4), "FSAG");
  EXPECT_EQ(frame.substr(8, 4), std::string("\x01\x00\x01\x00", 4));
  EXPECT_EQ(frame.substr(12), "{}");
}

TEST(AgentProtocolTest, OneByteAtATimeYieldsEachFrameOnce) {
  const std::string a = EncodeFrame(kMinimal);
  const std::string b = EncodeFrame(R"({"pid":43,"device_uuid":"GPU-2"})");
  FrameDecoder d;
  const Decoded out = DecodeAll(d, a + b, 1);
  ASSERT_FALSE(out.failed) << out.error.message;
  ASSERT_EQ(out.payloads.size(), 2u);
  EXPECT_EQ(out.payloads[0], kMinimal);
  EXPECT_EQ(d.buffered(), 0u);
  EXPECT_EQ(d.stream_offset(), a.size() + b.size());
}

TEST(AgentProtocolTest, TwoFramesInOneWrite) {
  FrameDecoder d;
  const Decoded out = DecodeAll(d, EncodeFrame(kMinimal) + EncodeFrame(kMinimal), 1 << 20);
  ASSERT_FALSE(out.failed);
  EXPECT_EQ(out.payloads.size(), 2u);
}

TEST(AgentProtocolTest, PartialFrameWaitsForMoreBytes) {
  const std::string frame = EncodeFrame(kMinimal);
  FrameDecoder d;
  const Decoded out = DecodeAll(d, frame.substr(0, frame.size() - 1), 1 << 20);
  EXPECT_FALSE(out.failed);
  EXPECT_TRUE(out.payloads.empty());
  EXPECT_EQ(d.buffered(), frame.size() - 1);
}

TEST(AgentProtocolTest, OversizedLengthIsRefusedBeforeThePayloadArrives) {
  FrameDecoder d(1024);
  std::string header = EncodeFrame(std::string(2000, ' ')).substr(0, 4);
  const Decoded out = DecodeAll(d, header, 1);
  ASSERT_TRUE(out.failed);
  EXPECT_EQ(out.error.reason, RejectReason::kOversized);
  EXPECT_NE(out.error.message.find("above the limit of 1024"), std::string::npos)
      << out.error.message;
}

TEST(AgentProtocolTest, LengthBelowHeaderIsRefused) {
  FrameDecoder d;
  const Decoded out = DecodeAll(d, std::string("\x03\x00\x00\x00", 4), 4);
  ASSERT_TRUE(out.failed);
  EXPECT_EQ(out.error.reason, RejectReason::kOversized);
}

TEST(AgentProtocolTest, GarbageIsBadMagic) {
  FrameDecoder d;
  const Decoded out = DecodeAll(d, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", 64);
  ASSERT_TRUE(out.failed);
  // "GET " read as a length is 0x20544547: far above the limit.
  EXPECT_EQ(out.error.reason, RejectReason::kOversized);
  FrameDecoder d2;
  std::string bad = EncodeFrame(kMinimal);
  bad[5] = 'X';
  const Decoded out2 = DecodeAll(d2, bad, 64);
  ASSERT_TRUE(out2.failed);
  EXPECT_EQ(out2.error.reason, RejectReason::kBadMagic);
}

TEST(AgentProtocolTest, UnknownVersionAndTypeAreUnsupported) {
  for (auto [version, type] : {std::pair<int, int>{2, 1}, {1, 7}}) {
    FrameDecoder d;
    const Decoded out = DecodeAll(d,
                                  EncodeFrame(kMinimal, static_cast<std::uint16_t>(version),
                                              static_cast<std::uint16_t>(type)),
                                  64);
    ASSERT_TRUE(out.failed);
    EXPECT_EQ(out.error.reason, RejectReason::kUnsupportedVersion) << out.error.message;
  }
}

TEST(AgentProtocolTest, UnknownSummaryIsDerivedOrLeftUnknown) {
  // reserved 60 GiB, allocated 49 GiB, no summary: cached free and the ratio follow from their
  // definitions; max_allocatable, largest free block and stranded stay unknown, not 0.
  Result<AgentSample> s =
      DecodeSample(R"({"pid":1,"device_uuid":"GPU-1","reserved_bytes":64424509440,)"
                   R"("allocated_bytes":52613349376})");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  ASSERT_TRUE(s->cached_free_bytes);
  EXPECT_EQ(*s->cached_free_bytes, 11ull << 30);
  ASSERT_TRUE(s->fragmentation_ratio);
  EXPECT_DOUBLE_EQ(*s->fragmentation_ratio, 11.0 / 60.0);
  EXPECT_FALSE(s->max_allocatable);
  EXPECT_FALSE(s->largest_free_block);
  EXPECT_FALSE(s->stranded_bytes);
  // With the largest free block and the device's free memory: max of the cached block and
  // what a new segment of the free memory holds (2 MiB multiples).
  s = DecodeSample(R"({"pid":1,"device_uuid":"GPU-1","reserved_bytes":100,"allocated_bytes":100,)"
                   R"("largest_free_block":8388608,"device_free_bytes":104857601})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->max_allocatable, std::optional<std::uint64_t>(104857600));
  EXPECT_EQ(s->fragmentation_ratio, std::optional<double>(0.0));
  // Sent figures are kept as sent; null is unknown (and derived where defined).
  s = DecodeSample(R"({"pid":1,"device_uuid":"GPU-1","reserved_bytes":10,"allocated_bytes":4,)"
                   R"("cached_free_bytes":5,"fragmentation_ratio":null,"max_allocatable":null})");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->cached_free_bytes, std::optional<std::uint64_t>(5));
  EXPECT_EQ(s->fragmentation_ratio, std::optional<double>(0.5));
  EXPECT_FALSE(s->max_allocatable);
  // Encoding and decoding again changes nothing (the agent fuzzer's round trip).
  for (const char* payload :
       {kMinimal, R"({"pid":1,"device_uuid":"G","largest_free_block":3,"device_free_bytes":9})"}) {
    s = DecodeSample(payload);
    ASSERT_TRUE(s.ok());
    const std::string json = EncodeSampleJson(*s);
    Result<AgentSample> back = DecodeSample(json);
    ASSERT_TRUE(back.ok());
    EXPECT_EQ(EncodeSampleJson(*back), json);
    EXPECT_FALSE(back->stranded_bytes);
  }
}

TEST(AgentProtocolTest, RoundTripKeepsEveryField) {
  AgentSample s;
  s.pid = 4000000000u;
  s.rank = 7;
  s.job = "job \"quoted\" \\ back";
  s.run = "run-1";
  s.architecture = "gpt";
  s.device_uuid = "GPU-0f0e";
  s.device_index = 3;
  s.step = 123456789012;
  s.time_us = 1700000000000000;
  s.reserved_bytes = ~std::uint64_t{0};
  s.allocated_bytes = 2;
  s.active_bytes = 3;
  s.requested_bytes = 4;
  s.peak_reserved_bytes = 5;
  s.peak_allocated_bytes = 6;
  s.num_alloc_retries = 7;
  s.num_ooms = 8;
  s.cached_free_bytes = 9;
  s.largest_free_block = 10;
  s.max_allocatable = 11;
  s.stranded_bytes = 12;
  s.fragmentation_ratio = 0.375;
  s.free_block_count[20] = 5;
  s.free_block_bytes[20] = 5 << 20;
  s.free_block_count[63] = 1;
  s.forecast_level = RiskLevel::kCritical;
  s.steps_to_oom = 17;
  s.device_free_bytes = 0;  // a full device: known, and zero
  Result<AgentSample> back = DecodeSample(EncodeSampleJson(s));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(EncodeSampleJson(*back), EncodeSampleJson(s));
  EXPECT_EQ(back->reserved_bytes, s.reserved_bytes);
  EXPECT_EQ(back->steps_to_oom, 17);
  EXPECT_EQ(back->device_free_bytes, 0u);
  EXPECT_EQ(back->forecast_level, RiskLevel::kCritical);
}

TEST(AgentProtocolTest, DefaultsForAbsentFields) {
  Result<AgentSample> s = DecodeSample(R"({"pid":1,"device_uuid":"GPU-x","future_field":[1]})");
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->rank, -1);
  EXPECT_EQ(s->step, -1);
  EXPECT_EQ(s->forecast_level, RiskLevel::kUnknown);
  EXPECT_FALSE(s->steps_to_oom.has_value());
  EXPECT_FALSE(s->device_free_bytes.has_value());
}

TEST(AgentProtocolTest, ErrorsNameTheField) {
  struct Case {
    const char* json;
    const char* needle;
  };
  const Case cases[] = {
      {"[1,2]", "expected a JSON object"},
      {"{\"pid\":1", "invalid JSON"},
      {R"({"device_uuid":"GPU-1"})", "\"pid\": missing"},
      {R"({"pid":1})", "\"device_uuid\": missing"},
      {R"({"pid":0,"device_uuid":"G"})", "\"pid\": 0 is below the minimum 1"},
      {R"({"pid":-5,"device_uuid":"G"})", "\"pid\": -5 is below"},
      {R"({"pid":4294967296,"device_uuid":"G"})", "\"pid\": 4294967296 is above"},
      {R"({"pid":1,"device_uuid":""})", "\"device_uuid\": empty"},
      {R"({"pid":1,"device_uuid":7})", "\"device_uuid\": expected a string"},
      {R"({"pid":1,"device_uuid":"G","reserved_bytes":-1})", "\"reserved_bytes\": -1"},
      {R"({"pid":1,"device_uuid":"G","reserved_bytes":1.5})", "\"reserved_bytes\": expected"},
      {R"({"pid":1,"device_uuid":"G","reserved_bytes":18446744073709551616})",
       "\"reserved_bytes\": expected an integer"},
      {R"({"pid":1,"device_uuid":"G","fragmentation_ratio":1.5})", "outside [0, 1]"},
      {R"({"pid":1,"device_uuid":"G","forecast_level":"bad"})", "\"forecast_level\""},
      {R"({"pid":1,"device_uuid":"G","steps_to_oom":-3})", "\"steps_to_oom\""},
      {R"({"pid":1,"device_uuid":"G","rank":-2})", "\"rank\": -2"},
      {R"({"pid":1,"device_uuid":"G","device_free_bytes":-1})", "\"device_free_bytes\": -1"},
      {R"({"pid":1,"device_uuid":"G","device_free_bytes":"1"})", "\"device_free_bytes\": expected"},
      {R"({"pid":1,"device_uuid":"G","free_block_count":[1,-1]})", "bucket 1"},
      {R"({"pid":1,"device_uuid":"G","job":"a\nb"})", "\"job\": control character"},
      {R"({"pid":1,"device_uuid":"G","job":[[[1]]]})", "nests deeper"},
  };
  for (const Case& c : cases) {
    Result<AgentSample> s = DecodeSample(c.json);
    ASSERT_FALSE(s.ok()) << c.json;
    EXPECT_NE(s.status().message().find(c.needle), std::string::npos)
        << c.json << " -> " << s.status().message();
  }
  std::string buckets = R"({"pid":1,"device_uuid":"G","free_block_count":[)";
  for (int i = 0; i < 65; ++i) buckets += i ? ",0" : "0";
  buckets += "]}";
  EXPECT_FALSE(DecodeSample(buckets).ok());
  const std::string long_job =
      R"({"pid":1,"device_uuid":"G","job":")" + std::string(kMaxStringBytes + 1, 'j') + "\"}";
  EXPECT_FALSE(DecodeSample(long_job).ok());
  // Deep nesting far beyond any sample: refused by the depth scan, not by recursion.
  EXPECT_FALSE(DecodeSample(std::string(50000, '[') + std::string(50000, ']')).ok());
}

}  // namespace
}  // namespace fragscope::agent
