// Tests of the safe pickle reader on hand-assembled pickles: every opcode we run, every opcode
// we refuse, memo sharing, malformed and truncated input, limits, and compressed input.
// Opcode bytes are from CPython's Lib/pickle.py; expected values are what pickle.loads gives.
#include "sources/pickle/pickle_reader.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sources/budget.h"
#include "sources/trace/input_stream.h"
#include "sources/trace/output_stream.h"

namespace fragscope::sources {
namespace {

// Builds pickle bytes: P().proto(4).op(']').done().
struct P {
  std::string b;
  P& op(char c) {
    b.push_back(c);
    return *this;
  }
  P& op(std::uint8_t c) {
    b.push_back(static_cast<char>(c));
    return *this;
  }
  P& raw(std::string_view s) {
    b.append(s);
    return *this;
  }
  P& le(std::uint64_t v, int n) {
    for (int i = 0; i < n; ++i) b.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  P& proto(int v) { return op(std::uint8_t{0x80}).le(static_cast<std::uint64_t>(v), 1); }
  P& binint1(int v) { return op('K').le(static_cast<std::uint64_t>(v), 1); }
  P& binint(std::int32_t v) { return op('J').le(static_cast<std::uint32_t>(v), 4); }
  P& sbu(std::string_view s) {  // SHORT_BINUNICODE
    return op(std::uint8_t{0x8c}).le(s.size(), 1).raw(s);
  }
  P& memoize() { return op(std::uint8_t{0x94}); }
  P& binget(int i) { return op('h').le(static_cast<std::uint64_t>(i), 1); }
  P& stop() { return op('.'); }
  std::string done() { return b; }
};

Document LoadOrDie(const std::string& bytes, const PickleLimits& limits = {}) {
  Result<Document> doc = ReadPickleBytes(bytes, limits);
  EXPECT_TRUE(doc.ok()) << doc.status().ToString();
  return doc.ok() ? std::move(*doc) : Document();
}

Status LoadError(const std::string& bytes, const PickleLimits& limits = {}) {
  Result<Document> doc = ReadPickleBytes(bytes, limits);
  EXPECT_FALSE(doc.ok());
  return doc.ok() ? Status::Ok() : doc.status();
}

// The root of a pickle holding one value after PROTO 2.
Value One(Document* doc, const std::string& value_ops) {
  *doc = LoadOrDie(P().proto(2).raw(value_ops).stop().done());
  return doc->root();
}

// ---- Scalars --------------------------------------------------------------------------------

TEST(PickleReaderTest, NoneAndBools) {
  Document doc;
  EXPECT_TRUE(One(&doc, "N").is_none());
  EXPECT_EQ(doc.AsBool(One(&doc, "\x88")), true);
  EXPECT_EQ(doc.AsBool(One(&doc, "\x89")), false);
  // Protocol 0 writes bools as INT 01 / 00.
  EXPECT_EQ(doc.AsBool(One(&doc, "I01\n")), true);
  EXPECT_EQ(doc.AsBool(One(&doc, "I00\n")), false);
}

TEST(PickleReaderTest, BinaryInts) {
  Document doc;
  EXPECT_EQ(doc.AsInt(One(&doc, P().binint1(255).done())), 255);
  EXPECT_EQ(doc.AsInt(One(&doc, P().op('M').le(0xfffe, 2).done())), 65534);
  EXPECT_EQ(doc.AsInt(One(&doc, P().binint(-5).done())), -5);  // BININT is signed
  EXPECT_EQ(doc.AsInt(One(&doc, P().binint(std::numeric_limits<std::int32_t>::min()).done())),
            std::numeric_limits<std::int32_t>::min());
}

TEST(PickleReaderTest, Long1OfEveryWidth) {
  Document doc;
  // LONG1 with 0 bytes is 0.
  EXPECT_EQ(doc.AsInt(One(&doc, std::string("\x8a\x00", 2))), 0);
  // A 6-byte address, as snapshots hold them: 0x7f12_3456_7800.
  EXPECT_EQ(doc.AsUint(One(&doc, P().op(std::uint8_t{0x8a}).le(6, 1).le(0x7f1234567800, 6).done())),
            0x7f1234567800u);
  // -2^40 in 6 bytes.
  EXPECT_EQ(doc.AsInt(One(&doc, P().op(std::uint8_t{0x8a}).le(6, 1).le(0xff0000000000, 6).done())),
            -(std::int64_t{1} << 40));
  // 2^64 - 1 in 9 bytes (the MemoryViz.js "bigger than 8 bytes" case).
  Value max =
      One(&doc, P().op(std::uint8_t{0x8a}).le(9, 1).le(~std::uint64_t{0}, 8).le(0, 1).done());
  EXPECT_EQ(doc.AsUint(max), std::numeric_limits<std::uint64_t>::max());
  EXPECT_EQ(max.kind(), ValueKind::kBigInt);
  // int64 min in 8 bytes.
  EXPECT_EQ(doc.AsInt(One(
                &doc, P().op(std::uint8_t{0x8a}).le(8, 1).le(std::uint64_t{1} << 63, 8).done())),
            std::numeric_limits<std::int64_t>::min());
}

TEST(PickleReaderTest, Long4) {
  Document doc;
  // 2^80 in 11 bytes.
  std::string bytes(11, '\0');
  bytes[10] = 1;
  Value v = One(&doc, P().op(std::uint8_t{0x8b}).le(11, 4).raw(bytes).done());
  EXPECT_EQ(v.kind(), ValueKind::kBigInt);
  EXPECT_EQ(doc.BigIntBytes(v), bytes);
  EXPECT_DOUBLE_EQ(*doc.AsDouble(v), 1208925819614629174706176.0);
  EXPECT_EQ(doc.AsInt(One(&doc, P().op(std::uint8_t{0x8b}).le(1, 4).le(0xfe, 1).done())), -2);
  Status s = LoadError(P().proto(2).op(std::uint8_t{0x8b}).le(0xffffffff, 4).stop().done());
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("negative byte count"), std::string::npos) << s.message();
}

TEST(PickleReaderTest, TextInts) {
  Document doc;
  EXPECT_EQ(doc.AsInt(One(&doc, "I-42\n")), -42);
  EXPECT_EQ(doc.AsInt(One(&doc, "I0\n")), 0);
  EXPECT_EQ(doc.AsInt(One(&doc, "I 1_000 \n")), 1000);
  EXPECT_EQ(doc.AsInt(One(&doc, "I0x1F\n")), 31);
  EXPECT_EQ(doc.AsInt(One(&doc, "L123L\n")), 123);
  EXPECT_EQ(doc.AsInt(One(&doc, "L-9223372036854775808L\n")),
            std::numeric_limits<std::int64_t>::min());
  EXPECT_EQ(doc.AsUint(One(&doc, "L18446744073709551615L\n")),
            std::numeric_limits<std::uint64_t>::max());
  Value big = One(&doc, "L-340282366920938463463374607431768211456L\n");  // -2^128
  EXPECT_EQ(big.kind(), ValueKind::kBigInt);
  EXPECT_DOUBLE_EQ(*doc.AsDouble(big), -340282366920938463463374607431768211456.0);
  for (const char* bad : {"I012\n", "I\n", "Iabc\n", "I1__0\n", "I_1\n", "I1_\n"}) {
    Status s = LoadError(P().proto(0).raw(bad).stop().done());
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << bad;
  }
  // CPython refuses decimal literals over 4,300 digits; so do we (the conversion is quadratic).
  Status s = LoadError("I" + std::string(5000, '7') + "\n.");
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded) << s.ToString();
}

TEST(PickleReaderTest, Floats) {
  Document doc;
  // BINFLOAT is big-endian: 1.5 = 3ff8000000000000.
  EXPECT_EQ(doc.AsDouble(One(&doc, std::string("G\x3f\xf8\0\0\0\0\0\0", 9))), 1.5);
  EXPECT_EQ(doc.AsDouble(One(&doc, std::string("G\xc0\x00\0\0\0\0\0\0", 9))), -2.0);
  EXPECT_EQ(doc.AsDouble(One(&doc, "F0.25\n")), 0.25);
  EXPECT_EQ(doc.AsDouble(One(&doc, "F-1e+100\n")), -1e100);
  EXPECT_TRUE(std::isinf(*doc.AsDouble(One(&doc, "Finf\n"))));
  EXPECT_TRUE(std::isnan(*doc.AsDouble(One(&doc, "Fnan\n"))));
  EXPECT_EQ(LoadError(P().proto(0).raw("F1.5x\n").stop().done()).code(), StatusCode::kCorruption);
}

// ---- Strings and bytes ----------------------------------------------------------------------

TEST(PickleReaderTest, BinaryStrings) {
  Document doc;
  EXPECT_EQ(doc.AsString(One(&doc, P().sbu("action").done())), "action");
  EXPECT_EQ(doc.AsString(One(&doc, P().op('X').le(4, 4).raw("h\xc3\xa9!").done())), "h\xc3\xa9!");
  EXPECT_EQ(doc.AsString(One(&doc, P().op(std::uint8_t{0x8d}).le(3, 8).raw("abc").done())), "abc");
  // Python 2 str opcodes are read as str.
  EXPECT_EQ(doc.AsString(One(&doc, P().op('U').le(2, 1).raw("py").done())), "py");
  EXPECT_EQ(doc.AsString(One(&doc, P().op('T').le(3, 4).raw("two").done())), "two");
  EXPECT_EQ(doc.AsString(One(&doc, P().sbu("").done())), "");
}

TEST(PickleReaderTest, Bytes) {
  Document doc;
  EXPECT_EQ(doc.AsBytes(One(&doc, P().op('C').le(2, 1).raw(std::string("\0\xff", 2)).done())),
            std::string("\0\xff", 2));
  EXPECT_EQ(doc.AsBytes(One(&doc, P().op('B').le(3, 4).raw("abc").done())), "abc");
  EXPECT_EQ(doc.AsBytes(One(&doc, P().op(std::uint8_t{0x8e}).le(1, 8).raw("z").done())), "z");
  // bytearray is read as bytes.
  EXPECT_EQ(doc.AsBytes(One(&doc, P().op(std::uint8_t{0x96}).le(2, 8).raw("ba").done())), "ba");
}

TEST(PickleReaderTest, TextStrings) {
  Document doc;
  EXPECT_EQ(doc.AsString(One(&doc, "S'it\\'s'\n")), "it's");
  EXPECT_EQ(doc.AsString(One(&doc, "S\"a\\nb\\x41\\101\\\\\"\n")), "a\nbAA\\");
  EXPECT_EQ(doc.AsString(One(&doc, "S'\\q'\n")), "\\q");  // unknown escapes stay
  EXPECT_EQ(LoadError(P().proto(0).raw("Sabc\n").stop().done()).code(), StatusCode::kCorruption);
  EXPECT_EQ(LoadError(P().proto(0).raw("S'a\\x4'\n").stop().done()).code(),
            StatusCode::kCorruption);
  // UNICODE: raw-unicode-escape. Latin-1 bytes become UTF-8; \u and \U escapes decode.
  EXPECT_EQ(doc.AsString(One(&doc, "Vcaf\xe9 \\u00e9\\U0001F600 \\\\u0041\n")),
            "caf\xc3\xa9 \xc3\xa9\xf0\x9f\x98\x80 \\\\u0041");
  EXPECT_EQ(doc.AsString(One(&doc, "Va\\b\n")), "a\\b");
  EXPECT_EQ(LoadError(P().proto(0).raw("V\\u12\n").stop().done()).code(), StatusCode::kCorruption);
  EXPECT_EQ(LoadError(P().proto(0).raw("V\\U00110000\n").stop().done()).code(),
            StatusCode::kCorruption);
}

// ---- Containers -----------------------------------------------------------------------------

TEST(PickleReaderTest, ListsAppendAndAppends) {
  Document doc;
  Value v = One(&doc, P().op(']').binint1(1).op('a').op('(').binint1(2).binint1(3).op('e').done());
  ASSERT_EQ(doc.Items(v).size(), 3u);
  EXPECT_EQ(doc.AsInt(doc.Items(v)[2]), 3);
  v = One(&doc, P().op('(').binint1(4).op('N').op('l').done());
  EXPECT_EQ(v.kind(), ValueKind::kList);
  ASSERT_EQ(doc.Items(v).size(), 2u);
  EXPECT_TRUE(doc.Items(v)[1].is_none());
  // An empty APPENDS batch is fine.
  v = One(&doc, P().op(']').op('(').op('e').done());
  EXPECT_TRUE(doc.Items(v).empty());
}

TEST(PickleReaderTest, Tuples) {
  Document doc;
  Value v = One(&doc, ")");
  EXPECT_EQ(v.kind(), ValueKind::kTuple);
  EXPECT_TRUE(doc.Items(v).empty());
  v = One(&doc, P().binint1(1).op(std::uint8_t{0x85}).done());
  EXPECT_EQ(doc.Items(v).size(), 1u);
  v = One(&doc, P().binint1(0).binint1(0).op(std::uint8_t{0x86}).done());  // segment_pool_id
  ASSERT_EQ(doc.Items(v).size(), 2u);
  EXPECT_EQ(doc.AsInt(doc.Items(v)[1]), 0);
  v = One(&doc, P().binint1(1).binint1(2).binint1(3).op(std::uint8_t{0x87}).done());
  EXPECT_EQ(doc.AsInt(doc.Items(v)[2]), 3);
  v = One(&doc, P().op('(').binint1(1).binint1(2).binint1(3).binint1(4).op('t').done());
  EXPECT_EQ(doc.Items(v).size(), 4u);
}

TEST(PickleReaderTest, Dicts) {
  Document doc;
  Value v = One(&doc, P().op('}')
                          .sbu("a")
                          .binint1(1)
                          .op('s')
                          .op('(')
                          .sbu("b")
                          .binint1(2)
                          .sbu("a")
                          .binint1(3)
                          .op('u')
                          .done());
  ASSERT_EQ(doc.Entries(v).size(), 3u);
  EXPECT_EQ(doc.AsInt(*doc.Find(v, "a")), 3);
  EXPECT_EQ(doc.AsInt(*doc.Find(v, "b")), 2);
  v = One(&doc, P().op('(').sbu("k").op('N').op('d').done());
  ASSERT_EQ(doc.Entries(v).size(), 1u);
  EXPECT_TRUE(doc.Find(v, "k")->is_none());
  // Non-string and unhashable keys are kept as they are.
  v = One(&doc, P().op('}').op(']').binint1(1).op('s').done());
  EXPECT_EQ(doc.Entries(v)[0].first.kind(), ValueKind::kList);
}

TEST(PickleReaderTest, SetsAreReadAsListsAndTuples) {
  Document doc;
  Value v = One(
      &doc, P().op(std::uint8_t{0x8f}).op('(').binint1(1).binint1(2).op(std::uint8_t{0x90}).done());
  EXPECT_EQ(v.kind(), ValueKind::kList);
  EXPECT_EQ(doc.Items(v).size(), 2u);
  v = One(&doc, P().op('(').binint1(1).op(std::uint8_t{0x91}).done());
  EXPECT_EQ(v.kind(), ValueKind::kTuple);
  EXPECT_EQ(doc.Items(v).size(), 1u);
}

TEST(PickleReaderTest, StackOpcodes) {
  Document doc;
  // POP drops the 2; DUP copies the 1; POP_MARK drops everything above the MARK.
  Value v = One(&doc, P().op('(')
                          .binint1(9)
                          .op('(')
                          .binint1(7)
                          .binint1(8)
                          .op('1')
                          .binint1(1)
                          .op('2')
                          .binint1(2)
                          .op('0')
                          .op('t')
                          .done());
  ASSERT_EQ(doc.Items(v).size(), 3u);
  EXPECT_EQ(doc.AsInt(doc.Items(v)[0]), 9);
  EXPECT_EQ(doc.AsInt(doc.Items(v)[1]), 1);
  EXPECT_EQ(doc.AsInt(doc.Items(v)[2]), 1);
  // As CPython: POP with nothing above the last MARK discards the MARK.
  v = One(&doc, P().binint1(5).op('(').op('0').done());
  EXPECT_EQ(doc.AsInt(v), 5);
}

TEST(PickleReaderTest, FrameAndTrailingBytesAreIgnored) {
  std::string body = P().sbu("x").memoize().stop().done();
  Document doc = LoadOrDie(P().proto(4)
                               .op(std::uint8_t{0x95})
                               .le(body.size(), 8)
                               .raw(body)
                               .raw("trailing garbage")
                               .done());
  EXPECT_EQ(doc.AsString(doc.root()), "x");
}

// ---- Memo -----------------------------------------------------------------------------------

TEST(PickleReaderTest, MemoSharesIdentity) {
  // [s, s, s] where s is memoised by every memo opcode family.
  for (const std::string& put_get :
       {std::string("p0\ng0\n"), std::string("q\x00h\x00", 4),
        P().op('r').le(0, 4).op('j').le(0, 4).done(), P().memoize().binget(0).done()}) {
    std::string put = put_get.substr(0, put_get.size() / 2);
    std::string get = put_get.substr(put_get.size() / 2);
    Document doc = LoadOrDie(
        P().proto(2).op('(').sbu("frame").raw(put).raw(get).raw(get).op('l').stop().done());
    auto items = doc.Items(doc.root());
    ASSERT_EQ(items.size(), 3u);
    EXPECT_EQ(items[0], items[2]);
    EXPECT_EQ(*doc.Id(items[0]), *doc.Id(items[1]));
    EXPECT_EQ(doc.object_count(), 2u);  // the string and the list
  }
}

TEST(PickleReaderTest, ListReferencedAThousandTimesIsStoredOnce) {
  P p;
  p.proto(4).op(']').memoize().op('(').op(']').memoize();  // memo 1: the shared frame list
  p.op('(').sbu("f").memoize().binint1(1).op('e');         // holds one string
  for (int i = 0; i < 999; ++i) p.binget(1);
  p.op('e').stop();
  Document doc = LoadOrDie(p.done());
  auto items = doc.Items(doc.root());
  ASSERT_EQ(items.size(), 1000u);
  for (Value v : items) EXPECT_EQ(v, items[0]);
  EXPECT_EQ(doc.object_count(), 3u);  // outer list, shared list, string
}

TEST(PickleReaderTest, SelfReferencingListLoads) {
  Document doc = LoadOrDie(P().proto(4).op(']').memoize().binget(0).op('a').stop().done());
  Value root = doc.root();
  ASSERT_EQ(doc.Items(root).size(), 1u);
  EXPECT_EQ(doc.Items(root)[0], root);
  doc = LoadOrDie(P().proto(2).op('}').op('q').le(0, 1).sbu("me").binget(0).op('s').stop().done());
  EXPECT_EQ(*doc.Find(doc.root(), "me"), doc.root());
}

TEST(PickleReaderTest, SparseMemoKeys) {
  // A huge LONG_BINPUT key must not size a table.
  Document doc = LoadOrDie(P().proto(2)
                               .binint1(7)
                               .op('r')
                               .le(0xfffffff0, 4)
                               .op('0')
                               .op('j')
                               .le(0xfffffff0, 4)
                               .stop()
                               .done());
  EXPECT_EQ(doc.AsInt(doc.root()), 7);
  // MEMOIZE uses len(memo), as CPython.
  doc = LoadOrDie(P().proto(4)
                      .binint1(1)
                      .op('q')
                      .le(5, 1)
                      .binint1(2)
                      .memoize()
                      .op('0')
                      .op('0')
                      .binget(1)
                      .stop()
                      .done());
  EXPECT_EQ(doc.AsInt(doc.root()), 2);
}

// ---- Whole pickles of each protocol (bytes as CPython 3.11 writes them) -------------------

// pickle.dumps({'a': [1, True, None], 'b': 'x'}, protocol=0)
const char kProto0[] = "(dp0\nVa\np1\n(lp2\nI1\naI01\naNasVb\np3\nVx\np4\ns.";
// protocol=2
const char kProto2[] =
    "\x80\x02}q\x00(X\x01\x00\x00\x00"
    "aq\x01]q\x02(K\x01\x88NeX\x01\x00\x00\x00"
    "bq\x03X\x01\x00\x00\x00xq\x04u.";
// protocol=4
const char kProto4[] =
    "\x80\x04\x95\x19\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01"
    "a\x94]\x94(K\x01\x88Ne\x8c\x01"
    "b\x94\x8c\x01x\x94u.";
// protocol=5 (the same opcodes as 4 here)
const char kProto5[] =
    "\x80\x05\x95\x19\x00\x00\x00\x00\x00\x00\x00}\x94(\x8c\x01"
    "a\x94]\x94(K\x01\x88Ne\x8c\x01"
    "b\x94\x8c\x01x\x94u.";

void CheckSample(const Document& doc) {
  Value root = doc.root();
  ASSERT_EQ(root.kind(), ValueKind::kDict);
  ASSERT_EQ(doc.Entries(root).size(), 2u);
  auto a = doc.Items(*doc.Find(root, "a"));
  ASSERT_EQ(a.size(), 3u);
  EXPECT_EQ(doc.AsInt(a[0]), 1);
  EXPECT_EQ(doc.AsBool(a[1]), true);
  EXPECT_TRUE(a[2].is_none());
  EXPECT_EQ(doc.AsString(*doc.Find(root, "b")), "x");
}

std::string Sample(const char* bytes, std::size_t size) { return std::string(bytes, size - 1); }

TEST(PickleReaderTest, EveryProtocol) {
  CheckSample(LoadOrDie(Sample(kProto0, sizeof(kProto0))));
  CheckSample(LoadOrDie(Sample(kProto2, sizeof(kProto2))));
  CheckSample(LoadOrDie(Sample(kProto4, sizeof(kProto4))));
  CheckSample(LoadOrDie(Sample(kProto5, sizeof(kProto5))));
  Status s = LoadError(P().proto(6).op('N').stop().done());
  EXPECT_NE(s.message().find("unsupported pickle protocol 6"), std::string::npos) << s.message();
}

TEST(PickleReaderTest, EveryPrefixIsACleanError) {
  for (const std::string& full :
       {Sample(kProto0, sizeof(kProto0)), Sample(kProto2, sizeof(kProto2)),
        Sample(kProto4, sizeof(kProto4))}) {
    for (std::size_t n = 0; n < full.size(); ++n) {
      Result<Document> doc = ReadPickleBytes(full.substr(0, n));
      ASSERT_FALSE(doc.ok()) << n;
      EXPECT_EQ(doc.status().code(), StatusCode::kCorruption) << n;
      EXPECT_EQ(doc.status().message().rfind("byte ", 0), 0u) << doc.status().message();
    }
  }
}

TEST(PickleReaderTest, CompressedPicklesRead) {
  for (Compression c : {Compression::kGzip, Compression::kZstd}) {
    Result<std::string> packed = Compress(c, Sample(kProto4, sizeof(kProto4)));
    ASSERT_TRUE(packed.ok());
    CheckSample(LoadOrDie(*packed));
    auto input = InputStream::Open(MemorySource(*packed));
    ASSERT_TRUE(input.ok());
    Result<Document> doc = ReadPickle(**input);
    ASSERT_TRUE(doc.ok()) << doc.status().ToString();
    CheckSample(*doc);
    // A truncated compressed pickle fails cleanly.
    EXPECT_FALSE(ReadPickleBytes(packed->substr(0, packed->size() / 2)).ok());
  }
}

// ---- Refused and unknown opcodes ------------------------------------------------------------

TEST(PickleReaderTest, CodeOpcodesAreRefusedByNameAndOffset) {
  const std::pair<std::uint8_t, const char*> refused[] = {
      {'c', "GLOBAL"}, {0x93, "STACK_GLOBAL"}, {'R', "REDUCE"},          {'b', "BUILD"},
      {'i', "INST"},   {'o', "OBJ"},           {0x81, "NEWOBJ"},         {0x92, "NEWOBJ_EX"},
      {'P', "PERSID"}, {'Q', "BINPERSID"},     {0x82, "EXT1"},           {0x83, "EXT2"},
      {0x84, "EXT4"},  {0x97, "NEXT_BUFFER"},  {0x98, "READONLY_BUFFER"}};
  for (const auto& [op, name] : refused) {
    EXPECT_EQ(PickleOpcodeName(op), name);
    // PROTO 4, a string, then the opcode at byte 5.
    Status s = LoadError(P().proto(4).sbu("x").op(op).raw("os\nsystem\n").stop().done());
    EXPECT_EQ(s.code(), StatusCode::kCorruption);
    char hex[8];
    std::snprintf(hex, sizeof(hex), "0x%02x", op);
    EXPECT_EQ(
        s.message().rfind(std::string("byte 5: opcode ") + name + " (" + hex + ") refused: ", 0),
        0u)
        << s.message();
    EXPECT_NE(s.message().find("a memory snapshot holds only plain data"), std::string::npos);
  }
  Status s = LoadError(P().proto(2).op('c').raw("os\nsystem\n").stop().done());
  EXPECT_NE(s.message().find("GLOBAL (0x63) refused: it would import Python code"),
            std::string::npos)
      << s.message();
}

TEST(PickleReaderTest, UnknownOpcodes) {
  for (int op = 0; op < 256; ++op) {
    if (PickleOpcodeName(static_cast<std::uint8_t>(op)) != "unknown") continue;
    Status s = LoadError(P().proto(4).op(static_cast<std::uint8_t>(op)).stop().done());
    EXPECT_EQ(s.code(), StatusCode::kCorruption);
    EXPECT_EQ(s.message().rfind("byte 2: unknown opcode 0x", 0), 0u) << s.message();
  }
  EXPECT_EQ(PickleOpcodeName(0x95), "FRAME");
  EXPECT_EQ(PickleOpcodeName(0xff), "unknown");
}

// ---- Malformed input ------------------------------------------------------------------------

TEST(PickleReaderTest, MalformedInputNamesOffset) {
  struct Case {
    std::string bytes;
    const char* expect;
  };
  const Case cases[] = {
      {P().proto(2).op('a').stop().done(), "byte 2: opcode APPEND: stack underflow"},
      {P().proto(2).op('e').stop().done(), "byte 2: opcode APPENDS: no MARK to pop"},
      {P().proto(2).binint1(1).op('(').op('e').stop().done(),
       "expected a list to add to, found int"},
      {P().proto(2).binget(3).stop().done(), "byte 2: opcode BINGET: memo key 3 was never stored"},
      {P().proto(2).op('}').op('(').binint1(1).op('u').stop().done(), "odd number of values"},
      {P().proto(2).op('(').binint1(1).op('d').stop().done(), "odd number of values"},
      {P().proto(2).op('.').done(), "byte 2: opcode STOP: stack underflow"},
      {P().proto(2).op('(').op('.').done(), "stack underflow (above the last MARK)"},
      {P().proto(2).op('q').le(0, 1).stop().done(), "opcode BINPUT: stack underflow"},
      {P().proto(2).binint1(1).op(std::uint8_t{0x86}).stop().done(),
       "opcode TUPLE2: stack underflow"},
      {P().proto(0).raw("p-1\n").stop().done(), "negative memo key"},
      {P().proto(2).op('1').stop().done(), "opcode POP_MARK: no MARK to pop"},
      {P().proto(2).op('0').stop().done(), "opcode POP: no MARK to pop"},
      {P().proto(2).binint1(1).done(), "byte 4: truncated: the input ends before the STOP opcode"},
      {P().proto(2).op('J').le(1, 2).done(),
       "byte 2: truncated: the input ends inside the argument of BININT"},
  };
  for (const Case& c : cases) {
    Status s = LoadError(c.bytes);
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << c.expect;
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.message();
    EXPECT_EQ(s.message().rfind("byte ", 0), 0u) << s.message();
  }
  EXPECT_EQ(LoadError("").message(), "byte 0: truncated: the input ends before the STOP opcode");
}

TEST(PickleReaderTest, HugeLengthsOnShortInputFailWithoutAllocating) {
  PickleLimits limits;
  limits.max_string_bytes = std::uint64_t{1} << 62;  // let the length through to the reading
  for (std::uint8_t op : {std::uint8_t{0x8d}, std::uint8_t{0x8e}, std::uint8_t{0x96}}) {
    std::string bytes = P().proto(4).op(op).le(std::uint64_t{1} << 61, 8).raw("abc").done();
    Status s = LoadError(bytes, limits);
    EXPECT_EQ(s.code(), StatusCode::kLimitExceeded) << s.message();  // beyond 4 GiB per object
    bytes = P().proto(4).op(op).le((std::uint64_t{4} << 30) - 1, 8).raw("abc").done();
    // Just under 4 GiB is a legal size; the input simply ends. In memory and streamed.
    s = LoadError(bytes, limits);
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << s.message();
    EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
    auto input = InputStream::Open(MemorySource(bytes));
    ASSERT_TRUE(input.ok());
    Result<Document> doc = ReadPickle(**input, limits);
    ASSERT_FALSE(doc.ok());
    EXPECT_NE(doc.status().message().find("truncated"), std::string::npos);
  }
  Status s = LoadError(P().proto(4).op('X').le(0xffffffff, 4).raw("ab").done(), limits);
  EXPECT_NE(s.message().find("truncated"), std::string::npos) << s.message();
  // With default limits, a 4 GiB string is over max_string_bytes (1 GiB) before any reading.
  s = LoadError(P().proto(4).op('X').le(0xffffffff, 4).raw("ab").done());
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("max_string_bytes"), std::string::npos) << s.message();
}

// ---- Limits ---------------------------------------------------------------------------------

TEST(PickleReaderTest, LimitsAreEnforced) {
  PickleLimits limits;
  limits.max_depth = 10;
  Status s = LoadError(std::string(11, '(') + "N.", limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("byte 10: more than the limit of 10 (max_depth)"), std::string::npos)
      << s.message();
  EXPECT_EQ(ReadPickleBytes(std::string(10, '(') + "N.", limits).ok(), true);

  limits = {};
  limits.max_objects = 3;
  s = LoadError(P().proto(2).op('(').op(']').op(']').op(']').op(']').op('l').stop().done(), limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("max_objects"), std::string::npos) << s.message();

  limits = {};
  limits.max_memo = 2;
  s = LoadError(P().proto(4).op('N').memoize().memoize().memoize().stop().done(), limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("byte 5: the memo holds more than the limit of 2 (max_memo)"),
            std::string::npos)
      << s.message();

  limits = {};
  limits.max_string_bytes = 4;
  s = LoadError(P().proto(4).sbu("hello").stop().done(), limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("max_string_bytes"), std::string::npos) << s.message();
  EXPECT_TRUE(ReadPickleBytes(P().proto(4).sbu("hell").stop().done(), limits).ok());
  s = LoadError("V" + std::string(100, 'x') + "\n.", limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);

  limits = {};
  limits.max_stack = 3;
  s = LoadError(P().proto(2).op('N').op('N').op('N').op('N').stop().done(), limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("max_stack"), std::string::npos) << s.message();

  limits = {};
  limits.max_input_bytes = 5;
  s = LoadError(P().proto(2).binint1(1).op('0').op('N').stop().done(), limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  EXPECT_NE(s.message().find("max_input_bytes"), std::string::npos) << s.message();
  auto input =
      InputStream::Open(MemorySource(P().proto(2).binint1(1).op('0').op('N').stop().done()));
  ASSERT_TRUE(input.ok());
  Result<Document> doc = ReadPickle(**input, limits);
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().code(), StatusCode::kLimitExceeded) << doc.status().ToString();
  // A pickle that ends within the limit is fine, whatever follows its STOP.
  EXPECT_TRUE(ReadPickleBytes(P().proto(2).op('N').stop().raw("xxxxxx").done(), limits).ok());
}

// ---- Streaming ------------------------------------------------------------------------------

TEST(PickleReaderTest, StreamedPayloadsAndLinesLongerThanTheBuffer) {
  const std::string big(3 * kStreamBufferBytes + 17, 'q');
  std::string bytes = P().proto(4)
                          .op('(')
                          .op(std::uint8_t{0x8d})
                          .le(big.size(), 8)
                          .raw(big)
                          .raw("V")
                          .raw(big)
                          .raw("\n")
                          .op('l')
                          .stop()
                          .done();
  std::uint64_t calls = 0;
  for (Compression c : {Compression::kNone, Compression::kGzip}) {
    Result<std::string> packed = Compress(c, bytes);
    ASSERT_TRUE(packed.ok());
    auto input = InputStream::Open(MemorySource(*packed));
    ASSERT_TRUE(input.ok());
    Result<Document> doc = ReadPickle(**input, {}, [&](std::uint64_t, std::uint64_t) { ++calls; });
    ASSERT_TRUE(doc.ok()) << doc.status().ToString();
    auto items = doc->Items(doc->root());
    ASSERT_EQ(items.size(), 2u);
    EXPECT_EQ(doc->AsString(items[0]), big);
    EXPECT_EQ(doc->AsString(items[1]), big);
  }
  EXPECT_GT(calls, 0u);  // about every 4 MiB of raw input
  // Truncated inside the long payload, streamed.
  auto input = InputStream::Open(MemorySource(bytes.substr(0, 2 * kStreamBufferBytes)));
  ASSERT_TRUE(input.ok());
  Result<Document> doc = ReadPickle(**input);
  ASSERT_FALSE(doc.ok());
  EXPECT_EQ(doc.status().message().rfind("byte 3: truncated", 0), 0u) << doc.status().message();
}

// Issue 24 item 1: the memory budget stops decoding as the data grows, in memory and streamed.
TEST(PickleReaderTest, Issue24MemoryBudgetStopsManySmallObjects) {
  std::string bytes = "\x80\x04](";
  for (int i = 0; i < 200'000; ++i) bytes += std::string("G\x3f\xf8\0\0\0\0\0\0", 9);
  bytes += "e.";
  PickleLimits limits;
  limits.max_memory_bytes = 1 << 20;
  Result<Document> in_memory = ReadPickleBytes(bytes, limits);
  ASSERT_FALSE(in_memory.ok());
  EXPECT_EQ(in_memory.status().code(), StatusCode::kLimitExceeded);
  EXPECT_NE(
      in_memory.status().message().find("the decoded data outgrew its memory budget: reached"),
      std::string::npos)
      << in_memory.status().message();
  EXPECT_NE(in_memory.status().message().find(
                "more than the memory budget of 1048576 bytes (1.0 MiB) (set by --max-memory); "
                "raise it with --max-memory"),
            std::string::npos)
      << in_memory.status().message();

  auto input = InputStream::Open(MemorySource(bytes));
  ASSERT_TRUE(input.ok());
  Result<Document> streamed = ReadPickle(**input, limits);
  ASSERT_FALSE(streamed.ok());
  EXPECT_EQ(streamed.status().code(), StatusCode::kLimitExceeded);

  limits.max_memory_bytes = 64 << 20;  // the same file within a budget that fits it
  EXPECT_TRUE(ReadPickleBytes(bytes, limits).ok());
}

// Issue 34: the run of BINGET / LONG_BINGET the machine pushes in a tight loop crosses the
// stack's growth and stops at max_stack with the offset of the opcode that overflowed it.
// (Guards the loop's rewrite; main's reader passes it too.)
TEST(PickleReaderTest, Issue34MemoRunsGrowTheStackAndStopAtItsLimit) {
  P p;
  p.proto(4).sbu("x").memoize().op(']').op('(');
  for (int i = 0; i < 1000; ++i) {
    if (i % 3 == 2) {
      p.op('j').le(0, 4);  // LONG_BINGET 0
    } else {
      p.binget(0);
    }
  }
  const std::string bytes = p.op('e').stop().done();
  Document doc = LoadOrDie(bytes);
  ASSERT_EQ(doc.Items(doc.root()).size(), 1000u);
  for (const Value v : doc.Items(doc.root())) ASSERT_EQ(doc.AsString(v), "x");

  // x and the list stand below the MARK: the 299th reference is the 301st value.
  PickleLimits limits;
  limits.max_stack = 300;
  const Status s = LoadError(bytes, limits);
  EXPECT_EQ(s.code(), StatusCode::kLimitExceeded);
  std::size_t at = 2 + 3 + 1 + 1 + 1;  // PROTO, SHORT_BINUNICODE x, MEMOIZE, EMPTY_LIST, MARK
  for (int i = 0; i < 298; ++i) at += i % 3 == 2 ? 5 : 2;
  EXPECT_EQ(s.message().rfind("byte " + std::to_string(at) + ": ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("max_stack"), std::string::npos) << s.message();
}

// Issue 24 item 1: the defaults docs/user-guide.md ("Input budgets") lists.
TEST(PickleReaderTest, Issue24DerivedBudgets) {
  ASSERT_EQ(ProcessBudget().max_memory_bytes, 0u);  // no flag in this process
  constexpr std::uint64_t kGiB = std::uint64_t{1} << 30;
  // Half of what this process may use (issue 30 item 6): physical memory, a cgroup's limit or
  // RLIMIT_AS, whichever is least.
  const std::uint64_t half = ProcessUsableMemory().bytes / 2;
  ASSERT_GT(half, 0u);
  EXPECT_LE(half, PhysicalMemoryBytes() / 2);
  EXPECT_EQ(MemoryBudgetFor(8192), std::min(kGiB, half));
  EXPECT_EQ(MemoryBudgetFor(kGiB), std::min(64 * kGiB, half));
  EXPECT_EQ(EventBudgetFor(8192), 1'000'000u);
  EXPECT_EQ(EventBudgetFor(40'000'000), 10'000'000u);
  EXPECT_EQ(TraceEventBudgetFor(70'000), 4'480'000u);
  EXPECT_EQ(DecodedBudgetFor(200'000), 4 * kGiB);
  EXPECT_EQ(DecodedBudgetFor(8 * kGiB), 8192 * kGiB);
  EXPECT_EQ(OutputBudgetFor(2048), std::uint64_t{256} << 20);
  EXPECT_EQ(OutputBudgetFor(kGiB), 1024 * kGiB);
  ProcessBudget().max_memory_bytes = 12345;  // a flag wins over the derived figure
  EXPECT_EQ(MemoryBudgetFor(kGiB), 12345u);
  ProcessBudget() = InputBudget();
}

}  // namespace
}  // namespace fragscope::sources
