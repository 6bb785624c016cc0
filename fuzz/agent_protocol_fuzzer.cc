// Fuzz target for the agent wire protocol (src/sources/agent/agent_protocol.h): the input is
// the byte stream one connection sends. Oracles: (1) how the bytes are split across reads does
// not change the frames or the error (whole vs. chunks sized by the first byte); (2) every
// sample DecodeSample accepts survives EncodeSampleJson -> DecodeSample unchanged.
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt, preset "fuzz") and with replay_main.cc
// (agent_protocol_fuzz_replay, a ctest that runs fuzz/corpus/agent_protocol/).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "sources/agent/agent_protocol.h"

namespace {

using fragscope::agent::FrameDecoder;
using fragscope::agent::ProtocolError;

struct Outcome {
  std::vector<std::string> payloads;
  bool failed = false;
  ProtocolError error;
};

Outcome Run(const std::string& bytes, std::size_t step) {
  FrameDecoder decoder(4096);
  Outcome out;
  for (std::size_t i = 0; i < bytes.size() && !out.failed; i += step) {
    decoder.Feed(bytes.data() + i, std::min(step, bytes.size() - i));
    std::string payload;
    while (decoder.Next(&payload, &out.error, &out.failed)) out.payloads.push_back(payload);
  }
  return out;
}

void Check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "agent_protocol_fuzzer: %s\n", what);
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const std::size_t step = 1 + data[0] % 17;
  const std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Outcome whole = Run(bytes, bytes.size() + 1);
  const Outcome chunked = Run(bytes, step);
  Check(whole.payloads == chunked.payloads, "frames depend on how the bytes were split");
  Check(whole.failed == chunked.failed, "the error depends on how the bytes were split");
  if (whole.failed) Check(whole.error.reason == chunked.error.reason, "error reason differs");

  // The payloads, and the raw input as one payload (reaches the JSON decoder directly).
  std::vector<std::string> payloads = whole.payloads;
  payloads.push_back(bytes);
  for (const std::string& payload : payloads) {
    fragscope::Result<fragscope::agent::AgentSample> sample =
        fragscope::agent::DecodeSample(payload);
    if (!sample.ok()) {
      Check(!sample.status().message().empty(), "an error without a message");
      continue;
    }
    const std::string json = fragscope::agent::EncodeSampleJson(*sample);
    fragscope::Result<fragscope::agent::AgentSample> back = fragscope::agent::DecodeSample(json);
    Check(back.ok(), "an encoded sample does not decode");
    Check(fragscope::agent::EncodeSampleJson(*back) == json, "round trip changed the sample");
  }
  return 0;
}
