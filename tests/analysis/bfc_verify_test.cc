// VerifyBfcRemedies: the job's settings read from a TensorFlow / JAX dump, the framework settings
// the BFC model replays, and the ranking of the replayed remedies. tests/cli/test_replay.py runs
// `explain LOG --trace` end to end.
#include "analysis/bfc_verify.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/units.h"

namespace fragscope::analysis {
namespace {

constexpr std::uint64_t MiB = kMiB;

Event Alloc(std::uint64_t id, std::uint64_t size) {
  Event e;
  e.action = Action::kAlloc;
  e.addr = id;
  e.size = size;
  return e;
}

Event Free(std::uint64_t id) {
  Event e;
  e.action = Action::kFreeRequested;
  e.addr = id;
  return e;
}

// 13 requests of just under 1 MiB, every other one freed, then 3 MiB: under a 16 MiB limit with
// memory growth the regions are 2, 4 and 8 MiB and no free chunk holds 3 MiB; preallocated, the
// pool is one 16 MiB region whose untouched end does.
std::vector<Event> Fragmenting() {
  std::vector<Event> events;
  for (std::uint64_t i = 0; i < 13; ++i) events.push_back(Alloc(i + 1, MiB - 1000 + i));
  for (std::uint64_t i = 0; i < 13; i += 2) events.push_back(Free(i + 1));
  events.push_back(Alloc(1000, 3 * MiB));
  return events;
}

// The dump of that failure: three regions, 14 MiB in the pool, 6 MiB in use, limit 16 MiB.
BfcReport FragmentedDump() {
  BfcReport r;
  r.request = 3 * MiB;
  r.rounded = 3 * MiB;
  r.request_exact = true;
  r.sum_in_use = 6 * MiB;
  r.region_bytes = 14 * MiB;
  r.memory_limit = 16 * MiB;
  r.stats = {{"LargestFreeBlock", 2 * MiB}};
  for (std::uint64_t size : {2 * MiB, 4 * MiB, 8 * MiB}) {
    BfcRegion region;
    region.size = size;
    r.regions.push_back(region);
  }
  return r;
}

const Remedy* Find(const BfcExplanation& e, const std::string& id) {
  const auto it = std::find_if(e.remedies.begin(), e.remedies.end(),
                               [&id](const Remedy& r) { return r.id == id; });
  return it == e.remedies.end() ? nullptr : &*it;
}

TEST(BfcVerifyTest, TheJobsSettingsComeFromTheDumpAndSayWhy) {
  BfcLogContext context;
  std::string why;
  model::BfcSettings s = JobBfcSettings(FragmentedDump(), context, &why);
  EXPECT_TRUE(s.allow_growth);
  EXPECT_EQ(s.memory_limit, 16 * MiB);
  EXPECT_NE(why.find("3 regions"), std::string::npos) << why;

  BfcReport one;  // one region of the whole limit: preallocation
  one.memory_limit = 16 * MiB;
  one.region_bytes = 16 * MiB;
  one.regions.resize(1);
  s = JobBfcSettings(one, context, &why);
  EXPECT_FALSE(s.allow_growth);
  EXPECT_NE(why.find("preallocation"), std::string::npos) << why;

  one.region_bytes = 4 * MiB;  // a pool below the limit has grown
  EXPECT_TRUE(JobBfcSettings(one, context, &why).allow_growth);

  context.settings = {{"TF_FORCE_GPU_ALLOW_GROWTH", "false"}};  // the log's word wins
  EXPECT_FALSE(JobBfcSettings(one, context, &why).allow_growth);
  EXPECT_NE(why.find("TF_FORCE_GPU_ALLOW_GROWTH=false"), std::string::npos) << why;
}

TEST(BfcVerifyTest, FrameworkSettingsMapOntoTheModel) {
  model::BfcSettings current;
  current.memory_limit = 16 * MiB;
  current.allow_growth = true;
  BfcCheckKind kind = BfcCheckKind::kBound;
  auto s = ApplyBfcRemedy("TF_FORCE_GPU_ALLOW_GROWTH=false", current, false, &kind);
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->allow_growth);
  EXPECT_EQ(kind, BfcCheckKind::kModel);
  s = ApplyBfcRemedy("XLA_PYTHON_CLIENT_PREALLOCATE=true", current, false, &kind);
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->allow_growth);
  s = ApplyBfcRemedy("TF_ENABLE_GPU_GARBAGE_COLLECTION=true", current, false, &kind);
  ASSERT_TRUE(s.has_value());
  EXPECT_TRUE(s->garbage_collection);
  s = ApplyBfcRemedy("memory_limit=20", current, false, &kind);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->memory_limit, 20 * MiB);

  // A fraction replaces the limit, and needs the device's size.
  EXPECT_FALSE(ApplyBfcRemedy("XLA_PYTHON_CLIENT_MEM_FRACTION=.95", current, false, &kind));
  s = ApplyBfcRemedy("per_process_gpu_memory_fraction=0.50", current, true, &kind);
  ASSERT_TRUE(s.has_value());
  EXPECT_FALSE(s->memory_limit.has_value());
  EXPECT_DOUBLE_EQ(s->memory_fraction, 0.5);
  EXPECT_FALSE(ApplyBfcRemedy("per_process_gpu_memory_fraction=1.5", current, true, &kind));

  // Leaving the BFC allocator is a bound; code changes and unknown settings are not replayed.
  s = ApplyBfcRemedy("TF_GPU_ALLOCATOR=cuda_malloc_async", current, false, &kind);
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(kind, BfcCheckKind::kBound);
  EXPECT_FALSE(ApplyBfcRemedy("", current, true, &kind));
  EXPECT_FALSE(ApplyBfcRemedy("TF_SOMETHING_ELSE=1", current, true, &kind));
}

TEST(BfcVerifyTest, AReplayedFixRanksFirstAndABoundAfterIt) {
  const BfcReport dump = FragmentedDump();
  BfcLogContext context;
  context.framework = "tensorflow";
  BfcExplanation e = ExplainBfc(dump, context);
  ASSERT_EQ(e.verdict, OomVerdict::kFragmentation);
  ASSERT_NE(Find(e, "memory_growth_off"), nullptr);
  ASSERT_NE(Find(e, "cuda_malloc_async"), nullptr);
  ASSERT_EQ(e.remedies.front().id, "cuda_malloc_async");  // the explanation's own order

  Result<BfcVerification> v = VerifyBfcRemedies(Fragmenting(), dump, context, {}, &e);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_TRUE(v->reproduced);
  EXPECT_EQ(v->current.oom_event, 20u);
  EXPECT_EQ(v->limit_bytes, 16 * MiB);

  // Preallocation fits in the model; the bound of CUDA's pool fits too but ranks after it.
  ASSERT_EQ(e.remedies.front().id, "memory_growth_off");
  ASSERT_TRUE(e.remedies[0].check.has_value());
  EXPECT_FALSE(e.remedies[0].check->oom);
  EXPECT_EQ(e.remedies[0].check->peak_reserved, 16 * MiB);
  ASSERT_EQ(e.remedies[1].id, "cuda_malloc_async");
  ASSERT_TRUE(e.remedies[1].check.has_value());
  EXPECT_FALSE(e.remedies[1].check->oom);
  // The bound's peak: the 13 live requests, each rounded up to 256 bytes (1 MiB - 768).
  EXPECT_EQ(e.remedies[1].check->peak_reserved, 13 * (MiB - 768));
}

TEST(BfcVerifyTest, ASettingThatStillFailsRanksBelowTheUntested) {
  const BfcReport dump = FragmentedDump();
  BfcLogContext context;
  context.framework = "tensorflow";
  BfcExplanation e = ExplainBfc(dump, context);
  // Replay under a limit so low that nothing helps: every replayed remedy still runs out.
  BfcVerifyOptions options;
  options.current_conf = "allow_growth:true,memory_limit:4MiB";
  Result<BfcVerification> v = VerifyBfcRemedies(Fragmenting(), dump, context, options, &e);
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ(v->current_from, "--bfc-conf");
  EXPECT_TRUE(v->reproduced);
  for (std::size_t i = 1; i < e.remedies.size(); ++i) {
    const bool earlier_failed = e.remedies[i - 1].check && e.remedies[i - 1].check->oom;
    EXPECT_FALSE(earlier_failed && !e.remedies[i].check) << "untested after a failing one";
  }
  ASSERT_TRUE(Find(e, "memory_growth_off")->check.has_value());
  EXPECT_TRUE(Find(e, "memory_growth_off")->check->oom);
}

TEST(BfcVerifyTest, BadSettingsAndAnUnboundedReplayAreErrors) {
  BfcReport dump = FragmentedDump();
  BfcLogContext context;
  BfcExplanation e = ExplainBfc(dump, context);
  BfcVerifyOptions options;
  options.current_conf = "allow_grwoth:true";
  Result<BfcVerification> v = VerifyBfcRemedies(Fragmenting(), dump, context, options, &e);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("allow_grwoth"), std::string::npos);

  dump.memory_limit.reset();  // no limit and no capacity
  BfcExplanation e2 = ExplainBfc(dump, context);
  v = VerifyBfcRemedies(Fragmenting(), dump, context, {}, &e2);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("--capacity"), std::string::npos);
}

}  // namespace
}  // namespace fragscope::analysis
