#include "model/alloc_conf.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace fragscope::model {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr ConfigVersion kV113 = ConfigVersion::kV1_13;
constexpr ConfigVersion kV2 = ConfigVersion::kV2;
constexpr ConfigVersion kNewest = ConfigVersion::kNewest;
constexpr ConfigVersion kAllVersions[] = {kV113, kV2, kNewest};

AllocatorConfig Parse(std::string_view conf, ConfigVersion version = kNewest) {
  Result<AllocatorConfig> config = ParseAllocatorConfig(conf, version);
  EXPECT_TRUE(config.ok()) << conf << ": " << config.status().ToString();
  return config.ok() ? *config : AllocatorConfig();
}

AllocatorConfig Apply(std::string_view conf, const AllocatorConfig& previous,
                      ConfigVersion version = kNewest) {
  Result<AllocatorConfig> config = ParseAllocatorConfig(conf, previous, version);
  EXPECT_TRUE(config.ok()) << conf << ": " << config.status().ToString();
  return config.ok() ? *config : AllocatorConfig();
}

// The message of the error `conf` must produce.
std::string ErrorOf(std::string_view conf, ConfigVersion version = kNewest) {
  Result<AllocatorConfig> config = ParseAllocatorConfig(conf, version);
  EXPECT_FALSE(config.ok()) << conf << " was accepted";
  if (config.ok()) return "";
  EXPECT_EQ(config.status().code(), StatusCode::kInvalidArgument) << config.status().ToString();
  EXPECT_THAT(config.status().message(), StartsWith("PYTORCH_CUDA_ALLOC_CONF: "));
  return config.status().message();
}

// PyTorch's roundup_power2_divisions(size): the table entry for a request of `bytes`.
std::uint64_t DivisionsFor(const AllocatorConfig& config, std::uint64_t bytes) {
  const int index = std::clamp(63 - std::countl_zero(bytes) - 20, 0, kRoundupIntervals - 1);
  return config.roundup_power2_divisions[static_cast<std::size_t>(index)];
}

std::array<std::uint64_t, kRoundupIntervals> Table(std::initializer_list<std::uint64_t> values) {
  std::array<std::uint64_t, kRoundupIntervals> table{};
  std::copy(values.begin(), values.end(), table.begin());
  return table;
}

// ---- Defaults ----------------------------------------------------------------------------------

TEST(AllocConfTest, DefaultsArePyTorchs) {
  const AllocatorConfig config;
  EXPECT_EQ(config.max_split_size, kUnlimited);
  EXPECT_EQ(config.max_non_split_rounding, 20 * kMiB);
  EXPECT_EQ(config.roundup_power2_divisions, Table({}));
  EXPECT_EQ(config.roundup_bypass_threshold, kUnlimited);
  EXPECT_EQ(config.garbage_collection_threshold, 0.0);
  EXPECT_FALSE(config.expandable_segments);
  EXPECT_EQ(config.per_process_memory_fraction, 1.0);
  EXPECT_FALSE(config.graph_capture_record_stream_reuse);
  EXPECT_FALSE(config.throw_on_cudamalloc_oom);
  EXPECT_EQ(config.backend, AllocatorBackend::kNative);
  EXPECT_FALSE(config.release_lock_on_cudamalloc);
  EXPECT_FALSE(config.pinned_use_cuda_host_register);
  EXPECT_EQ(config.pinned_num_register_threads, 1u);
  EXPECT_FALSE(config.pinned_use_background_threads);
  EXPECT_EQ(config.pinned_reserve_segment_size_mb, 0u);
  EXPECT_FALSE(config.pinned_free_catch_all);
  EXPECT_FALSE(config.expandable_segments_reserve.has_value());
  EXPECT_TRUE(config.expandable_segments_reserve_by_class.empty());
  for (ConfigVersion version : kAllVersions) {
    EXPECT_EQ(Parse("", version), config);
    EXPECT_EQ(Parse(" \t\n ", version), config);
  }
}

TEST(AllocConfTest, DefaultRulesEqualAllocatorRulesDefaults) {
  const AllocatorRules rules = AllocatorConfig().Rules();
  const AllocatorRules expected;
  EXPECT_EQ(rules.max_split_size, expected.max_split_size);
  EXPECT_EQ(rules.max_non_split_rounding, expected.max_non_split_rounding);
  EXPECT_EQ(rules.roundup_power2_divisions, expected.roundup_power2_divisions);
  EXPECT_EQ(rules.expandable_segments, expected.expandable_segments);
}

// ---- Each option -------------------------------------------------------------------------------

TEST(AllocConfTest, MaxSplitSize) {
  EXPECT_EQ(Parse("max_split_size_mb:40").max_split_size, 40 * kMiB);
  EXPECT_EQ(Parse("max_split_size_mb:20").max_split_size, 20 * kMiB);  // newest: >= 20
  // PyTorch clamps to SIZE_MAX / 1 MiB so the byte count fits.
  EXPECT_EQ(Parse("max_split_size_mb:18446744073709551615").max_split_size,
            (kUnlimited / kMiB) * kMiB);
  EXPECT_EQ(ErrorOf("max_split_size_mb:10"),
            "PYTORCH_CUDA_ALLOC_CONF: max_split_size_mb: 10 is below the minimum 20 (at offset "
            "18; PyTorch: CachingAllocator option max_split_size_mb too small, must be >= 20)");
  EXPECT_THAT(ErrorOf("max_split_size_mb:18446744073709551616"), HasSubstr("out of range"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:abc"),
              HasSubstr("max_split_size_mb: 'abc' is not a non-negative integer (at offset 18"));
  // PyTorch's stoi/stoull would read these as 128 and as a wrapped huge value; we refuse.
  EXPECT_THAT(ErrorOf("max_split_size_mb:128MB"), HasSubstr("'128MB' is not a non-negative"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:-5"), HasSubstr("'-5' is not a non-negative"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:+64"), HasSubstr("'+64' is not a non-negative"));
}

TEST(AllocConfTest, MaxNonSplitRounding) {
  EXPECT_EQ(Parse("max_non_split_rounding_mb:30").max_non_split_rounding, 30 * kMiB);
  EXPECT_EQ(Parse("max_non_split_rounding_mb:20").max_non_split_rounding, 20 * kMiB);
  EXPECT_THAT(ErrorOf("max_non_split_rounding_mb:19"),
              HasSubstr("max_non_split_rounding_mb: 19 is below the minimum 20 (at offset 26; "
                        "PyTorch: CachingAllocator option max_non_split_rounding_mb too small, "
                        "must be >= 20)"));
}

TEST(AllocConfTest, RoundupPower2DivisionsSingleValue) {
  AllocatorConfig config = Parse("roundup_power2_divisions:4");
  for (std::uint64_t d : config.roundup_power2_divisions) EXPECT_EQ(d, 4u);
  EXPECT_EQ(Parse("roundup_power2_divisions:1").roundup_power2_divisions[7], 1u);
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:3"),
              HasSubstr("roundup_power2_divisions: 3 is not a power of 2 (at offset 25; "
                        "PyTorch: For roundups, the divisions has to be power of 2)"));
  // 0 is allowed inside a list but never as the single value.
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:0"), HasSubstr("0 is not a power of 2"));
}

TEST(AllocConfTest, GarbageCollectionThreshold) {
  EXPECT_EQ(Parse("garbage_collection_threshold:0.5").garbage_collection_threshold, 0.5);
  EXPECT_EQ(Parse("garbage_collection_threshold:1e-3").garbage_collection_threshold, 1e-3);
  EXPECT_EQ(Parse("garbage_collection_threshold:.25").garbage_collection_threshold, 0.25);
  EXPECT_EQ(ErrorOf("garbage_collection_threshold:1.2"),
            "PYTORCH_CUDA_ALLOC_CONF: garbage_collection_threshold: 1.2 is not in (0, 1) (at "
            "offset 29; PyTorch: garbage_collect_threshold is invalid, set it in (0.0, 1.0))");
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:0"), HasSubstr("0 is not in (0, 1)"));
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:1"), HasSubstr("1 is not in (0, 1)"));
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:nan"), HasSubstr("nan is not in (0, 1)"));
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:0.5x"), HasSubstr("'0.5x' is not a number"));
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:1e-400"), HasSubstr("is out of range"));
}

TEST(AllocConfTest, Booleans) {
  using Field = bool AllocatorConfig::*;
  struct Flag {
    std::string_view key;
    Field field;
  };
  const Flag flags[] = {
      {"expandable_segments", &AllocatorConfig::expandable_segments},
      {"release_lock_on_cudamalloc", &AllocatorConfig::release_lock_on_cudamalloc},
      {"release_lock_on_hipmalloc", &AllocatorConfig::release_lock_on_cudamalloc},
      {"pinned_use_cuda_host_register", &AllocatorConfig::pinned_use_cuda_host_register},
      {"pinned_use_hip_host_register", &AllocatorConfig::pinned_use_cuda_host_register},
      {"pinned_use_background_threads", &AllocatorConfig::pinned_use_background_threads},
      {"pinned_free_catch_all", &AllocatorConfig::pinned_free_catch_all},
      {"graph_capture_record_stream_reuse", &AllocatorConfig::graph_capture_record_stream_reuse},
      {"throw_on_cudamalloc_oom", &AllocatorConfig::throw_on_cudamalloc_oom},
  };
  for (const Flag& flag : flags) {
    SCOPED_TRACE(flag.key);
    const std::string key(flag.key);
    const AllocatorConfig on = Parse(key + ":True");
    EXPECT_TRUE(on.*flag.field);
    EXPECT_FALSE(Apply(key + ":False", on).*flag.field);
    EXPECT_THAT(ErrorOf(key + ":true"), HasSubstr(": 'true' must be True or False"));
    EXPECT_THAT(ErrorOf(key + ":1"), HasSubstr(": '1' must be True or False"));
  }
  EXPECT_EQ(ErrorOf("expandable_segments:true"),
            "PYTORCH_CUDA_ALLOC_CONF: expandable_segments: 'true' must be True or False (at "
            "offset 20; PyTorch: Expected 'True' or 'False' at index 2 in ConfigTokenizer but "
            "got 'true')");
}

TEST(AllocConfTest, PinnedNumbers) {
  EXPECT_EQ(Parse("pinned_num_register_threads:8").pinned_num_register_threads, 8u);
  EXPECT_EQ(Parse("pinned_num_register_threads:128").pinned_num_register_threads, 128u);
  EXPECT_THAT(ErrorOf("pinned_num_register_threads:3"),
              HasSubstr("pinned_num_register_threads: 3 is not a power of 2 (at offset 28; "
                        "PyTorch: Number of register threads has to be power of 2, got 3)"));
  EXPECT_THAT(ErrorOf("pinned_num_register_threads:0"), HasSubstr("0 is not a power of 2"));
  EXPECT_THAT(ErrorOf("pinned_num_register_threads:256"),
              HasSubstr("pinned_num_register_threads: 256 is above the maximum 128"));
  EXPECT_EQ(Parse("pinned_reserve_segment_size_mb:64").pinned_reserve_segment_size_mb, 64u);
  EXPECT_THAT(ErrorOf("pinned_reserve_segment_size_mb:0"),
              HasSubstr("pinned_reserve_segment_size_mb: 0 must be greater than 0"));
}

TEST(AllocConfTest, PerProcessMemoryFraction) {
  EXPECT_EQ(Parse("per_process_memory_fraction:0.75").per_process_memory_fraction, 0.75);
  EXPECT_EQ(Parse("per_process_memory_fraction:0").per_process_memory_fraction, 0.0);
  EXPECT_EQ(Parse("per_process_memory_fraction:1").per_process_memory_fraction, 1.0);
  EXPECT_THAT(ErrorOf("per_process_memory_fraction:1.5"),
              HasSubstr("per_process_memory_fraction: 1.5 is not in [0, 1] (at offset 28; "
                        "PyTorch: per_process_memory_fraction is invalid, set it in [0.0, 1.0])"));
  EXPECT_THAT(ErrorOf("per_process_memory_fraction:-0.1"), HasSubstr("-0.1 is not in [0, 1]"));
}

TEST(AllocConfTest, Backend) {
  EXPECT_EQ(Parse("backend:native").backend, AllocatorBackend::kNative);
  const AllocatorConfig async = Parse("backend:cudaMallocAsync");
  EXPECT_EQ(async.backend, AllocatorBackend::kCudaMallocAsync);
  EXPECT_THAT(ErrorOf("backend:async"),
              HasSubstr("backend: 'async' is not native or cudaMallocAsync (at offset 8; "
                        "PyTorch: Unknown allocator backend, options are native and "
                        "cudaMallocAsync)"));
  // At run time the backend may be repeated but not changed: PyTorch chose it at load time.
  EXPECT_EQ(Apply("backend:cudaMallocAsync", async).backend, AllocatorBackend::kCudaMallocAsync);
  EXPECT_EQ(Apply("max_split_size_mb:64", async).backend, AllocatorBackend::kCudaMallocAsync);
  Result<AllocatorConfig> changed = ParseAllocatorConfig("backend:native", async);
  ASSERT_FALSE(changed.ok());
  EXPECT_THAT(changed.status().message(),
              HasSubstr("backend: 'native' differs from the backend chosen at process start "
                        "(cudaMallocAsync)"));
  EXPECT_FALSE(ParseAllocatorConfig("backend:cudaMallocAsync", AllocatorConfig()).ok());
}

TEST(AllocConfTest, ExpandableSegmentsReserve) {
  const AllocatorConfig fraction = Parse("expandable_segments_reserve:0.5");
  ASSERT_TRUE(fraction.expandable_segments_reserve.has_value());
  EXPECT_EQ(*fraction.expandable_segments_reserve, (ExpandableSegmentsReserve{true, 0.5}));
  EXPECT_EQ(*Parse("expandable_segments_reserve:40G").expandable_segments_reserve,
            (ExpandableSegmentsReserve{false, 40.0}));
  EXPECT_EQ(*Parse("expandable_segments_reserve:40g").expandable_segments_reserve,
            (ExpandableSegmentsReserve{false, 40.0}));
  // PyTorch ignores a malformed reserve with a warning and keeps what it had.
  for (std::string_view bad : {"abc", "-1", "0", "inf", "nanG", "G", "1.5x"}) {
    SCOPED_TRACE(bad);
    const AllocatorConfig kept = Apply("expandable_segments_reserve:" + std::string(bad), fraction);
    EXPECT_EQ(kept.expandable_segments_reserve, fraction.expandable_segments_reserve);
  }

  const AllocatorConfig by_class =
      Parse("expandable_segments_reserve_by_class:[default:40G,comm:0.25,bad:-1,comm:0.5,]");
  EXPECT_EQ(by_class.expandable_segments_reserve_by_class.size(), 2u);
  EXPECT_EQ(by_class.expandable_segments_reserve_by_class.at("default"),
            (ExpandableSegmentsReserve{false, 40.0}));
  EXPECT_EQ(by_class.expandable_segments_reserve_by_class.at("comm"),
            (ExpandableSegmentsReserve{true, 0.5}));  // the last one wins
  // Each occurrence replaces the whole map; an absent one keeps it.
  EXPECT_EQ(Apply("expandable_segments:True", by_class).expandable_segments_reserve_by_class,
            by_class.expandable_segments_reserve_by_class);
  EXPECT_TRUE(Apply("expandable_segments_reserve_by_class:[]", by_class)
                  .expandable_segments_reserve_by_class.empty());
  EXPECT_THAT(ErrorOf("expandable_segments_reserve_by_class:0.5"),
              HasSubstr("expected a list [class:value,...], found '0.5'"));
  EXPECT_THAT(ErrorOf("expandable_segments_reserve_by_class:[a:1"), HasSubstr("has no ']'"));
  EXPECT_THAT(ErrorOf("expandable_segments_reserve_by_class:[a]"),
              HasSubstr("expected class:value, found 'a'"));
}

// ---- Syntax ------------------------------------------------------------------------------------

TEST(AllocConfTest, WhitespaceIsIgnoredEverywhere) {
  // PyTorch's lexer drops whitespace before it splits, even inside a word.
  const AllocatorConfig config =
      Parse(" max_split _size_mb : 1 28 ,\tgarbage_collection_threshold:\n0.6 ");
  EXPECT_EQ(config.max_split_size, 128 * kMiB);
  EXPECT_EQ(config.garbage_collection_threshold, 0.6);
}

TEST(AllocConfTest, TrailingCommaLikePyTorch) {
  // From PyTorch's AllocatorConfig_test: "expandable_segments:False," is accepted.
  EXPECT_FALSE(Parse("expandable_segments:False,").expandable_segments);
  EXPECT_TRUE(Parse("expandable_segments:True,", kV2).expandable_segments);
  EXPECT_THAT(ErrorOf("expandable_segments:True,,max_split_size_mb:100"),
              HasSubstr("expected a key, found ',' (at offset 25; PyTorch: Unrecognized key "
                        "',' in CUDA allocator config.)"));
  EXPECT_THAT(ErrorOf(",expandable_segments:True"), HasSubstr("expected a key, found ','"));
  EXPECT_THAT(ErrorOf("expandable_segments:True,,", kV2),
              HasSubstr("PyTorch: Unrecognized CachingAllocator option: ,)"));
}

TEST(AllocConfTest, UnrecognizedKeyNamesTokenOffsetAndKnownKeys) {
  EXPECT_THAT(ErrorOf("max_split_mb:128"),
              StartsWith("PYTORCH_CUDA_ALLOC_CONF: unrecognized key 'max_split_mb' at offset 0 "
                         "(known keys: backend, max_split_size_mb, max_non_split_rounding_mb, "));
  const std::string error = ErrorOf("expandable_segments:True, max_spilt_size_mb:128");
  EXPECT_THAT(error, HasSubstr("unrecognized key 'max_spilt_size_mb' at offset 26"));
  EXPECT_THAT(error, HasSubstr("PyTorch: Unrecognized key 'max_spilt_size_mb' in CUDA allocator "
                               "config."));
  // Tokens from untrusted input are escaped and cut in messages.
  EXPECT_THAT(ErrorOf(std::string("bad\x01\xff'key:1", 11)),
              HasSubstr("unrecognized key 'bad\\x01\\xff\\x27key' at offset 0"));
  EXPECT_THAT(ErrorOf(std::string(100, 'k') + ":1"),
              HasSubstr("'" + std::string(48, 'k') + "...'"));
}

TEST(AllocConfTest, AMistypedKeyGetsTheClosestKnownOne) {
  EXPECT_THAT(ErrorOf("expandable_segments:True, max_spilt_size_mb:128"),
              HasSubstr("'max_spilt_size_mb' at offset 26 (did you mean 'max_split_size_mb'?)"));
  EXPECT_THAT(ErrorOf("expandable_segment:True"),
              HasSubstr("(did you mean 'expandable_segments'?)"));
  EXPECT_THAT(ErrorOf("garbage_collect_threshold:0.6"),
              HasSubstr("(did you mean 'garbage_collection_threshold'?)"));
  // Only keys the version knows are suggested.
  EXPECT_THAT(ErrorOf("expandable_segment:True", kV113), Not(HasSubstr("did you mean")));
  EXPECT_THAT(ErrorOf("colour:blue"), Not(HasSubstr("did you mean")));
}

TEST(AllocConfTest, StructureErrors) {
  // The 2.x parser's own wording; newest PyTorch does not check ':' and ',' (see the docs).
  EXPECT_THAT(ErrorOf("max_split_size_mb", kV2),
              HasSubstr("expected ':' after max_split_size_mb, found the end (at offset 17; "
                        "PyTorch: Error parsing CachingAllocator settings, expected :)"));
  EXPECT_THAT(ErrorOf("max_split_size_mb"),
              HasSubstr("expected ':' after max_split_size_mb, found the end (at offset 17)"));
  EXPECT_THAT(ErrorOf("max_split_size_mb,100"),
              HasSubstr("expected ':' after max_split_size_mb, found ',' (at offset 17)"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:", kV2),
              HasSubstr("max_split_size_mb: missing value, found the end (at offset 18; "
                        "PyTorch: Error, expecting max_split_size_mb value)"));
  EXPECT_THAT(ErrorOf("expandable_segments:", kV2),
              HasSubstr("PyTorch: Expected a single True/False argument for expandable_segments"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:,expandable_segments:True"),
              HasSubstr("max_split_size_mb: missing value, found ',' (at offset 18)"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:[100]"),
              HasSubstr("max_split_size_mb: expected a single value, found a list"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:128:", kV2),
              HasSubstr("expected ',' after the value of max_split_size_mb, found ':' (at offset "
                        "21; PyTorch: Error parsing CachingAllocator settings, expected ,)"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:128:"),
              HasSubstr("expected ',' after the value of max_split_size_mb, found ':' (at offset "
                        "21)"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:128]"), HasSubstr("found ']'"));
}

TEST(AllocConfTest, LaterKeysWin) {
  EXPECT_EQ(Parse("max_split_size_mb:100,max_split_size_mb:200").max_split_size, 200 * kMiB);
  EXPECT_FALSE(Parse("expandable_segments:True,expandable_segments:False").expandable_segments);
  // A second roundup_power2_divisions edits the table the first one built (PyTorch does not
  // reset between keys of one string).
  const AllocatorConfig config =
      Parse("roundup_power2_divisions:[256:4],roundup_power2_divisions:[1024:2]");
  EXPECT_EQ(config.roundup_power2_divisions, Table({2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
}

TEST(AllocConfTest, OverlongStringIsALimitError) {
  const std::string conf(kMaxAllocatorConfBytes + 1, ' ');
  Result<AllocatorConfig> config = ParseAllocatorConfig(conf);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), StatusCode::kLimitExceeded);
  EXPECT_TRUE(ParseAllocatorConfig(std::string(kMaxAllocatorConfBytes, ' ')).ok());
}

// ---- roundup_power2_divisions lists (spec §4.1) -----------------------------------------------

TEST(AllocConfTest, ListAsInPyTorchsAllocatorConfigTest) {
  const AllocatorConfig first =
      Parse("roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1]");
  EXPECT_EQ(DivisionsFor(first, 32 * kMiB), 8u);  // below the first entry: filled by it
  EXPECT_EQ(DivisionsFor(first, 64 * kMiB), 8u);
  EXPECT_EQ(DivisionsFor(first, 128 * kMiB), 2u);
  EXPECT_EQ(DivisionsFor(first, 256 * kMiB), 4u);
  EXPECT_EQ(DivisionsFor(first, 512 * kMiB), 2u);
  EXPECT_EQ(DivisionsFor(first, 1024 * kMiB), 4u);
  EXPECT_EQ(DivisionsFor(first, 2048 * kMiB), 1u);
  EXPECT_EQ(DivisionsFor(first, 4096 * kMiB), 1u);
  EXPECT_EQ(DivisionsFor(first, 8192 * kMiB), 1u);

  const AllocatorConfig second = Parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]");
  EXPECT_EQ(DivisionsFor(second, 64 * kMiB), 8u);
  EXPECT_EQ(DivisionsFor(second, 128 * kMiB), 8u);
  EXPECT_EQ(DivisionsFor(second, 256 * kMiB), 16u);
  EXPECT_EQ(DivisionsFor(second, 512 * kMiB), 1u);
  EXPECT_EQ(DivisionsFor(second, 1024 * kMiB), 0u);  // not mentioned: stays off
  EXPECT_EQ(DivisionsFor(second, 2048 * kMiB), 8u);
  EXPECT_EQ(DivisionsFor(second, 4096 * kMiB), 2u);
}

TEST(AllocConfTest, AnEntryGovernsBToTwoB) {
  // "an entry B:D governs sizes in [B MiB, 2B MiB)", not "below B" as the user docs say.
  const AllocatorRules rules = Parse("roundup_power2_divisions:[256:4]").Rules();
  EXPECT_EQ(rules.RoundSize(300 * kMiB), 320 * kMiB);  // [256, 512) in steps of 64 MiB
  EXPECT_EQ(rules.RoundSize(511 * kMiB), 512 * kMiB);
  EXPECT_EQ(rules.RoundSize(200 * kMiB), 224 * kMiB);            // below: filled by the first entry
  EXPECT_EQ(rules.RoundSize(600 * kMiB + 1), 600 * kMiB + 512);  // [512, 1024): not rounded
}

TEST(AllocConfTest, GreaterThanOneMeansNoRounding) {
  // Issue #161139: [>:1] does not round to the next power of two.
  const AllocatorConfig config = Parse("roundup_power2_divisions:[>:1]");
  EXPECT_EQ(config.Rules().RoundSize(300 * kMiB + 1), 300 * kMiB + 512);
  EXPECT_EQ(Parse("roundup_power2_divisions:[256:0]").Rules().RoundSize(300 * kMiB + 1),
            300 * kMiB + 512);
}

TEST(AllocConfTest, ListIntervalsAndLimits) {
  // B = 1 is interval 0; B >= 32768 (32 GiB) clamps to interval 15.
  EXPECT_EQ(Parse("roundup_power2_divisions:[1:2]").roundup_power2_divisions, Table({2}));
  AllocatorConfig top = Parse("roundup_power2_divisions:[2:1,65536:8]");
  EXPECT_EQ(top.roundup_power2_divisions[15], 8u);
  EXPECT_EQ(top.roundup_power2_divisions[14], 0u);
  EXPECT_EQ(Parse("roundup_power2_divisions:[9223372036854775808:4]").roundup_power2_divisions,
            Table({4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(Parse("roundup_power2_divisions:[]").roundup_power2_divisions, Table({}));
  EXPECT_EQ(Parse("roundup_power2_divisions:[256:4,]").roundup_power2_divisions,
            Table({4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(Parse("roundup_power2_divisions : [ 256 : 4 , > : 2 ]").roundup_power2_divisions[9],
            2u);
}

TEST(AllocConfTest, ListErrors) {
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[3:4]"),
              HasSubstr("roundup_power2_divisions: interval 3 is not a power of 2 (at offset 26; "
                        "PyTorch: For roundups, the intervals have to be power of 2)"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[0:4]"), HasSubstr("interval 0 is not a power"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[256:3]"),
              HasSubstr("roundup_power2_divisions: divisions 3 for interval '256' must be a "
                        "power of 2 or 0 (at offset 30; PyTorch: For roundups, the divisions has "
                        "to be power of 2 or 0 to disable roundup)"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[256:4,512:2"),
              HasSubstr("roundup_power2_divisions: the list opened at offset 25 has no ']' (at "
                        "offset 37; PyTorch: Expected closing bracket ']' in ConfigTokenizer but "
                        "reached end of config)"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[256:4"), HasSubstr("has no ']'"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[256]"),
              HasSubstr("expected ':' after interval '256', found ']'"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[256:]"),
              HasSubstr("missing divisions for interval '256', found ']'"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[,256:4]"),
              HasSubstr("expected an interval (a power of 2 in MiB, or '>'), found ','"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[256:4:8]"),
              HasSubstr("expected ',' or ']' after an entry, found ':'"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[abc:4]"),
              HasSubstr("'abc' is not a non-negative integer"));
}

// ---- The re-parse rule (spec §3.1) -------------------------------------------------------------

TEST(AllocConfTest, ReparseResetsOnlyTheThreeOptions) {
  const AllocatorConfig before = Parse(
      "max_split_size_mb:100,roundup_power2_divisions:4,garbage_collection_threshold:0.5,"
      "max_non_split_rounding_mb:40,expandable_segments:True,release_lock_on_cudamalloc:True,"
      "per_process_memory_fraction:0.5,pinned_num_register_threads:8,"
      "graph_capture_record_stream_reuse:True");
  const AllocatorConfig after = Apply("expandable_segments:True", before);
  // Reset to defaults because the new string does not set them (test_allocator_settings):
  EXPECT_EQ(after.max_split_size, kUnlimited);
  EXPECT_EQ(after.roundup_power2_divisions, Table({}));
  EXPECT_EQ(after.garbage_collection_threshold, 0.0);
  // Kept from before:
  EXPECT_EQ(after.max_non_split_rounding, 40 * kMiB);
  EXPECT_TRUE(after.expandable_segments);
  EXPECT_TRUE(after.release_lock_on_cudamalloc);
  EXPECT_EQ(after.per_process_memory_fraction, 0.5);
  EXPECT_EQ(after.pinned_num_register_threads, 8u);
  EXPECT_TRUE(after.graph_capture_record_stream_reuse);

  // An empty string is a parse too: it resets exactly those three.
  AllocatorConfig expected = before;
  expected.max_split_size = kUnlimited;
  expected.roundup_power2_divisions = {};
  expected.garbage_collection_threshold = 0.0;
  EXPECT_EQ(Apply("", before), expected);

  // Options in the new string apply on top.
  const AllocatorConfig set = Apply("max_split_size_mb:64,expandable_segments:False", before);
  EXPECT_EQ(set.max_split_size, 64 * kMiB);
  EXPECT_FALSE(set.expandable_segments);
  EXPECT_TRUE(set.release_lock_on_cudamalloc);
}

TEST(AllocConfTest, DocsExample) {
  // docs/allocator-config.md, "API".
  const AllocatorConfig start = Parse("expandable_segments:True,max_split_size_mb:512");
  const AllocatorConfig later = Apply("garbage_collection_threshold:0.6", start);
  EXPECT_EQ(later.max_split_size, kUnlimited);
  EXPECT_TRUE(later.expandable_segments);
  EXPECT_EQ(ToConfString(later), "garbage_collection_threshold:0.6,expandable_segments:True");
}

TEST(AllocConfTest, FailedReparseLeavesPreviousUntouched) {
  const AllocatorConfig before = Parse("max_split_size_mb:100,expandable_segments:True");
  const AllocatorConfig copy = before;  // NOLINT(performance-unnecessary-copy-initialization)
  Result<AllocatorConfig> failed =
      ParseAllocatorConfig("max_split_size_mb:200,expandable_segments:maybe", before);
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(before, copy);
}

TEST(AllocConfTest, ReparseIn113AlsoResetsTheBypassThreshold) {
  const AllocatorConfig before = Parse(
      "roundup_power2_divisions:4,roundup_bypass_threshold_mb:64,max_split_size_mb:40", kV113);
  EXPECT_EQ(before.roundup_bypass_threshold, 64 * kMiB);
  EXPECT_EQ(Apply("garbage_collection_threshold:0.5", before, kV113).roundup_bypass_threshold,
            kUnlimited);
}

// ---- Versions (spec §13) -----------------------------------------------------------------------

TEST(AllocConfTest, MaxSplitSizeMinimumByVersion) {
  EXPECT_EQ(Parse("max_split_size_mb:20", kNewest).max_split_size, 20 * kMiB);
  for (ConfigVersion version : {kV113, kV2}) {
    SCOPED_TRACE(ConfigVersionName(version));
    EXPECT_THAT(ErrorOf("max_split_size_mb:20", version),
                HasSubstr("max_split_size_mb: 20 must be greater than 20 (at offset 18; "
                          "PyTorch: CachingAllocator option max_split_size_mb too small, must be "
                          "> 20)"));
    EXPECT_EQ(Parse("max_split_size_mb:21", version).max_split_size, 21 * kMiB);
  }
  // PyTorch <= 2.8 reads it with std::stoi.
  EXPECT_THAT(ErrorOf("max_split_size_mb:3000000000", kV2),
              HasSubstr("3000000000 is out of range (at most 2147483647)"));
  EXPECT_EQ(Parse("max_split_size_mb:3000000000", kNewest).max_split_size, 3000000000 * kMiB);
}

TEST(AllocConfTest, GreaterThanEntryByVersion) {
  // Newest: ">" starts after the last explicit entry. 2.0-2.5: it starts at it, overwriting.
  EXPECT_EQ(Parse("roundup_power2_divisions:[256:4,>:1]", kNewest).roundup_power2_divisions,
            Table({4, 4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1, 1, 1, 1}));
  EXPECT_EQ(Parse("roundup_power2_divisions:[256:4,>:1]", kV2).roundup_power2_divisions,
            Table({4, 4, 4, 4, 4, 4, 4, 4, 1, 1, 1, 1, 1, 1, 1, 1}));
  // With no explicit entry before it, newest leaves interval 0 alone.
  EXPECT_EQ(Parse("roundup_power2_divisions:[>:2]", kNewest).roundup_power2_divisions,
            Table({0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
  EXPECT_EQ(Parse("roundup_power2_divisions:[>:2]", kV2).roundup_power2_divisions,
            Table({2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}));
}

TEST(AllocConfTest, KeysByVersion) {
  EXPECT_THAT(ErrorOf("max_non_split_rounding_mb:40", kV2),
              HasSubstr("unrecognized key 'max_non_split_rounding_mb' at offset 0 (PyTorch "
                        "2.0-2.5 does not have it: added in PyTorch 2.6)"));
  EXPECT_THAT(ErrorOf("max_non_split_rounding_mb:40", kV113), HasSubstr("unrecognized key"));
  EXPECT_THAT(ErrorOf("per_process_memory_fraction:0.5", kV2), HasSubstr("unrecognized key"));
  EXPECT_THAT(ErrorOf("graph_capture_record_stream_reuse:True", kV2),
              HasSubstr("unrecognized key"));
  EXPECT_TRUE(Parse("expandable_segments:True", kV2).expandable_segments);
  EXPECT_TRUE(Parse("release_lock_on_cudamalloc:True", kV2).release_lock_on_cudamalloc);
  EXPECT_EQ(Parse("pinned_num_register_threads:4", kV2).pinned_num_register_threads, 4u);
  EXPECT_THAT(ErrorOf("expandable_segments:True", kV113),
              HasSubstr("(PyTorch 1.13 does not have it: added in PyTorch 2.1) (known keys: "
                        "backend, max_split_size_mb, roundup_power2_divisions, "
                        "roundup_bypass_threshold_mb, garbage_collection_threshold; PyTorch: "
                        "Unrecognized CachingAllocator option: expandable_segments)"));
  for (ConfigVersion version : {kV2, kNewest}) {
    EXPECT_THAT(ErrorOf("roundup_bypass_threshold_mb:64", version),
                HasSubstr("PyTorch 1.13 only; 2.0 replaced it"));
  }
  // The PyTorch wording of a bad boolean differs too.
  EXPECT_THAT(ErrorOf("expandable_segments:yes", kV2),
              HasSubstr("PyTorch: Expected a single True/False argument for expandable_segments"));
  EXPECT_THAT(ErrorOf("garbage_collection_threshold:1.5", kV2),
              HasSubstr("PyTorch: garbage_collect_threshold too big, set it 0.0~1.0"));
}

TEST(AllocConfTest, Version113Syntax) {
  // Options are separated by commas or whitespace; runs of ':' separate key and value.
  const AllocatorConfig config = Parse(
      "max_split_size_mb:128 roundup_power2_divisions::4,,roundup_bypass_threshold_mb:1024\t"
      "garbage_collection_threshold:0.8 backend:native",
      kV113);
  EXPECT_EQ(config.max_split_size, 128 * kMiB);
  EXPECT_EQ(config.roundup_power2_divisions,
            Table({4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}));
  EXPECT_EQ(config.roundup_bypass_threshold, 1024 * kMiB);
  EXPECT_EQ(config.garbage_collection_threshold, 0.8);
  // The same string is an error for the 2.x tokenizer, which glues "128" to the next key.
  EXPECT_THAT(ErrorOf("max_split_size_mb:128 garbage_collection_threshold:0.8", kNewest),
              HasSubstr("'128garbage_collection_threshold' is not a non-negative integer"));
  // Words without a value are ignored by 1.13 (its kv.size() >= 2 test).
  EXPECT_EQ(Parse("expandable_segments max_split_size_mb: bogus", kV113), AllocatorConfig());
  EXPECT_THAT(ErrorOf(":64", kV113), HasSubstr("unrecognized key '' at offset 0"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:[256:4]", kV113),
              HasSubstr("roundup_power2_divisions: list values need PyTorch 2.0 or later (at "
                        "offset 25)"));
  EXPECT_THAT(ErrorOf("max_split_size_mb:64:128", kV113),
              HasSubstr("'64:128' is not a non-negative integer (at offset 18"));
  EXPECT_THAT(ErrorOf("  garbage_collection_threshold:2", kV113),
              HasSubstr("2 is not in (0, 1) (at offset 31; PyTorch: garbage_collect_threshold "
                        "too big, set it 0.0~1.0)"));
  EXPECT_THAT(ErrorOf("roundup_power2_divisions:3", kV113),
              HasSubstr("PyTorch: For roundups, the divisons has to be power of 2"));
}

// ---- Rules() -----------------------------------------------------------------------------------

TEST(AllocConfTest, RulesCarryTheSimulatorSettings) {
  const AllocatorRules rules =
      Parse(
          "max_split_size_mb:64,max_non_split_rounding_mb:40,expandable_segments:True,"
          "roundup_power2_divisions:[1:2,1024:8]")
          .Rules();
  EXPECT_EQ(rules.max_split_size, 64 * kMiB);
  EXPECT_EQ(rules.max_non_split_rounding, 40 * kMiB);
  EXPECT_TRUE(rules.expandable_segments);
  EXPECT_EQ(rules.roundup_power2_divisions[0], 2u);
  EXPECT_EQ(rules.roundup_power2_divisions[10], 8u);
  EXPECT_EQ(rules.roundup_power2_divisions[11], 0u);
  // Divisions wider than AllocatorRules' 32 bits saturate at 2^31.
  EXPECT_EQ(Parse("roundup_power2_divisions:[1:1099511627776]").Rules().roundup_power2_divisions[0],
            std::uint32_t{1} << 31);
}

TEST(AllocConfTest, RulesApproximateThe113BypassThreshold) {
  const AllocatorConfig config =
      Parse("roundup_power2_divisions:4,roundup_bypass_threshold_mb:64", kV113);
  const AllocatorRules rules = config.Rules();
  // Intervals that start above 64 MiB are never rounded: [128 MiB, ...) = index 7 on.
  for (std::size_t i = 0; i < 7; ++i) EXPECT_EQ(rules.roundup_power2_divisions[i], 4u) << i;
  for (std::size_t i = 7; i < 16; ++i) EXPECT_EQ(rules.roundup_power2_divisions[i], 0u) << i;
  EXPECT_EQ(rules.RoundSize(200 * kMiB + 1), 200 * kMiB + 512);
  EXPECT_EQ(rules.RoundSize(40 * kMiB + 1), 40 * kMiB + 8 * kMiB);
}

// ---- ToConfString ------------------------------------------------------------------------------

TEST(AllocConfTest, ToConfStringIsCanonical) {
  EXPECT_EQ(ToConfString(AllocatorConfig()), "");
  EXPECT_EQ(ToConfString(Parse(" garbage_collection_threshold : 0.60 , max_split_size_mb:128")),
            "max_split_size_mb:128,garbage_collection_threshold:0.6");
  EXPECT_EQ(ToConfString(Parse("roundup_power2_divisions:[>:4]", kV2)),
            "roundup_power2_divisions:4");
  EXPECT_EQ(ToConfString(Parse("roundup_power2_divisions:[256:4,>:1]")),
            "roundup_power2_divisions:[256:4,512:1,1024:1,2048:1,4096:1,8192:1,16384:1,32768:1]");
  EXPECT_EQ(ToConfString(Parse("roundup_power2_divisions:[128:8,256:16,512:1,2048:8,>:2]")),
            "roundup_power2_divisions:[128:8,256:16,512:1,2048:8,4096:2,8192:2,16384:2,32768:2]");
  EXPECT_EQ(ToConfString(Parse("roundup_power2_divisions:[>:2]")),
            "roundup_power2_divisions:[1:0,2:2,4:2,8:2,16:2,32:2,64:2,128:2,256:2,512:2,1024:2,"
            "2048:2,4096:2,8192:2,16384:2,32768:2]");
  EXPECT_EQ(ToConfString(Parse("backend:cudaMallocAsync,expandable_segments:True,"
                               "expandable_segments_reserve_by_class:[z:1G,a:0.5]")),
            "backend:cudaMallocAsync,expandable_segments:True,"
            "expandable_segments_reserve_by_class:[a:0.5,z:1G]");
}

TEST(AllocConfTest, ToConfStringRoundTrips) {
  struct Case {
    ConfigVersion version;
    std::string_view conf;
  };
  const Case cases[] = {
      {kNewest,
       "max_split_size_mb:40,max_non_split_rounding_mb:30,garbage_collection_threshold:0.5,"
       "roundup_power2_divisions:[64:8,128:2,256:4,512:2,1024:4,>:1],expandable_segments:True,"
       "pinned_use_background_threads:True"},
      {kNewest,
       "backend:cudaMallocAsync,release_lock_on_hipmalloc:True,pinned_use_cuda_host_register:True,"
       "pinned_num_register_threads:128,pinned_reserve_segment_size_mb:7,"
       "pinned_free_catch_all:True,graph_capture_record_stream_reuse:True,"
       "per_process_memory_fraction:0.1,throw_on_cudamalloc_oom:True,"
       "expandable_segments_reserve:2.5G,expandable_segments_reserve_by_class:[a:0.3,b:7G]"},
      {kNewest, "max_split_size_mb:18446744073709551615,per_process_memory_fraction:0"},
      {kNewest, "garbage_collection_threshold:1e-300,per_process_memory_fraction:-0"},
      {kNewest, "roundup_power2_divisions:[>:2,4:0,65536:16]"},
      {kV2, "roundup_power2_divisions:[256:4,>:1],max_split_size_mb:2147483647"},
      {kV2, "expandable_segments:True,pinned_num_register_threads:2"},
      {kV113, "max_split_size_mb:21 roundup_power2_divisions:2 roundup_bypass_threshold_mb:0"},
      {kV113, "garbage_collection_threshold:0.999,backend:cudaMallocAsync"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.conf);
    const AllocatorConfig config = Parse(c.conf, c.version);
    const std::string canonical = ToConfString(config);
    EXPECT_EQ(Parse(canonical, c.version), config) << canonical;
    EXPECT_EQ(ToConfString(Parse(canonical, c.version)), canonical);
  }
}

// ---- One representation: user strings, header pairs, canonical strings -------------------------

TEST(AllocConfTest, PastedAssignmentsAreAccepted) {
  const AllocatorConfig want = Parse("expandable_segments:True,max_split_size_mb:128");
  for (std::string_view pasted : {
           "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128",
           "PYTORCH_ALLOC_CONF=expandable_segments:True,max_split_size_mb:128",
           "  export PYTORCH_CUDA_ALLOC_CONF=\"expandable_segments:True,max_split_size_mb:128\" ",
           "PYTORCH_ALLOC_CONF='expandable_segments:True,max_split_size_mb:128'",
           "PYTORCH_HIP_ALLOC_CONF = expandable_segments:True,max_split_size_mb:128",
           "expandable_segments:True,max_split_size_mb:128",
       }) {
    SCOPED_TRACE(pasted);
    Result<AllocatorConfig> got = ParseUserAllocatorConf(pasted);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, want);
  }
  EXPECT_EQ(StripConfAssignment("PYTORCH_CUDA_ALLOC_CONF=\"\""), "");
  // Not an assignment of the allocator's variable: parsed as it stands, and refused.
  EXPECT_FALSE(ParseUserAllocatorConf("CUDA_ALLOC_CONF=expandable_segments:True").ok());
  // ParseAllocatorConfig itself stays PyTorch's parser (_set_allocator_settings has no prefix).
  EXPECT_FALSE(ParseAllocatorConfig("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True").ok());
}

TEST(AllocConfTest, PastedAssignmentErrorsCountFromTheWholeLine) {
  // "max_split_size_mb:10" is at offset 24 of the line; its value at 42.
  Result<AllocatorConfig> got =
      ParseUserAllocatorConf("PYTORCH_CUDA_ALLOC_CONF=max_split_size_mb:10");
  ASSERT_FALSE(got.ok());
  EXPECT_THAT(got.status().message(), HasSubstr("(at offset 42;"));
}

TEST(AllocConfTest, SettingPairsOfListsKeepTheWholeList) {
  const AllocatorConfig c =
      Parse("roundup_power2_divisions:[256:1,512:2,1024:4,>:8],expandable_segments:True");
  const std::vector<std::pair<std::string, std::string>> pairs = ToSettingPairs(c);
  ASSERT_EQ(pairs.size(), 2u);
  EXPECT_EQ(pairs[0].first, "roundup_power2_divisions");
  EXPECT_EQ(pairs[0].second, "[256:1,512:2,1024:4,2048:8,4096:8,8192:8,16384:8,32768:8]");
  EXPECT_EQ(pairs[1], std::make_pair(std::string("expandable_segments"), std::string("True")));
  Result<AllocatorConfig> back = ParseAllocatorSettings(pairs);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);
}

TEST(AllocConfTest, SettingsInPyTorchsSnapshotSpelling) {
  // docs/formats.md's header example, and the keys a snapshot's allocator_settings dict has.
  Result<AllocatorConfig> a =
      ParseAllocatorSettings({{"expandable_segments", "True"}, {"max_split_size", "-1"}}, kV2);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(*a, Parse("expandable_segments:True"));
  Result<AllocatorConfig> b = ParseAllocatorSettings(
      {{"PYTORCH_CUDA_ALLOC_CONF", "whatever,the:user:typed"},
       {"max_split_size", "268435456"},
       {"garbage_collection_threshold", "0.0"},
       {"roundup_power2_divisions", R"({"1":0,"2":4,"4":0})"},
       {"graph_capture_record_stream_reuse", "False"},  // 2.9's key, off: says nothing to 2.x
       {"pinned_num_register_threads", "1"},
       {"release_lock_on_cudamalloc", "False"},
       {"trace_alloc_max_entries", "1"}},
      kV2);
  ASSERT_TRUE(b.ok()) << b.status().ToString();
  EXPECT_EQ(*b, Parse("max_split_size_mb:256,roundup_power2_divisions:[1:0,2:4,4:0]", kV2));
  // A key the version does not know, set: the parser's error.
  Result<AllocatorConfig> c =
      ParseAllocatorSettings({{"graph_capture_record_stream_reuse", "True"}}, kV2);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(c.status().message(),
              HasSubstr("unrecognized key 'graph_capture_record_stream_reuse'"));
}

TEST(AllocConfTest, VersionChoicesNameTheSameRangesAsConfigVersionName) {
  const std::string choices = ConfigVersionChoices();
  for (ConfigVersion v : kAllVersions) {
    EXPECT_THAT(choices, HasSubstr(std::string(ConfigVersionName(v)))) << choices;
  }
}

// Property: every string the generator makes (PyTorch's grammar for the version, lists with and
// without ">", whitespace, and pasted NAME= prefixes) is accepted, and its config survives every
// representation fragscope has: the canonical string, a trace header's pairs, and the pairs
// joined back into a string.
class ConfGenerator {
 public:
  explicit ConfGenerator(std::uint64_t seed) : state_(seed) {}

  std::uint64_t Below(std::uint64_t n) {
    state_ = state_ * 6364136223846793005ULL + 1442695040888963407ULL;
    return (state_ >> 33) % n;
  }
  std::uint64_t PowerOf2(int max_log) { return std::uint64_t{1} << Below(max_log + 1); }

  std::string Make(ConfigVersion v) {
    std::vector<std::string> items;
    const int count = static_cast<int>(Below(5));
    for (int i = 0; i < count; ++i) {
      switch (Below(9)) {
        case 0:
          items.push_back(fmt::format("max_split_size_mb:{}", 21 + Below(100000)));
          break;
        case 1:
          if (v == kNewest) {
            items.push_back(fmt::format("max_non_split_rounding_mb:{}", 20 + Below(5000)));
          }
          break;
        case 2:
          items.push_back(fmt::format("roundup_power2_divisions:{}", PowerOf2(6)));
          break;
        case 3:
          if (v != kV113) items.push_back("roundup_power2_divisions:" + List());
          break;
        case 4:
          items.push_back(fmt::format("garbage_collection_threshold:0.{}", 1 + Below(98)));
          break;
        case 5:
          if (v != kV113)
            items.push_back(Below(2) ? "expandable_segments:True" : "expandable_segments:False");
          break;
        case 6:
          if (v == kNewest) {
            items.push_back(fmt::format("per_process_memory_fraction:0.{}", Below(100)));
          }
          break;
        case 7:
          if (v != kV113)
            items.push_back(fmt::format("pinned_num_register_threads:{}", PowerOf2(7)));
          break;
        case 8:
          if (v == kV113)
            items.push_back(fmt::format("roundup_bypass_threshold_mb:{}", Below(4096)));
          break;
      }
    }
    std::string conf;
    for (const std::string& item : items) {
      if (!conf.empty()) conf += v == kV113 && Below(2) ? " " : (Below(3) ? "," : " , ");
      conf += item;
    }
    switch (Below(5)) {
      case 0:
        return "PYTORCH_CUDA_ALLOC_CONF=" + conf;
      case 1:
        return "PYTORCH_ALLOC_CONF=" + conf;
      case 2:
        return "export PYTORCH_CUDA_ALLOC_CONF=\"" + conf + "\"";
      default:
        return conf;
    }
  }

 private:
  std::string List() {
    std::string list = "[";
    const int entries = static_cast<int>(Below(5));
    for (int i = 0; i < entries; ++i) {
      if (i > 0) list += ",";
      list += fmt::format("{}:{}", PowerOf2(16), Below(4) == 0 ? 0 : PowerOf2(6));
    }
    if (Below(2)) list += fmt::format("{}>:{}", entries > 0 ? "," : "", PowerOf2(6));
    return list + "]";
  }
  std::uint64_t state_;
};

TEST(AllocConfTest, PropertyEveryAcceptedConfigSurvivesEveryRepresentation) {
  ConfGenerator gen(20261125);
  int lists = 0, prefixes = 0;
  for (int i = 0; i < 3000; ++i) {
    const ConfigVersion v = kAllVersions[gen.Below(3)];
    const std::string text = gen.Make(v);
    SCOPED_TRACE(fmt::format("{} ({})", text, ConfigVersionName(v)));
    lists += text.find('[') != std::string::npos;
    prefixes += text.find('=') != std::string::npos;
    Result<AllocatorConfig> parsed = ParseUserAllocatorConf(text, v);
    ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
    // parse -> print -> parse.
    const std::string canonical = ToConfString(*parsed);
    Result<AllocatorConfig> again = ParseAllocatorConfig(canonical, v);
    ASSERT_TRUE(again.ok()) << canonical << ": " << again.status().ToString();
    EXPECT_EQ(*again, *parsed) << canonical;
    EXPECT_EQ(ToConfString(*again), canonical);
    // The user's string, without its prefix, is PyTorch's own string for the same config.
    EXPECT_EQ(Parse(StripConfAssignment(text), v), *parsed);
    // A trace header's pairs, and those pairs joined as any reader of the header would.
    const auto pairs = ToSettingPairs(*parsed);
    Result<AllocatorConfig> from_pairs = ParseAllocatorSettings(pairs, v);
    ASSERT_TRUE(from_pairs.ok()) << from_pairs.status().ToString();
    EXPECT_EQ(*from_pairs, *parsed);
    std::string joined;
    for (const auto& [key, value] : pairs)
      joined += (joined.empty() ? "" : ",") + key + ":" + value;
    EXPECT_EQ(joined, canonical);
    // Re-applied at run time on top of itself, nothing changes.
    EXPECT_EQ(Apply(canonical, *parsed, v), *parsed);
  }
  EXPECT_GT(lists, 300);  // the generator does make the cases the property is about
  EXPECT_GT(prefixes, 600);
}

}  // namespace
}  // namespace fragscope::model
