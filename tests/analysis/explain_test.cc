#include "analysis/explain.h"

#include <algorithm>
#include <string>
#include <tuple>

#include <gtest/gtest.h>

#include "analysis/tune.h"
#include "common/units.h"

namespace fragscope::analysis {
namespace {

constexpr std::uint64_t KiB = kKiB;
constexpr std::uint64_t MiB = kMiB;
constexpr std::uint64_t GiB = kGiB;

// A "total capacity of" message (2.2+) with the given figures.
OomMessage Newer(std::uint64_t tried, std::uint64_t total, std::uint64_t free,
                 std::uint64_t allocated, std::uint64_t unallocated) {
  OomMessage m;
  m.backend = "CUDA";
  m.wording = OomWording::kCapacityOf;
  m.gpu = 0;
  m.tried = tried;
  m.total = total;
  m.free = free;
  m.allocated = allocated;
  m.unallocated = unallocated;
  return m;
}

OomMessage Classic(std::uint64_t tried, std::uint64_t total, std::uint64_t free,
                   std::uint64_t allocated, std::uint64_t reserved) {
  OomMessage m;
  m.backend = "CUDA";
  m.wording = OomWording::kClassic;
  m.tried = tried;
  m.total = total;
  m.free = free;
  m.allocated = allocated;
  m.reserved = reserved;
  return m;
}

std::vector<std::string> Ids(const OomExplanation& e) {
  std::vector<std::string> ids;
  for (const Remedy& r : e.remedies) ids.push_back(r.id);
  return ids;
}

const Remedy* Find(const OomExplanation& e, const std::string& id) {
  for (const Remedy& r : e.remedies) {
    if (r.id == id) return &r;
  }
  return nullptr;
}

TEST(ExplainTest, FragmentationWhenFreePlusCachedCoversTheRequest) {
  // S = 2 GiB, F = 1 GiB, U = 1.5 GiB: F + U >= S > F.
  const OomExplanation e = ExplainOom(Newer(2 * GiB, 16 * GiB, GiB, 13 * GiB, 1536 * MiB));
  EXPECT_EQ(e.verdict, OomVerdict::kFragmentation);
  EXPECT_EQ(e.stranded, 1536 * MiB);
  EXPECT_EQ(e.shortfall, GiB);
  ASSERT_TRUE(e.figures);
  EXPECT_EQ(e.figures->reserved, 13 * GiB + 1536 * MiB);
  EXPECT_EQ(e.figures->outside, 16 * GiB - GiB - (13 * GiB + 1536 * MiB));
  EXPECT_EQ(Ids(e),
            (std::vector<std::string>{"expandable_segments", "max_split_size_mb", "fixed_shapes",
                                      "garbage_collection_threshold", "smaller_batch"}));
  EXPECT_EQ(Find(e, "max_split_size_mb")->alloc_conf, "max_split_size_mb:1024");
  EXPECT_EQ(Find(e, "expandable_segments")->alloc_conf, "expandable_segments:True");
  EXPECT_TRUE(e.missing.empty());
}

// Remedies name the variable of the message's own hint: PYTORCH_HIP_ALLOC_CONF for a "HIP out
// of memory" message, in either wording; a CUDA message keeps PYTORCH_CUDA_ALLOC_CONF.
TEST(ExplainTest, RemediesNameTheBackendsVariable) {
  OomMessage newer = Newer(2 * GiB, 16 * GiB, GiB, 13 * GiB, 1536 * MiB);
  OomMessage classic = Classic(512 * MiB, 16 * GiB, 300 * MiB, 12 * GiB, 15 * GiB);
  for (OomMessage* m : {&newer, &classic}) {
    SCOPED_TRACE(OomWordingName(m->wording));
    for (const char* backend : {"CUDA", "HIP"}) {
      SCOPED_TRACE(backend);
      m->backend = backend;
      const OomExplanation e = ExplainOom(*m);
      ASSERT_EQ(e.verdict, OomVerdict::kFragmentation);
      const std::string var = std::string("PYTORCH_") + backend + "_ALLOC_CONF=";
      const std::string other = std::string("PYTORCH_") +
                                (std::string(backend) == "HIP" ? "CUDA" : "HIP") + "_ALLOC_CONF";
      std::size_t settings = 0;
      for (const Remedy& r : e.remedies) {
        EXPECT_EQ(r.action.find(other), std::string::npos) << r.action;
        if (r.alloc_conf.empty()) continue;
        ++settings;
        EXPECT_EQ(r.action.find("Set " + var + r.alloc_conf.substr(0, r.alloc_conf.find(','))), 0u)
            << r.action;
      }
      EXPECT_GE(settings, 3u);  // expandable_segments, max_split_size_mb, garbage collection
    }
  }
}

TEST(ExplainTest, BoundaryRequestEqualToFreePlusCachedIsFragmentation) {
  const OomExplanation e = ExplainOom(Newer(100 * MiB, GiB, 40 * MiB, 500 * MiB, 60 * MiB));
  EXPECT_EQ(e.verdict, OomVerdict::kFragmentation);
  // One byte more: a shortage, whoever holds the 424 MiB outside PyTorch's cache.
  OomMessage m = Newer(100 * MiB + 1, GiB, 40 * MiB, 500 * MiB, 60 * MiB);
  EXPECT_EQ(ExplainOom(m).verdict, OomVerdict::kShortage);
  // With a "this process" line and no other process, nobody else held it: shortage.
  m.this_process = 984 * MiB;
  EXPECT_EQ(ExplainOom(m).verdict, OomVerdict::kShortage);
}

TEST(ExplainTest, ShortageWhenEvenTheCacheIsNotEnough) {
  // S = 6 GiB; F = 1 GiB, U = 1 GiB; outside = 24 - 1 - 22 = 1 GiB: not enough either.
  const OomExplanation e = ExplainOom(Newer(6 * GiB, 24 * GiB, GiB, 21 * GiB, GiB));
  EXPECT_EQ(e.verdict, OomVerdict::kShortage);
  EXPECT_EQ(Ids(e)[0], "smaller_batch");
  ASSERT_NE(Find(e, "larger_gpu"), nullptr);
  EXPECT_NE(Find(e, "larger_gpu")->action.find("28.00 GiB"), std::string::npos);  // 24 + 4
}

TEST(ExplainTest, RequestLargerThanTheGpu) {
  const OomExplanation e = ExplainOom(Newer(100 * GiB, 24 * GiB, 20 * GiB, GiB, 0));
  EXPECT_EQ(e.verdict, OomVerdict::kShortage);
  EXPECT_EQ(Ids(e)[0], "check_request");
}

TEST(ExplainTest, OtherProcessesWhenTheirMemoryWouldHaveSufficed) {
  OomMessage m = Newer(4 * GiB, 44 * GiB, GiB, 25 * GiB, 512 * MiB);
  m.this_process = 27 * GiB;
  m.processes = {{70021, 9 * GiB}, {70544, 6 * GiB}};
  const OomExplanation e = ExplainOom(m);
  EXPECT_EQ(e.verdict, OomVerdict::kOtherProcesses);
  ASSERT_TRUE(e.figures->others);
  EXPECT_EQ(*e.figures->others, 15 * GiB);
  EXPECT_EQ(Ids(e)[0], "free_other_processes");
  EXPECT_NE(e.remedies[0].action.find("70021 (9.00 GiB), 70544 (6.00 GiB)"), std::string::npos);
}

TEST(ExplainTest, OwnProcessListedByPidIsNotCountedAsOther) {
  // No "this process" line; process 12 holds more than PyTorch reserved: it is this process.
  OomMessage m = Newer(3 * GiB, 16 * GiB, GiB, 13 * GiB, GiB);
  m.processes = {{12, 15 * GiB}};
  const OomExplanation e = ExplainOom(m);
  ASSERT_TRUE(e.figures->self_pid);
  EXPECT_EQ(*e.figures->self_pid, 12u);
  EXPECT_EQ(*e.figures->others, 0u);
  EXPECT_EQ(e.verdict, OomVerdict::kShortage);
  // The same list with a small second process: that one is another process.
  m.processes = {{12, 15 * GiB}, {99, 2 * GiB}};
  const OomExplanation f = ExplainOom(m);
  EXPECT_EQ(*f.figures->others, 2 * GiB);
  EXPECT_EQ(f.verdict, OomVerdict::kOtherProcesses);
}

TEST(ExplainTest, ShortageWhateverHoldsTheMemoryOutsideTheCache) {
  // S = 3 GiB; F + U = 1 + 1 GiB; outside = 16 - 1 - 12 = 3 GiB would cover it, and the
  // classic wording does not say who holds it (other processes, the CUDA context, NCCL,
  // cuBLAS workspaces): the job lacked memory all the same.
  const OomExplanation e = ExplainOom(Classic(3 * GiB, 16 * GiB, GiB, 11 * GiB, 12 * GiB));
  EXPECT_EQ(e.verdict, OomVerdict::kShortage);
  EXPECT_TRUE(e.missing.empty());
  EXPECT_EQ(e.figures->unallocated, GiB);
  const Remedy* see = Find(e, "see_outside_memory");
  ASSERT_NE(see, nullptr);
  EXPECT_NE(see->action.find("nvidia-smi"), std::string::npos);
  EXPECT_NE(see->action.find("torch.cuda.mem_get_info()"), std::string::npos);
  EXPECT_NE(e.summary.find("needs 1024.00 MiB more"), std::string::npos) << e.summary;
  // With every outside byte accounted for by listed processes there is nothing to look for.
  OomMessage m = Newer(3 * GiB, 16 * GiB, GiB, 11 * GiB, GiB);
  m.this_process = 12 * GiB;
  m.processes = {{7, 3 * GiB}};
  const OomExplanation o = ExplainOom(m);
  EXPECT_EQ(o.verdict, OomVerdict::kOtherProcesses);
}

TEST(ExplainTest, FiguresBeyondTheCardWithNothingFreeAreSysmemFallback) {
  // 13.5 GiB reserved on an 8 GiB card, 0 free: Windows' WDDM driver spilled 5.5 GiB.
  const OomExplanation e =
      ExplainOom(Classic(256 * MiB, 8 * GiB, 0, 13 * GiB, 13 * GiB + 512 * MiB));
  EXPECT_TRUE(e.figures_agree);
  EXPECT_EQ(e.figures->sysmem_fallback, 5 * GiB + 512 * MiB);
  EXPECT_EQ(e.figures->outside, 0u);
  EXPECT_EQ(e.verdict, OomVerdict::kFragmentation);  // U = 512 MiB >= S
  EXPECT_NE(Find(e, "sysmem_fallback"), nullptr);
  // Shortage under fallback: a GPU of at least R + F + missing.
  const OomExplanation s = ExplainOom(Classic(2 * GiB, 8 * GiB, 0, 13 * GiB, 13 * GiB));
  EXPECT_EQ(s.verdict, OomVerdict::kShortage);
  EXPECT_NE(Find(s, "larger_gpu")->action.find("15.00 GiB"), std::string::npos);
}

TEST(ExplainTest, FiguresBeyondTheCardThatNoStateShowsAreGarbled) {
  // A total of 0 bytes (a figure cut in two), free memory beside more than the card reserved,
  // and allocated above reserved: no device, and no fallback, shows these.
  for (const OomMessage& m : {Classic(2 * MiB, 0, 0, 1023 * GiB, 1023 * GiB),
                              Classic(2 * GiB, 6 * GiB, 3 * GiB, 9 * GiB, 9 * GiB + 512 * MiB),
                              Classic(2 * GiB, 8 * GiB, 0, 20 * GiB, 10 * GiB)}) {
    const OomExplanation e = ExplainOom(m);
    EXPECT_FALSE(e.figures_agree);
    EXPECT_EQ(e.verdict, OomVerdict::kUndetermined);
    EXPECT_EQ(e.figures->sysmem_fallback, 0u);
  }
}

TEST(ExplainTest, RemediesTheJobAlreadyHasAreNotProposed) {
  OomExplanation e = ExplainOom(Newer(2 * GiB, 16 * GiB, GiB, 13 * GiB, 1536 * MiB));
  ASSERT_NE(Find(e, "expandable_segments"), nullptr);
  const std::string split = Find(e, "max_split_size_mb")->alloc_conf;
  Result<model::AllocatorConfig> current =
      model::ParseAllocatorConfig("expandable_segments:True," + split);
  ASSERT_TRUE(current.ok());
  OmitRemediesInEffect(*current, "--alloc-conf", model::ConfigVersion::kNewest, &e);
  EXPECT_EQ(Find(e, "expandable_segments"), nullptr);
  EXPECT_EQ(Find(e, "max_split_size_mb"), nullptr);
  EXPECT_NE(Find(e, "fixed_shapes"), nullptr);  // code changes stay
  EXPECT_TRUE(std::any_of(e.notes.begin(), e.notes.end(), [](const std::string& n) {
    return n.find("already has it (--alloc-conf)") != std::string::npos;
  }));
  // Another value of the same key is a different setting: still proposed.
  OomExplanation f = ExplainOom(Newer(2 * GiB, 16 * GiB, GiB, 13 * GiB, 1536 * MiB));
  OmitRemediesInEffect(*model::ParseAllocatorConfig("max_split_size_mb:512"), "--alloc-conf",
                       model::ConfigVersion::kNewest, &f);
  EXPECT_NE(Find(f, "max_split_size_mb"), nullptr);
}

TEST(ExplainTest, XpuRemediesNameTheXpuVariable) {
  OomMessage m = Newer(2 * GiB, 16 * GiB, GiB, 13 * GiB, 1536 * MiB);
  m.backend = "XPU";
  const OomExplanation e = ExplainOom(m);
  EXPECT_EQ(Find(e, "expandable_segments")->action,
            "Set PYTORCH_XPU_ALLOC_CONF=expandable_segments:True");
}

TEST(ExplainTest, ClassicFragmentationNotesTheVersion) {
  const OomExplanation e = ExplainOom(Classic(512 * MiB, 16 * GiB, 300 * MiB, 12 * GiB, 15 * GiB));
  EXPECT_EQ(e.verdict, OomVerdict::kFragmentation);
  EXPECT_NE(Find(e, "expandable_segments")->why.find("PyTorch 2.1 or newer"), std::string::npos);
  EXPECT_EQ(Find(e, "max_split_size_mb")->alloc_conf, "max_split_size_mb:256");
}

// The private pools' cache (CUDA graphs, MemPools) is printed inside "allocated" and outside
// "reserved but unallocated"; the regular allocator cannot use it, so it never turns a shortage
// into fragmentation, and the stranded figure is the message's own U.
TEST(ExplainTest, PrivatePoolsDoNotTurnAShortageIntoFragmentation) {
  // S = 1.5 GiB; F + U = 0.6 + 0.4 = 1 GiB: short, whatever the 1.2 GiB in private pools.
  OomMessage m = Newer(1536 * MiB, 40 * GiB, 612 * MiB, 37 * GiB, 410 * MiB);
  m.private_pools = 1228 * MiB;
  OomExplanation e = ExplainOom(m);
  EXPECT_EQ(e.verdict, OomVerdict::kShortage);
  EXPECT_EQ(e.stranded, 410 * MiB);
  EXPECT_EQ(Ids(e)[0], "private_pools");  // releasing them would cover the 514 MiB missing
  // Far more in private pools than the request, as in real CUDA-graph jobs: still a shortage.
  m = Newer(4 * GiB, 79 * GiB, 1147 * MiB, 74 * GiB + 512 * MiB, 2693 * MiB);
  m.private_pools = 20306 * MiB;
  e = ExplainOom(m);
  EXPECT_EQ(e.verdict, OomVerdict::kShortage);
  EXPECT_EQ(e.stranded, 2693 * MiB);
  // Within F + U it is fragmentation, with or without private pools.
  m = Newer(GiB, 40 * GiB, 612 * MiB, 37 * GiB, 600 * MiB);
  m.private_pools = 5 * GiB;
  e = ExplainOom(m);
  EXPECT_EQ(e.verdict, OomVerdict::kFragmentation);
  EXPECT_EQ(e.stranded, 600 * MiB);
  EXPECT_EQ(Find(e, "private_pools"), nullptr);
}

TEST(ExplainTest, MemoryFractionCapIsTheVerdictWhenReservedPlusRequestExceedsIt) {
  // Classic: 10.5 GiB reserved + 1 GiB > 11.1 GiB allowed, with 11.6 GiB free on the device.
  OomMessage m = Classic(GiB, 22 * GiB, 11 * GiB + 600 * MiB, 10 * GiB, 10 * GiB + 500 * MiB);
  m.allowed = 11 * GiB + 100 * MiB;
  OomExplanation e = ExplainOom(m);
  EXPECT_EQ(e.figures->headroom, 624 * MiB);
  EXPECT_EQ(e.verdict, OomVerdict::kCap);
  EXPECT_EQ(Ids(e)[0], "raise_memory_fraction");
  EXPECT_NE(e.summary.find("enough for the request"), std::string::npos) << e.summary;
  m.tried = 1536 * MiB;
  EXPECT_EQ(ExplainOom(m).verdict, OomVerdict::kCap);
  // 2.x wording, the device itself nearly full (other processes): the cap is still the bound,
  // not the 3.2 MiB free, and raising it alone is not enough.
  OomMessage n = Newer(20 * MiB, 79 * GiB + 154 * MiB, 3 * MiB + 205 * KiB, 1020 * MiB, 40 * MiB);
  n.allowed = GiB + 51 * MiB;
  n.this_process = 2 * GiB + 113 * MiB;
  n.processes.push_back({31544, 77 * GiB + 20 * MiB});
  e = ExplainOom(n);
  EXPECT_EQ(e.verdict, OomVerdict::kCap);
  EXPECT_EQ(e.stranded, 40 * MiB);
  EXPECT_EQ(Ids(e)[0], "raise_memory_fraction");
  EXPECT_NE(e.summary.find("raising the cap alone does not make room"), std::string::npos);
  EXPECT_NE(Find(e, "raise_memory_fraction")->action.find("torch.cuda."), std::string::npos);
  // A cap the request stays within is not the bound: the usual verdicts.
  n.allowed = 10 * GiB;
  EXPECT_EQ(ExplainOom(n).verdict, OomVerdict::kFragmentation);
  // XPU: the cap remedy names torch.xpu and no CUDA variable.
  n.allowed = GiB + 51 * MiB;
  n.backend = "XPU";
  e = ExplainOom(n);
  EXPECT_EQ(e.verdict, OomVerdict::kCap);
  EXPECT_NE(Find(e, "raise_memory_fraction")->action.find("torch.xpu."), std::string::npos);
  EXPECT_EQ(Find(e, "raise_memory_fraction")->action.find("PYTORCH_"), std::string::npos);
}

// Far more free on the device than the request, and PyTorch failed: a limit (a memory fraction
// set in code, which some 2.x wordings do not print), never "undetermined".
TEST(ExplainTest, FarMoreFreeThanTheRequestIsALimit) {
  OomExplanation e = ExplainOom(Newer(GiB, 16 * GiB, 2 * GiB, 10 * GiB, 0));
  EXPECT_EQ(e.verdict, OomVerdict::kCap);
  EXPECT_NE(e.summary.find("memory fraction set in code"), std::string::npos) << e.summary;
  EXPECT_EQ(Ids(e)[0], "raise_memory_fraction");
  e = ExplainOom(
      Newer(4 * GiB, 23 * GiB + 655 * MiB, 10107 * MiB, 11 * GiB + 819 * MiB, 1434 * MiB));
  EXPECT_EQ(e.verdict, OomVerdict::kCap);
  // The classic wording prints the fraction when it is set: a limit outside it.
  e = ExplainOom(Classic(GiB, 16 * GiB, 3 * GiB, 10 * GiB, 10 * GiB));
  EXPECT_EQ(e.verdict, OomVerdict::kCap);
  EXPECT_NE(e.summary.find("figures do not show"), std::string::npos) << e.summary;
  // Free about the request (within the printing's rounding and 2 MiB pages): undetermined.
  e = ExplainOom(Newer(GiB, 16 * GiB, GiB + 4 * MiB, 10 * GiB, 0));
  EXPECT_EQ(e.verdict, OomVerdict::kUndetermined);
}

TEST(ExplainTest, MissingFiguresAreNamed) {
  OomMessage m;
  m.backend = "CUDA";
  m.wording = OomWording::kCapacityOf;
  m.tried = 768 * MiB;
  m.total = 79 * GiB;
  EXPECT_EQ(MissingFigures(m),
            (std::vector<std::string>{"free", "allocated", "reserved but unallocated"}));
  const OomExplanation e = ExplainOom(m);
  EXPECT_EQ(e.verdict, OomVerdict::kUndetermined);
  EXPECT_FALSE(e.figures);
  EXPECT_NE(e.summary.find("'free', 'allocated', 'reserved but unallocated'"), std::string::npos);
  EXPECT_EQ(Ids(e)[0], "record_snapshot");
  OomMessage classic;
  classic.wording = OomWording::kClassic;
  EXPECT_EQ(MissingFigures(classic),
            (std::vector<std::string>{"Tried to allocate", "total capacity", "free", "allocated",
                                      "reserved"}));
}

TEST(ExplainTest, TriedNoteForSmallAndMidSizes) {
  auto notes_of = [](std::uint64_t tried) {
    std::string all;
    for (const std::string& n : ExplainOom(Newer(tried, GiB, 0, GiB / 2, GiB / 4)).notes) {
      all += n;
    }
    return all;
  };
  EXPECT_NE(notes_of(2 * MiB).find("at most 1 MiB"), std::string::npos);
  EXPECT_NE(notes_of(20 * MiB).find("between 1 MiB and 10 MiB"), std::string::npos);
  EXPECT_NE(notes_of(300 * MiB).find("not necessarily the tensor's size"), std::string::npos);
}

// The trace of tests/data/explain/fragmented_oom.jsonl (README there), built in memory.
// Replay options for a device of `capacity` bytes, on one thread.
VerifyOptions OnDevice(std::uint64_t capacity) {
  VerifyOptions options;
  options.capacity_bytes = capacity;
  options.threads = 1;
  return options;
}

std::vector<Event> FragmentedTrace() {
  std::vector<Event> events;
  auto alloc = [&](std::uint64_t id, std::uint64_t size) {
    Event e;
    e.action = Action::kAlloc;
    e.addr = id;
    e.size = size;
    events.push_back(e);
  };
  auto free = [&](std::uint64_t id) {
    Event e;
    e.action = Action::kFreeRequested;
    e.addr = id;
    events.push_back(e);
  };
  alloc(1, 120 * MiB);
  free(1);
  for (std::uint64_t i = 0; i < 3; ++i) {
    alloc(10 + i, 20 * MiB);
    alloc(20 + i, 20 * MiB);
  }
  for (std::uint64_t i = 0; i < 3; ++i) free(10 + i);
  alloc(30, 80 * MiB);
  return events;
}

TEST(VerifyRemediesTest, ReranksByTheReplay) {
  OomExplanation e = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 60 * MiB, 60 * MiB));
  ASSERT_EQ(e.verdict, OomVerdict::kFragmentation);
  VerifyOptions options = OnDevice(160 * MiB);
  Result<Verification> v = VerifyRemedies(FragmentedTrace(), options, &e);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_TRUE(v->reproduced);
  EXPECT_EQ(v->current.peak_reserved, 120 * MiB);
  ASSERT_TRUE(v->current.fragmentation_at_oom);
  EXPECT_DOUBLE_EQ(*v->current.fragmentation_at_oom, 0.5);
  EXPECT_EQ(Ids(e),
            (std::vector<std::string>{"expandable_segments", "max_split_size_mb", "fixed_shapes",
                                      "smaller_batch", "garbage_collection_threshold"}));
  EXPECT_FALSE(e.remedies[0].check->oom);
  EXPECT_EQ(e.remedies[0].check->peak_reserved, 140 * MiB);
  EXPECT_FALSE(e.remedies[1].check->oom);
  EXPECT_EQ(e.remedies[1].check->peak_reserved, 160 * MiB);
  EXPECT_FALSE(e.remedies[2].check);
  EXPECT_TRUE(e.remedies[4].check->oom);
}

// A remedy whose replay runs out of memory earlier than the job's own settings is marked worse
// and ranked below every other remedy, the untestable code changes included.
TEST(VerifyRemediesTest, ASettingThatFailsEarlierThanTodaysIsWorseAndLast) {
  // 200 MiB device: 100 + 100 MiB fit exactly (99 MiB rounds up to a 100 MiB segment), and the
  // 20 MiB after them does not. Under per_process_memory_fraction:0.99 (198 MiB) the second
  // request already fails.
  std::vector<Event> events;
  std::uint64_t id = 0;
  for (std::uint64_t size : {100 * MiB, 99 * MiB, 20 * MiB}) {
    Event e;
    e.action = Action::kAlloc;
    e.addr = ++id;
    e.size = size;
    events.push_back(e);
  }
  OomExplanation e = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 60 * MiB, 60 * MiB));
  ASSERT_NE(Find(e, "garbage_collection_threshold"), nullptr);
  VerifyOptions options = OnDevice(200 * MiB);
  Result<Verification> v = VerifyRemedies(events, options, &e);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_TRUE(v->current.oom);
  EXPECT_EQ(v->current.oom_event, 2u);
  const Remedy* gc = Find(e, "garbage_collection_threshold");
  ASSERT_TRUE(gc->check && gc->check->oom);
  EXPECT_EQ(gc->check->oom_event, 1u);
  EXPECT_TRUE(gc->check->worse);
  EXPECT_EQ(e.remedies.back().id, "garbage_collection_threshold");
  EXPECT_FALSE(Find(e, "expandable_segments")->check->worse);  // fails where today's does
  // When the job's own settings fit, any setting that runs out of memory is worse.
  OomExplanation fits = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 60 * MiB, 60 * MiB));
  events.pop_back();
  v = VerifyRemedies(events, options, &fits);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->current.oom);
  EXPECT_TRUE(Find(fits, "garbage_collection_threshold")->check->worse);
  EXPECT_EQ(fits.remedies.back().id, "garbage_collection_threshold");
}

// When expandable segments replay worse than the job's own settings, the remedy's why, which
// promises reuse of freed memory, says what works against it: only whole pages go back.
TEST(VerifyRemediesTest, ExpandableSegmentsWorseThanTodaysSayWhy) {
  // 60 MiB device, three 15 MiB tensors, the middle one freed, then 20 MiB. Defaults: three
  // 16 MiB segments; the retry cudaFrees the freed one and 20 MiB fits. Expandable: the freed
  // [15,30) MiB straddles the first two 20 MiB pages and holds neither, so nothing can be
  // unmapped, and the 15 MiB free tail would need a fourth page.
  const std::tuple<Action, std::uint64_t, std::uint64_t> steps[] = {
      {Action::kAlloc, 1, 15 * MiB},  {Action::kAlloc, 2, 15 * MiB}, {Action::kAlloc, 3, 15 * MiB},
      {Action::kFreeRequested, 2, 0}, {Action::kAlloc, 4, 20 * MiB},
  };
  std::vector<Event> events;
  for (const auto& [action, id, size] : steps) {
    events.emplace_back();
    events.back().action = action;
    events.back().addr = id;
    events.back().size = size;
  }
  OomExplanation e = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 60 * MiB, 60 * MiB));
  VerifyOptions options = OnDevice(60 * MiB);
  Result<Verification> v = VerifyRemedies(events, options, &e);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_FALSE(v->current.oom);
  const Remedy* expandable = Find(e, "expandable_segments");
  ASSERT_TRUE(expandable && expandable->check);
  EXPECT_TRUE(expandable->check->worse);
  EXPECT_NE(expandable->why.find("only in whole pages (20 MiB"), std::string::npos)
      << expandable->why;
  // A remedy that is not worse keeps its why as it was.
  OomExplanation frag = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 60 * MiB, 60 * MiB));
  options.capacity_bytes = 160 * MiB;
  ASSERT_TRUE(VerifyRemedies(FragmentedTrace(), options, &frag).ok());
  EXPECT_EQ(Find(frag, "expandable_segments")->why.find("whole pages"), std::string::npos);
}

// `explain --trace` and `tune` share one search: a setting of tune's grid that fits is offered
// when no proposed setting does.
TEST(VerifyRemediesTest, TheSearchsBestSettingJoinsWhenNoRemedyFits) {
  // A shortage verdict proposes no allocator setting (U < S/20), though the trace fits under
  // expandable segments.
  OomExplanation e = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 117 * MiB, 3 * MiB));
  ASSERT_EQ(e.verdict, OomVerdict::kShortage);
  for (const Remedy& r : e.remedies) ASSERT_TRUE(r.alloc_conf.empty()) << r.id;
  VerifyOptions options = OnDevice(160 * MiB);
  OomExplanation without = e;
  ASSERT_TRUE(VerifyRemedies(FragmentedTrace(), options, &without).ok());
  EXPECT_EQ(Find(without, "searched_setting"), nullptr);
  options.search = DefaultTuneGrid();
  Result<Verification> v = VerifyRemedies(FragmentedTrace(), options, &e);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_FALSE(e.remedies.empty());
  const Remedy& found = e.remedies.front();
  EXPECT_EQ(found.id, "searched_setting");
  ASSERT_TRUE(found.check);
  EXPECT_FALSE(found.check->oom);
  // The same setting and peak as tune ranks first on the same device.
  TuneOptions tune;
  tune.capacity_bytes = 160 * MiB;
  tune.threads = 1;
  Result<std::vector<TuneOutcome>> ranked = Tune(FragmentedTrace(), tune);
  ASSERT_TRUE(ranked.ok());
  EXPECT_EQ(found.alloc_conf, ranked->front().conf);
  EXPECT_EQ(found.check->peak_reserved, ranked->front().peak_reserved);
  EXPECT_NE(found.action.find("PYTORCH_CUDA_ALLOC_CONF=" + found.alloc_conf), std::string::npos);
  // A proposed setting that fits as low keeps the search's result out.
  OomExplanation frag = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 60 * MiB, 60 * MiB));
  ASSERT_TRUE(VerifyRemedies(FragmentedTrace(), options, &frag).ok());
  const Remedy* expandable = Find(frag, "expandable_segments");
  ASSERT_TRUE(expandable && expandable->check && !expandable->check->oom);
  if (expandable->check->peak_reserved <= ranked->front().peak_reserved) {
    EXPECT_EQ(Find(frag, "searched_setting"), nullptr);
  }
}

TEST(VerifyRemediesTest, BadCurrentSettingsAreAnError) {
  OomExplanation e = ExplainOom(Newer(80 * MiB, 160 * MiB, 40 * MiB, 60 * MiB, 60 * MiB));
  VerifyOptions options;
  options.capacity_bytes = 160 * MiB;
  options.current_conf = "no_such_option:1";
  EXPECT_FALSE(VerifyRemedies(FragmentedTrace(), options, &e).ok());
}

}  // namespace
}  // namespace fragscope::analysis
