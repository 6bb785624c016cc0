#include "sources/document/document_json.h"

#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace fragscope::sources {
namespace {

std::string Json(const Document& doc, DocumentJsonLimits limits = {}) {
  std::string out;
  Status st = WriteDocumentJson(
      doc,
      [&](std::string_view s) {
        out += s;
        return Status::Ok();
      },
      limits);
  EXPECT_TRUE(st.ok()) << st.message();
  return out;
}

TEST(DocumentJsonTest, WritesEveryKind) {
  Document d;
  Value root = d.AddDict();
  d.SetItem(root, d.AddString("s"), d.AddString("a\"b\\c\n\x01 é"));
  d.SetItem(root, d.AddString("i"), d.AddInt(-42));
  // 2^64 - 1 as LONG1 bytes (9 bytes: ff x 8, 00) is a big int.
  d.SetItem(root, d.AddString("u"),
            d.AddLongBytes(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x00", 9)));
  d.SetItem(root, d.AddString("neg"),
            d.AddLongBytes(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x80", 9)));
  d.SetItem(root, d.AddString("f"), d.AddFloat(0.5));
  d.SetItem(root, d.AddString("nan"), d.AddFloat(std::numeric_limits<double>::quiet_NaN()));
  d.SetItem(root, d.AddString("b"), d.AddBool(true));
  d.SetItem(root, d.AddString("n"), Value());
  d.SetItem(root, d.AddString("bytes"), d.AddBytes(std::string("\x00\xff", 2)));
  Value list = d.AddList();
  d.Append(list, d.AddInt(1));
  d.Append(list, d.AddTuple(std::vector<Value>{d.AddInt(2), d.AddInt(3)}));
  d.SetItem(root, d.AddString("l"), list);
  d.SetItem(root, d.AddInt(7), d.AddString("int key"));
  d.SetItem(root, d.AddString("bad utf8"), d.AddString("\xff"));
  d.set_root(root);
  EXPECT_EQ(Json(d),
            "{\"s\":\"a\\\"b\\\\c\\n\\u0001 é\",\"i\":-42,\"u\":18446744073709551615,"
            "\"neg\":-2361183241434822606848,\"f\":0.5,\"nan\":null,\"b\":true,\"n\":null,"
            "\"bytes\":{\"__bytes_hex__\":\"00ff\"},\"l\":[1,[2,3]],\"7\":\"int key\","
            "\"bad utf8\":\"\xef\xbf\xbd\"}\n");
}

TEST(DocumentJsonTest, ScalarRootAndEmptyContainers) {
  Document d;
  d.set_root(d.AddInt(5));
  EXPECT_EQ(Json(d), "5\n");
  Document e;
  Value l = e.AddList();
  e.Append(l, e.AddDict());
  e.set_root(l);
  EXPECT_EQ(Json(e), "[{}]\n");
}

TEST(DocumentJsonTest, ASelfReferenceHitsTheDepthLimit) {
  Document d;
  Value l = d.AddList();
  d.Append(l, l);
  d.set_root(l);
  std::string out;
  DocumentJsonLimits limits;
  limits.max_depth = 50;
  Status st = WriteDocumentJson(
      d,
      [&](std::string_view s) {
        out += s;
        return Status::Ok();
      },
      limits);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(st.message().find("max_depth"), std::string::npos);
}

TEST(DocumentJsonTest, SharingThatExplodesHitsTheOutputLimit) {
  // l0 = [l1, l1], l1 = [l2, l2], ...: 2^40 leaves from 41 lists.
  Document d;
  Value inner = d.AddString("x");
  for (int i = 0; i < 40; ++i) {
    Value l = d.AddList();
    d.Append(l, inner);
    d.Append(l, inner);
    inner = l;
  }
  d.set_root(inner);
  DocumentJsonLimits limits;
  limits.max_output_bytes = 8 << 20;
  std::uint64_t written = 0;
  Status st = WriteDocumentJson(
      d,
      [&](std::string_view s) {
        written += s.size();
        return Status::Ok();
      },
      limits);
  EXPECT_EQ(st.code(), StatusCode::kLimitExceeded);
  EXPECT_LE(written, 8u << 20);
}

}  // namespace
}  // namespace fragscope::sources
