#include "sources/document/json_document.h"

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include "sources/trace/output_stream.h"
#include "testing/test_util.h"

namespace fragscope::sources {
namespace {

Document LoadOrDie(const std::string& text, const PickleLimits& limits = {}) {
  Result<Document> doc = ReadJsonDocumentBytes(text, limits);
  EXPECT_TRUE(doc.ok()) << doc.status().ToString();
  return doc.ok() ? std::move(*doc) : Document();
}

Status LoadError(const std::string& text, const PickleLimits& limits = {}) {
  Result<Document> doc = ReadJsonDocumentBytes(text, limits);
  EXPECT_FALSE(doc.ok());
  return doc.ok() ? Status::Ok() : doc.status();
}

TEST(JsonDocumentTest, ObjectsArraysAndScalars) {
  Document doc = LoadOrDie(R"({"segments": [{"address": 140000000000000, "state": "inactive",
      "pool": [0, 0], "ok": true, "x": null, "f": 0.5}], "b": false, "segments": []})");
  Value root = doc.root();
  ASSERT_EQ(root.kind(), ValueKind::kDict);
  ASSERT_EQ(doc.Entries(root).size(), 3u);  // duplicates kept, in file order
  EXPECT_EQ(*doc.AsString(doc.Entries(root)[0].first), "segments");
  EXPECT_TRUE(doc.Items(*doc.Find(root, "segments")).empty());  // the last one wins
  Value seg = doc.Items(doc.Entries(root)[0].second)[0];
  EXPECT_EQ(doc.AsUint(*doc.Find(seg, "address")), 140000000000000u);
  EXPECT_EQ(doc.AsString(*doc.Find(seg, "state")), "inactive");
  EXPECT_EQ(doc.Items(*doc.Find(seg, "pool")).size(), 2u);
  EXPECT_EQ(doc.AsBool(*doc.Find(seg, "ok")), true);
  EXPECT_TRUE(doc.Find(seg, "x")->is_none());
  EXPECT_EQ(doc.AsDouble(*doc.Find(seg, "f")), 0.5);
  EXPECT_EQ(doc.AsBool(*doc.Find(root, "b")), false);
  EXPECT_EQ(LoadOrDie("[]").root().kind(), ValueKind::kList);
  Document scalar = LoadOrDie("  -7 ");
  EXPECT_EQ(scalar.AsInt(scalar.root()), -7);
}

TEST(JsonDocumentTest, IntegersKeepAllTheirBits) {
  Document doc = LoadOrDie(
      "[9007199254740993, -9223372036854775808, 18446744073709551615, 18446744073709551616,"
      " -18446744073709551616, 1e3, 1.0, 123456789012345678901234567890]");
  auto items = doc.Items(doc.root());
  ASSERT_EQ(items.size(), 8u);
  EXPECT_EQ(doc.AsInt(items[0]), 9007199254740993);  // 2^53 + 1 survives
  EXPECT_EQ(doc.AsInt(items[1]), std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(doc.AsUint(items[2]), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(items[3].kind(), ValueKind::kBigInt);
  EXPECT_FALSE(doc.AsUint(items[3]));
  EXPECT_DOUBLE_EQ(*doc.AsDouble(items[3]), 18446744073709551616.0);
  EXPECT_EQ(items[4].kind(), ValueKind::kBigInt);
  EXPECT_DOUBLE_EQ(*doc.AsDouble(items[4]), -18446744073709551616.0);
  EXPECT_EQ(items[5].kind(), ValueKind::kFloat);
  EXPECT_EQ(doc.AsDouble(items[5]), 1000.0);
  EXPECT_EQ(items[6].kind(), ValueKind::kFloat);
  // Exact: 123456789012345678901234567890 = 0x18ee90ff6c373e0ee4e3f0ad2.
  EXPECT_EQ(doc.BigIntBytes(items[7]),
            std::string("\xd2\x0a\x3f\x4e\xee\xe0\x73\xc3\xf6\x0f\xe9\x8e\x01", 13));
}

TEST(JsonDocumentTest, StringsAreUnescapedAndKeysShared) {
  Document doc = LoadOrDie(R"([{"name": "a\"b\u00e9\n"}, {"name": "x"}])");
  auto items = doc.Items(doc.root());
  EXPECT_EQ(doc.AsString(*doc.Find(items[0], "name")), "a\"b\xc3\xa9\n");
  // Keys are interned: both objects refer to one "name".
  EXPECT_EQ(doc.Entries(items[0])[0].first, doc.Entries(items[1])[0].first);
}

TEST(JsonDocumentTest, ErrorsNameLineAndColumn) {
  Status s = LoadError("{\"a\": 1,\n  \"b\": tru}");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message().rfind("line 2, column ", 0), 0u) << s.message();
  s = LoadError("[1, 2");
  EXPECT_EQ(s.message().rfind("line 1, column ", 0), 0u) << s.message();
  s = LoadError("");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  s = LoadError("[1] [2]");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
}

TEST(JsonDocumentTest, Limits) {
  PickleLimits limits;
  limits.max_depth = 5;
  EXPECT_TRUE(ReadJsonDocumentBytes("[[[[[1]]]]]", limits).ok());
  Status s = LoadError("[[[[[[1]]]]]]", limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("max_depth"), std::string::npos) << s.message();
  EXPECT_EQ(s.message().rfind("line 1, column 6: ", 0), 0u) << s.message();
  // Deep input does not overflow any stack with the default limit either.
  s = LoadError(std::string(100000, '['));
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);

  limits = {};
  limits.max_string_bytes = 3;
  s = LoadError(R"(["abcd"])", limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  limits = {};
  limits.max_objects = 2;
  s = LoadError(R"(["a", "b", "c"])", limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  limits = {};
  limits.max_input_bytes = 4;
  s = LoadError("[1, 2]", limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("max_input_bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(ReadJsonDocumentBytes("[12]", limits).ok());
  // nlohmann refuses numbers beyond a double's range ("number overflow").
  s = LoadError(std::string("[") + std::string(5000, '9') + "]");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message().rfind("line 1, column ", 0), 0u) << s.message();
  EXPECT_LT(s.message().size(), 300u);
}

TEST(JsonDocumentTest, DetectsFormat) {
  EXPECT_EQ(DetectDocumentFormat(" \n{\"segments\": []}"), DocumentFormat::kJson);
  EXPECT_EQ(DetectDocumentFormat("\xEF\xBB\xBF[1]"), DocumentFormat::kJson);
  EXPECT_EQ(DetectDocumentFormat("\x80\x04\x95"), DocumentFormat::kPickle);
  // Protocol 0/1 pickles start with '(' , ']' or '}', never '{' or '['.
  EXPECT_EQ(DetectDocumentFormat("(dp0\n"), DocumentFormat::kPickle);
  EXPECT_EQ(DetectDocumentFormat("}q\x00"), DocumentFormat::kPickle);
  EXPECT_EQ(DetectDocumentFormat(""), DocumentFormat::kPickle);
}

TEST(JsonDocumentTest, ReadDocumentFileDetectsAndPrefixesErrors) {
  std::string dir = testing::MakeTempDir();
  auto write = [&](const std::string& name, const std::string& bytes) {
    std::ofstream(dir + "/" + name, std::ios::binary) << bytes;
    return dir + "/" + name;
  };
  const std::string pickle("\x80\x04K\x07.", 5);
  DocumentFormat format = DocumentFormat::kJson;
  Result<Document> doc = ReadDocumentFile(write("a.json", pickle), &format);  // names lie
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ(format, DocumentFormat::kPickle);
  EXPECT_EQ(doc->AsInt(doc->root()), 7);

  Result<std::string> gz = Compress(Compression::kGzip, "\n  {\"segments\": [1, 2]}");
  ASSERT_TRUE(gz.ok());
  doc = ReadDocumentFile(write("b.pickle", *gz), &format);
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ(format, DocumentFormat::kJson);
  EXPECT_EQ(doc->Items(*doc->Find(doc->root(), "segments")).size(), 2u);

  // A long JSON file: the peeked head and the rest of the stream join up.
  std::string big = "[";
  for (int i = 0; i < 200000; ++i) big += std::to_string(i) + ",";
  big += "0]";
  doc = ReadDocumentFile(write("big.json", big));
  ASSERT_TRUE(doc.ok()) << doc.status().ToString();
  EXPECT_EQ(doc->Items(doc->root()).size(), 200001u);
  EXPECT_EQ(doc->AsInt(doc->Items(doc->root())[123456]), 123456);

  std::string path = write("bad.pickle", std::string("\x80\x04\x63os\nsystem\n", 13));
  doc = ReadDocumentFile(path);
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().message().rfind(path + ": byte 2: opcode GLOBAL (0x63) refused", 0), 0u)
      << doc.status().message();
  path = write("bad.json", "{\n\"a\" 1}");
  doc = ReadDocumentFile(path);
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().message().rfind(path + ": line 2, column ", 0), 0u)
      << doc.status().message();
  doc = ReadDocumentFile(dir + "/missing.pickle");
  EXPECT_EQ(doc.status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace fragscope::sources
