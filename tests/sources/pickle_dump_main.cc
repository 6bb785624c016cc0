// pickle_dump FILE...: prints one line per file, the Document that ReadPickleBytes builds in a
// canonical text form (or "ERR <status>"). test_pickle_differential.py prints the same form
// for what Python's pickle.loads returns and compares. Linked only into tests.
//
// Form: N, T, F; i<decimal> for ints that fit int64; L<hex of the shortest little-endian two's
// complement bytes> for bigger ones; f<%.17g>; s<hex of UTF-8>; b<hex>; [items,] (items,)
// {key:value,}. Shared and self-referencing containers are printed where they occur (the
// differential test makes none that hold themselves).
#include <cstdio>
#include <fstream>
#include <iterator>
#include <string>

#include "sources/pickle/pickle_reader.h"

namespace fragscope::sources {
namespace {

void Hex(std::string_view bytes, std::string* out) {
  static constexpr char kDigits[] = "0123456789abcdef";
  for (unsigned char c : bytes) {
    out->push_back(kDigits[c >> 4]);
    out->push_back(kDigits[c & 15]);
  }
}

// Recursive: test inputs are shallow.
void Dump(const Document& doc, Value v, std::string* out) {
  switch (v.kind()) {
    case ValueKind::kNone:
      *out += "N";
      return;
    case ValueKind::kBool:
      *out += *doc.AsBool(v) ? "T" : "F";
      return;
    case ValueKind::kInt:
      *out += "i" + std::to_string(*doc.AsInt(v));
      return;
    case ValueKind::kBigInt:
      *out += "L";
      Hex(*doc.BigIntBytes(v), out);
      return;
    case ValueKind::kFloat: {
      char text[64];
      std::snprintf(text, sizeof(text), "f%.17g", *doc.AsDouble(v));
      *out += text;
      return;
    }
    case ValueKind::kString:
      *out += "s";
      Hex(*doc.AsString(v), out);
      return;
    case ValueKind::kBytes:
      *out += "b";
      Hex(*doc.AsBytes(v), out);
      return;
    case ValueKind::kList:
    case ValueKind::kTuple: {
      const bool list = v.kind() == ValueKind::kList;
      *out += list ? "[" : "(";
      for (Value item : doc.Items(v)) {
        Dump(doc, item, out);
        *out += ",";
      }
      *out += list ? "]" : ")";
      return;
    }
    case ValueKind::kDict:
      *out += "{";
      for (const auto& [key, value] : doc.Entries(v)) {
        Dump(doc, key, out);
        *out += ":";
        Dump(doc, value, out);
        *out += ",";
      }
      *out += "}";
      return;
  }
}

}  // namespace
}  // namespace fragscope::sources

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream in(argv[i], std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto doc = fragscope::sources::ReadPickleBytes(bytes);
    if (!doc.ok()) {
      std::printf("ERR %s\n", doc.status().ToString().c_str());
      continue;
    }
    std::string out;
    fragscope::sources::Dump(*doc, doc->root(), &out);
    std::printf("%s\n", out.c_str());
  }
  return 0;
}
