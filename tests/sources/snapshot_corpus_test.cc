// Loads whole snapshot files with ReadDocumentFile and checks figures that Python's pickle
// gives for the same files: the number of segments, the sum of their total_size, the number of
// blocks and the number of trace entries per device.
//
// Two corpora:
//   * tests/data/snapshots/: our synthetic fixtures (tools/make_snapshot_fixtures.py);
//   * shared/snapshots/{real,synthetic}/: real snapshots found in public repositories. They may
//     not be copied into this repository (licences), so they are read in place, from the
//     directory FRAGSCOPE_SHARED_SNAPSHOTS names; the tests skip when it is absent.
//
// The expected figures were printed by this script (run with /usr/bin/python3 on the folder),
// which loads each file with pickle.loads (json.loads when it starts with '{' or '['):
//
//   for sub in ("real", "synthetic"):
//       for name in sorted(os.listdir(os.path.join(root, sub))):
//           data = open(os.path.join(root, sub, name), "rb").read()
//           snap = json.loads(data) if data.lstrip()[:1] in (b"{", b"[") else pickle.loads(data)
//           segs = snap if isinstance(snap, list) else snap["segments"]
//           traces = ([] if isinstance(snap, list)
//                     else [len(t) for t in snap.get("device_traces", [])])
//           print(name, len(data), len(segs), sum(s["total_size"] for s in segs),
//                 sum(len(s["blocks"]) for s in segs), traces)
//
// (for the fixtures the same, with gzip.decompress for the .gz one).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sources/document/json_document.h"
#include "testing/test_util.h"

namespace fragscope::sources {
namespace {

struct Expected {
  const char* file;
  std::uint64_t file_bytes;
  std::uint64_t segments;
  std::uint64_t total_size;
  std::uint64_t blocks;
  std::vector<std::uint64_t> trace_entries;  // per device
};

struct Figures {
  std::uint64_t segments = 0;
  std::uint64_t total_size = 0;
  std::uint64_t blocks = 0;
  std::vector<std::uint64_t> trace_entries;
};

Figures Measure(const Document& doc) {
  Figures f;
  Value root = doc.root();
  Value segments = root;
  if (root.kind() == ValueKind::kDict) {
    segments = doc.Find(root, "segments").value_or(Value());
    if (auto traces = doc.Find(root, "device_traces")) {
      for (Value t : doc.Items(*traces)) f.trace_entries.push_back(doc.Items(t).size());
    }
  }
  for (Value seg : doc.Items(segments)) {
    ++f.segments;
    f.total_size += doc.AsUint(doc.Find(seg, "total_size").value_or(Value())).value_or(0);
    f.blocks += doc.Items(doc.Find(seg, "blocks").value_or(Value())).size();
  }
  return f;
}

void CheckFile(const std::string& path, const Expected& e, double* ratio) {
  SCOPED_TRACE(path);
  ASSERT_EQ(std::filesystem::file_size(path), e.file_bytes) << "not the file the figures are for";
  Result<Document> doc = ReadDocumentFile(path);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  Figures f = Measure(*doc);
  EXPECT_EQ(f.segments, e.segments);
  EXPECT_EQ(f.total_size, e.total_size);
  EXPECT_EQ(f.blocks, e.blocks);
  EXPECT_EQ(f.trace_entries, e.trace_entries);
  *ratio = static_cast<double>(doc->heap_bytes()) / static_cast<double>(e.file_bytes);
}

// ---- Our fixtures ---------------------------------------------------------------------------

const Expected kFixtures[] = {
    {"empty.pickle", 128, 0, 0, 0, {0}},
    {"g0_history.pickle", 5719, 6, 88080384, 24, {88}},
    {"g1_blocks_with_address.pickle", 5109, 4, 46137344, 24, {87, 0, 0, 0}},
    {"g2_oom.pickle", 1740, 1, 52428800, 1, {18}},
    {"g2_protocol2.pickle", 6517, 5, 85983232, 22, {89}},
    {"g2_time_us.pickle", 6426, 7, 109051904, 25, {89}},
    {"g2_time_us.pickle.gz", 1896, 7, 109051904, 25, {89}},
    {"g3_settings_annotations.pickle", 7258, 9, 94371840, 29, {92}},
    {"g3_snapshot.json", 69026, 9, 113246208, 24, {93}},
    {"g4_compile_context.pickle", 6899, 4, 65011712, 21, {88}},
    {"g4_expandable.pickle", 6721, 4, 60817408, 14, {91}},
    {"g5_protocol5.pickle", 7077, 3, 44040192, 23, {85}},
    {"g5_three_devices_two_streams.pickle", 51462, 34, 505413632, 133, {175, 179, 177}},
    {"g5_user_metadata.pickle", 6931, 4, 46137344, 15, {89}},
    {"segments_list.pickle", 1649, 5, 67108864, 17, {}},
};

TEST(SnapshotCorpusTest, FixturesMatchPython) {
  for (const Expected& e : kFixtures) {
    double ratio = 0;
    CheckFile(testing::SourcePath(std::string("tests/data/snapshots/") + e.file), e, &ratio);
  }
}

TEST(SnapshotCorpusTest, BrokenFixturesFailCleanly) {
  auto error = [](const char* name) {
    std::string path = testing::SourcePath(std::string("tests/data/snapshots/") + name);
    Result<Document> doc = ReadDocumentFile(path);
    EXPECT_FALSE(doc.ok()) << name;
    return doc.ok() ? std::string() : doc.status().message().substr(path.size());
  };
  EXPECT_EQ(error("malicious.pickle").rfind(": byte 2: opcode GLOBAL (0x63) refused: ", 0), 0u)
      << error("malicious.pickle");
  EXPECT_EQ(error("truncated.pickle"),
            ": byte 3213: truncated: the input ends before the STOP opcode");
  EXPECT_NE(error("corrupted.pickle").find("unknown opcode 0xff"), std::string::npos)
      << error("corrupted.pickle");
}

// ---- Real snapshots (shared/, read in place) ----------------------------------------------

const Expected kShared[] = {
    {"real/albi2_dump_snapshot.pickle", 1244, 3, 85983232, 10, {0, 0}},
    {"real/angelolmn_my_snapshot.pickle", 465, 0, 0, 0, {0}},
    {"real/bcrafton_memory_snapshot.pickle", 1270510, 96, 4238344192, 550, {6486}},
    {"real/charran_dump_snapshot.pickle", 5299, 12, 109051904, 116, {0}},
    {"real/constructorsun_memory_snapshot.pickle",
     2626235,
     12,
     114628231168,
     790,
     {6445, 596, 882, 0}},
    {"real/cranberrii_memory_snapshot.pickle", 2591918, 215, 6471811072, 1079, {10307}},
    {"real/felix_dump_snapshot_f46f1f5.pickle", 9929, 12, 190840832, 259, {0}},
    {"real/hugepanda_my_snapshot_a617bea.pickle", 988048, 51, 20860370944, 452, {3797}},
    {"real/jaspersolt_snapshot.pickle", 984472, 10, 134217728, 54, {5803}},
    {"real/jogregoire_my_snapshot.pickle", 12567, 7, 33554432, 168, {1}},
    {"real/kkaitlyn_memory_2.7b_forward.pickle", 3152426, 961, 34898706432, 2077, {8694}},
    {"real/kkaitlyn_memory_ctx128_forward_mixed.pickle", 1350459, 688, 24245174272, 1758, {5992}},
    {"real/kkaitlyn_memory_ctx128_fullstep.pickle", 3222315, 1010, 61111009280, 1522, {19052}},
    {"real/kkaitlyn_memory_small_forward.pickle", 2509166, 30, 1107296256, 378, {8507}},
    {"real/kkaitlyn_memory_snapshot.pickle", 209401, 1457, 75902222336, 1912, {0}},
    {"real/lfielike_my_snapshot.pickle", 73126, 259, 17133731840, 868, {1}},
    {"real/magma27_memory_snapshot.pickle", 495064, 216, 14180941824, 455, {5163}},
    {"real/maphsge4_snapshot_04d383c.pickle", 2401885, 136, 18566086656, 204, {10327, 0, 0, 0}},
    {"real/maphsge4_snapshot_1f2f548.pickle", 1204114, 82, 2776629248, 415, {4496, 0, 0, 0}},
    {"real/maphsge4_snapshot_dec166a.pickle", 10273, 40, 5559549952, 213, {0, 0, 0, 0}},
    {"real/muduard_dump_snapshot_413b2eb.pickle", 495250, 673, 11274289152, 6644, {1, 1}},
    {"real/muduard_dump_snapshot_e600157.pickle", 114672, 368, 5475663872, 2530, {0, 0}},
    {"real/muduard_memory_snapshot.pkl", 129982, 255, 3649044480, 2140, {}},
    {"real/nesta_memory_snapshot.json", 620563, 120, 22571646976, 307, {1299}},
    {"real/nothanmin_memory_snapshot.pickle", 3747860, 999, 23842521088, 1987, {19464}},
    {"real/nothanmin_memory_snapshot_forward.pickle", 2354085, 1722, 47234154496, 4158, {8948}},
    {"real/silmont_mem_snapshot.pickle", 72171, 9, 3781165056, 20, {97}},
    {"real/silmont_memory_forward_bf16_128.pickle", 646368, 43, 861929472, 178, {2811}},
    {"real/silmont_memory_forward_fp32_128.pickle", 468434, 29, 610271232, 164, {2043}},
    {"real/sunny_dump_snapshot.pickle", 517, 0, 0, 0, {0, 0, 0, 0}},
    {"real/wedsonlin_medium_128_inference.pickle", 1203466, 98, 1763704832, 230, {3840}},
    {"real/wedsonlin_medium_128_training.pickle", 3145433, 377, 7235174400, 918, {19136}},
    {"real/yiyi_1.3b_snapshot_61261a2.pickle", 222732, 257, 7608467456, 948, {1}},
    {"real/yiyi_1.3b_snapshot_a21816f.pickle", 295505, 266, 6658457600, 791, {1}},
    {"real/yiyi_oom_snapshot.pickle", 110501, 176, 11844714496, 463, {1}},
    {"synthetic/mosaic_test_output.pickle", 115009, 5, 262144000, 17, {1040}},
};

TEST(SnapshotCorpusTest, SharedSnapshotsMatchPython) {
  const std::string root = FRAGSCOPE_SHARED_SNAPSHOTS;
  if (!std::filesystem::is_directory(root + "/real")) {
    GTEST_SKIP() << root << " is absent (shared/ lives beside the repository)";
  }
  // The brief's target is heap_bytes <= 0.7 x the file size. Not reachable in general under
  // the Document contract: every list item is an 8-byte handle and every dict entry 16 bytes,
  // while a pickle spends 2-5 bytes on a memo reference. What we reach (docs/benchmarks.md):
  // <= 1.3x on the files above 1 MB, and below 4x on the small ones, where per-object costs
  // dominate. These bounds keep it from creeping up.
  std::uint64_t total_file = 0;
  double total_heap = 0;
  std::printf("%-50s %10s %7s\n", "file", "bytes", "heap/file");
  for (const Expected& e : kShared) {
    double ratio = 0;
    CheckFile(root + "/" + e.file, e, &ratio);
    std::printf("%-50s %10llu %7.2f\n", e.file, static_cast<unsigned long long>(e.file_bytes),
                ratio);
    total_file += e.file_bytes;
    total_heap += ratio * static_cast<double>(e.file_bytes);
    EXPECT_LE(ratio, e.file_bytes > (std::uint64_t{1} << 20) ? 1.35 : 4.0) << e.file;
  }
  const double overall = total_heap / static_cast<double>(total_file);
  std::printf("all files: heap/file = %.2f\n", overall);
  EXPECT_LE(overall, 1.1);
}

}  // namespace
}  // namespace fragscope::sources
