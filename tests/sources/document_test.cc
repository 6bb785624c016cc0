#include "sources/document/document.h"

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::sources {
namespace {

std::vector<Value> ToVector(std::span<const Value> items) { return {items.begin(), items.end()}; }

TEST(DocumentTest, DefaultValueIsNone) {
  Document doc;
  Value none;
  EXPECT_EQ(none.kind(), ValueKind::kNone);
  EXPECT_TRUE(none.is_none());
  EXPECT_EQ(doc.AddNone(), none);
  EXPECT_EQ(doc.root(), none);
  EXPECT_FALSE(doc.AsInt(none));
  EXPECT_FALSE(doc.AsBool(none));
  EXPECT_FALSE(doc.Id(none));
  EXPECT_TRUE(doc.Items(none).empty());
  EXPECT_TRUE(doc.Entries(none).empty());
  EXPECT_EQ(ValueKindName(ValueKind::kNone), "None");
  EXPECT_EQ(ValueKindName(ValueKind::kDict), "dict");
}

TEST(DocumentTest, BoolsAreNotInts) {
  Document doc;
  Value t = doc.AddBool(true);
  Value f = doc.AddBool(false);
  EXPECT_EQ(t.kind(), ValueKind::kBool);
  EXPECT_EQ(doc.AsBool(t), true);
  EXPECT_EQ(doc.AsBool(f), false);
  EXPECT_FALSE(doc.AsInt(t));
  EXPECT_FALSE(f.is_none());
  EXPECT_EQ(doc.object_count(), 0u);
}

TEST(DocumentTest, IntsOfEveryWidth) {
  Document doc;
  const std::int64_t cases[] = {0,
                                1,
                                -1,
                                255,
                                1 << 30,
                                (std::int64_t{1} << 59) - 1,
                                -(std::int64_t{1} << 59),
                                std::int64_t{1} << 59,
                                -(std::int64_t{1} << 59) - 1,
                                std::numeric_limits<std::int64_t>::max(),
                                std::numeric_limits<std::int64_t>::min()};
  for (std::int64_t i : cases) {
    Value v = doc.AddInt(i);
    EXPECT_EQ(v.kind(), ValueKind::kInt) << i;
    EXPECT_EQ(doc.AsInt(v), i);
    EXPECT_EQ(doc.AsDouble(v), static_cast<double>(i));
    if (i >= 0) {
      EXPECT_EQ(doc.AsUint(v), static_cast<std::uint64_t>(i));
    } else {
      EXPECT_FALSE(doc.AsUint(v));
    }
  }
  // Only the ints outside the handle's 60 bits are stored.
  EXPECT_EQ(doc.object_count(), 4u);
  EXPECT_FALSE(doc.Id(doc.AddInt(5)));
  EXPECT_TRUE(doc.Id(doc.AddInt(std::numeric_limits<std::int64_t>::max())));
}

TEST(DocumentTest, LongBytesNormalise) {
  Document doc;
  EXPECT_EQ(doc.AsInt(doc.AddLongBytes("")), 0);
  EXPECT_EQ(doc.AsInt(doc.AddLongBytes(std::string("\xff", 1))), -1);
  EXPECT_EQ(doc.AsInt(doc.AddLongBytes(std::string("\xff\x00", 2))), 255);
  EXPECT_EQ(doc.AsInt(doc.AddLongBytes(std::string("\x00\x80", 2))), -32768);
  // Redundant sign bytes are dropped: this is 1.
  EXPECT_EQ(
      doc.AsInt(doc.AddLongBytes(std::string("\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00", 10))), 1);
  // 2^64 - 1: eight 0xff and a 0x00 sign byte.
  Value max = doc.AddLongBytes(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x00", 9));
  EXPECT_EQ(max.kind(), ValueKind::kBigInt);
  EXPECT_EQ(doc.AsUint(max), std::numeric_limits<std::uint64_t>::max());
  EXPECT_FALSE(doc.AsInt(max));
  EXPECT_DOUBLE_EQ(*doc.AsDouble(max), 18446744073709551615.0);
  EXPECT_EQ(doc.BigIntBytes(max)->size(), 9u);
  // 2^63 is a big int but still a uint64.
  Value two63 = doc.AddLongBytes(std::string("\x00\x00\x00\x00\x00\x00\x00\x80\x00", 9));
  EXPECT_EQ(doc.AsUint(two63), std::uint64_t{1} << 63);
  // 2^64 is not.
  Value two64 = doc.AddLongBytes(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9));
  EXPECT_FALSE(doc.AsUint(two64));
  EXPECT_DOUBLE_EQ(*doc.AsDouble(two64), 18446744073709551616.0);
  // -(2^64): negative big ints are neither uint64 nor int64.
  Value neg = doc.AddLongBytes(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\xff", 9));
  EXPECT_EQ(neg.kind(), ValueKind::kBigInt);
  EXPECT_FALSE(doc.AsUint(neg));
  EXPECT_FALSE(doc.AsInt(neg));
  EXPECT_DOUBLE_EQ(*doc.AsDouble(neg), -18446744073709551616.0);
  EXPECT_EQ(doc.AsInt(doc.AddLongBytes(std::string("\x00\x00\x00\x00\x00\x00\x00\x80", 8))),
            std::numeric_limits<std::int64_t>::min());
}

TEST(DocumentTest, StringsBytesFloats) {
  Document doc;
  Value s = doc.AddString("héllo");
  Value b = doc.AddBytes(std::string("\0\1", 2));
  Value f = doc.AddFloat(0.25);
  EXPECT_EQ(doc.AsString(s), "héllo");
  EXPECT_FALSE(doc.AsBytes(s));
  EXPECT_EQ(doc.AsBytes(b), std::string("\0\1", 2));
  EXPECT_FALSE(doc.AsString(b));
  EXPECT_EQ(doc.AsDouble(f), 0.25);
  EXPECT_FALSE(doc.AsInt(f));
  EXPECT_EQ(doc.object_count(), 3u);
  EXPECT_NE(*doc.Id(s), *doc.Id(b));
  EXPECT_EQ(doc.AsString(doc.AddString("")), "");
}

TEST(DocumentTest, DictKeepsOrderAndDuplicates) {
  Document doc;
  Value d = doc.AddDict();
  Value k = doc.AddString("size");
  doc.SetItem(d, k, doc.AddInt(1));
  doc.SetItem(d, doc.AddString("action"), doc.AddString("alloc"));
  doc.SetItem(d, doc.AddString("size"), doc.AddInt(2));
  doc.SetItem(d, doc.AddInt(7), doc.AddInt(3));  // a non-string key is kept
  ASSERT_EQ(doc.Entries(d).size(), 4u);
  EXPECT_EQ(doc.Entries(d)[0].first, k);
  EXPECT_EQ(doc.AsInt(*doc.Find(d, "size")), 2);  // the last one, as Python's dict holds
  EXPECT_EQ(doc.AsString(*doc.Find(d, "action")), "alloc");
  EXPECT_FALSE(doc.Find(d, "frames"));
  EXPECT_FALSE(doc.Find(k, "size"));
  EXPECT_TRUE(doc.Items(d).empty());
}

TEST(DocumentTest, SetItemsBatch) {
  Document doc;
  Value d = doc.AddDict();
  std::vector<Value> kv;
  for (int i = 0; i < 300; ++i) {
    kv.push_back(doc.AddString("k" + std::to_string(i)));
    kv.push_back(doc.AddInt(i));
  }
  doc.SetItems(d, kv);
  ASSERT_EQ(doc.Entries(d).size(), 300u);
  EXPECT_EQ(doc.AsInt(*doc.Find(d, "k299")), 299);
  EXPECT_EQ(doc.AsInt(doc.Entries(d)[123].second), 123);
}

TEST(DocumentTest, EqualRunsShareStorageButNotIdentity) {
  Document doc;
  std::vector<Value> frames = {doc.AddString("a"), doc.AddString("b"), doc.AddString("c")};
  Value l1 = doc.AddList();
  Value l2 = doc.AddList();
  doc.Append(l1, frames);
  doc.Append(l2, frames);
  Value t = doc.AddTuple(frames);
  EXPECT_NE(*doc.Id(l1), *doc.Id(l2));
  EXPECT_EQ(doc.Items(l1).data(), doc.Items(l2).data());
  EXPECT_EQ(doc.Items(l1).data(), doc.Items(t).data());
  EXPECT_EQ(t.kind(), ValueKind::kTuple);
  // Appending to one copy leaves the other alone.
  doc.Append(l2, doc.AddInt(9));
  doc.Append(l1, doc.AddInt(8));
  EXPECT_EQ(doc.Items(l1).size(), 4u);
  EXPECT_EQ(doc.AsInt(doc.Items(l1)[3]), 8);
  EXPECT_EQ(doc.AsInt(doc.Items(l2)[3]), 9);
  EXPECT_EQ(doc.Items(t).size(), 3u);
  EXPECT_EQ(ToVector(doc.Items(t)), frames);
}

TEST(DocumentTest, ContainerCanHoldItself) {
  Document doc;
  Value l = doc.AddList();
  doc.Append(l, l);
  Value d = doc.AddDict();
  doc.SetItem(d, doc.AddString("me"), d);
  EXPECT_EQ(doc.Items(l)[0], l);
  EXPECT_EQ(*doc.Find(d, "me"), d);
}

// Interleaved appends to many containers (the case where runs move), checked against a plain
// model after every step, and again after FinishBuilding.
TEST(DocumentTest, InterleavedAppendsMatchAModel) {
  std::mt19937 rng(42);
  Document doc;
  std::vector<Value> lists;
  std::vector<std::vector<Value>> model;
  std::vector<Value> dicts;
  std::vector<std::vector<Document::Entry>> dict_model;
  for (int step = 0; step < 20000; ++step) {
    int what = static_cast<int>(rng() % 10);
    if (what == 0 || lists.empty()) {
      lists.push_back(doc.AddList());
      model.emplace_back();
    } else if (what == 1 || dicts.empty()) {
      dicts.push_back(doc.AddDict());
      dict_model.emplace_back();
    } else if (what < 7) {
      std::size_t i = rng() % lists.size();
      std::vector<Value> batch;
      std::size_t n = rng() % 5;
      // Small values so that equal runs (shared storage) are common.
      for (std::size_t k = 0; k < n; ++k) batch.push_back(doc.AddInt(static_cast<int>(rng() % 3)));
      doc.Append(lists[i], batch);
      model[i].insert(model[i].end(), batch.begin(), batch.end());
    } else {
      std::size_t i = rng() % dicts.size();
      Value key = doc.AddInt(static_cast<int>(rng() % 100));
      Value value = lists[rng() % lists.size()];
      doc.SetItem(dicts[i], key, value);
      dict_model[i].emplace_back(key, value);
    }
    if (step % 997 == 0) {
      for (std::size_t i = 0; i < lists.size(); ++i) {
        ASSERT_EQ(ToVector(doc.Items(lists[i])), model[i]) << "step " << step << " list " << i;
      }
    }
  }
  auto check = [&] {
    for (std::size_t i = 0; i < lists.size(); ++i) {
      ASSERT_EQ(ToVector(doc.Items(lists[i])), model[i]) << "list " << i;
    }
    for (std::size_t i = 0; i < dicts.size(); ++i) {
      auto entries = doc.Entries(dicts[i]);
      ASSERT_EQ(std::vector<Document::Entry>(entries.begin(), entries.end()), dict_model[i]);
    }
  };
  check();
  doc.FinishBuilding();
  check();
  // Building may go on after FinishBuilding.
  doc.Append(lists[0], doc.AddInt(1));
  model[0].push_back(doc.AddInt(1));
  check();
}

// A device trace list gets 1,000 entries per batch with other lists filled in between: its run
// moves O(log n) times, so what is left behind stays below a few times its size.
TEST(DocumentTest, BatchedAppendsStayLinear) {
  Document doc;
  Value big = doc.AddList();
  std::vector<Value> batch(1000);
  constexpr int kBatches = 200;
  for (int b = 0; b < kBatches; ++b) {
    for (int i = 0; i < 1000; ++i) batch[i] = doc.AddInt(b * 1000 + i);
    Value other = doc.AddList();
    doc.Append(other, std::span<const Value>(batch.data(), 3));
    doc.Append(big, batch);
  }
  ASSERT_EQ(doc.Items(big).size(), 1000u * kBatches);
  EXPECT_EQ(doc.AsInt(doc.Items(big)[123456]), 123456);
  doc.FinishBuilding();
  // 200,000 handles are 1.6 MB; moves and spare capacity add at most ~3x that.
  EXPECT_LT(doc.heap_bytes(), 6'000'000u);
}

TEST(DocumentTest, SixEntryDictCostsAboutItsHandles) {
  Document doc;
  std::vector<Value> keys;
  for (const char* k : {"action", "addr", "size", "stream", "time_us", "frames"}) {
    keys.push_back(doc.AddString(k));
  }
  Value frames = doc.AddList();
  doc.FinishBuilding();
  const std::uint64_t before = doc.heap_bytes();
  constexpr int kDicts = 10000;
  for (int i = 0; i < kDicts; ++i) {
    Value d = doc.AddDict();
    std::vector<Value> kv = {keys[0], keys[1],         keys[1], doc.AddInt(i),
                             keys[2], doc.AddInt(512), keys[3], doc.AddInt(0),
                             keys[4], doc.AddInt(i),   keys[5], frames};
    doc.SetItems(d, kv);
  }
  doc.FinishBuilding();
  const double per_dict = static_cast<double>(doc.heap_bytes() - before) / kDicts;
  EXPECT_LE(per_dict, 6 * 16 + 16) << per_dict;
}

}  // namespace
}  // namespace fragscope::sources
