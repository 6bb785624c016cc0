// Fuzz target for ParseAllocatorConfig (PYTORCH_CUDA_ALLOC_CONF strings), with three oracles:
//   * errors are kInvalidArgument/kLimitExceeded and start with "PYTORCH_CUDA_ALLOC_CONF: ";
//   * round trip: ToConfString of an accepted config parses back, in the same version, to an
//     equal config, and is itself canonical (printing that config again gives the same string);
//   * re-parse: applying the same string again on top of its own result changes nothing (the
//     reset-to-default rule and "other options keep their value" agree with each other).
// The first byte picks the ConfigVersion; the rest is the conf string.
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt, preset "fuzz") and with replay_main.cc
// (alloc_conf_fuzz_replay, a ctest that runs fuzz/corpus/alloc_conf/).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "fragscope/status.h"
#include "model/alloc_conf.h"
#include "model/allocator_rules.h"

namespace {

using fragscope::StatusCode;
using fragscope::model::AllocatorConfig;
using fragscope::model::ConfigVersion;
using fragscope::model::ParseAllocatorConfig;
using fragscope::model::ToConfString;

// Real conf strings are under 300 bytes; 4 KiB leaves room for long lists and for tokens that
// exceed every internal bound (48-byte quoting), and smaller inputs reach the parser faster.
// kMaxAllocatorConfBytes (64 KiB) is checked by the unit test instead.
constexpr std::size_t kMaxInputBytes = 4096;

[[noreturn]] void Fail(const std::string& what, std::string_view conf) {
  std::fprintf(stderr, "alloc_conf oracle failed: %s\ninput: %.*s\n", what.c_str(),
               static_cast<int>(conf.size()), conf.data());
  std::abort();
}

void Check(bool ok, const std::string& what, std::string_view conf) {
  if (!ok) Fail(what, conf);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0 || size > kMaxInputBytes) return 0;
  const auto version = static_cast<ConfigVersion>(data[0] % 3);
  const std::string_view conf(reinterpret_cast<const char*>(data + 1), size - 1);

  fragscope::Result<AllocatorConfig> parsed = ParseAllocatorConfig(conf, version);
  if (!parsed.ok()) {
    const fragscope::Status& status = parsed.status();
    Check(status.code() == StatusCode::kInvalidArgument ||
              status.code() == StatusCode::kLimitExceeded,
          "unexpected code: " + status.ToString(), conf);
    Check(status.message().rfind("PYTORCH_CUDA_ALLOC_CONF: ", 0) == 0,
          "error without prefix: " + status.message(), conf);
    return 0;
  }

  const std::string canonical = ToConfString(*parsed);
  fragscope::Result<AllocatorConfig> reparsed = ParseAllocatorConfig(canonical, version);
  Check(reparsed.ok(),
        "canonical string rejected: '" + canonical + "': " + reparsed.status().ToString(), conf);
  Check(*reparsed == *parsed, "round trip changed the config: '" + canonical + "'", conf);
  Check(ToConfString(*reparsed) == canonical,
        "canonical string is not stable: '" + canonical + "' vs '" + ToConfString(*reparsed) + "'",
        conf);

  fragscope::Result<AllocatorConfig> again = ParseAllocatorConfig(conf, *parsed, version);
  Check(again.ok(), "re-parse on top of its own result failed: " + again.status().ToString(), conf);
  Check(*again == *parsed, "re-parse on top of its own result changed the config", conf);

  // The rules derived from any accepted config must be usable; exercise the rounding table.
  const fragscope::model::AllocatorRules rules = parsed->Rules();
  for (int shift = 0; shift < 40; shift += 3) {
    const std::uint64_t request = (std::uint64_t{1} << shift) + size;
    Check(rules.RoundSize(request) >= request, "RoundSize below the request", conf);
  }
  return 0;
}
