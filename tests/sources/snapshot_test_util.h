// Builders for snapshot Documents in tests: the dicts and lists PyTorch's _snapshot() returns,
// written through the Document building API (what a pickle reader would produce).
#ifndef FRAGSCOPE_TESTS_SOURCES_SNAPSHOT_TEST_UTIL_H_
#define FRAGSCOPE_TESTS_SOURCES_SNAPSHOT_TEST_UTIL_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sources/document/document.h"

namespace fragscope::sources::testing {

class DocBuilder {
 public:
  Document& doc() { return doc_; }
  Document Take() { return std::move(doc_); }

  Value S(std::string_view s) { return doc_.AddString(s); }
  Value I(std::int64_t i) { return doc_.AddInt(i); }
  Value U(std::uint64_t u) {
    std::string le;
    for (int b = 0; b < 9; ++b) le.push_back(static_cast<char>(b < 8 ? (u >> (8 * b)) & 0xff : 0));
    return doc_.AddLongBytes(le);
  }
  Value Dict(std::initializer_list<std::pair<std::string_view, Value>> entries) {
    Value d = doc_.AddDict();
    for (const auto& [k, v] : entries) doc_.SetItem(d, S(k), v);
    return d;
  }
  Value List(std::initializer_list<Value> items) {
    Value l = doc_.AddList();
    for (const Value v : items) doc_.Append(l, v);
    return l;
  }
  Value List(const std::vector<Value>& items) {
    Value l = doc_.AddList();
    for (const Value v : items) doc_.Append(l, v);
    return l;
  }
  Value Frame(std::string_view file, std::int64_t line, std::string_view name) {
    return Dict({{"filename", S(file)}, {"line", I(line)}, {"name", S(name)}});
  }
  Value Block(std::uint64_t addr, std::uint64_t size, std::uint64_t requested,
              std::string_view state, Value frames = Value()) {
    if (frames.is_none()) frames = List({});
    return Dict({{"address", U(addr)},
                 {"size", U(size)},
                 {"requested_size", U(requested)},
                 {"state", S(state)},
                 {"frames", frames}});
  }
  Value Segment(std::int64_t device, std::uint64_t addr, std::uint64_t total,
                std::vector<Value> blocks, std::string_view type = "large",
                std::uint64_t stream = 0, bool expandable = false) {
    return Dict({{"device", I(device)},
                 {"address", U(addr)},
                 {"total_size", U(total)},
                 {"stream", U(stream)},
                 {"segment_type", S(type)},
                 {"is_expandable", doc_.AddBool(expandable)},
                 {"blocks", List(blocks)}});
  }
  Value Entry(std::string_view action, std::uint64_t addr, std::uint64_t size,
              Value frames = Value(), std::uint64_t stream = 0) {
    if (frames.is_none()) frames = List({});
    return Dict({{"action", S(action)},
                 {"addr", U(addr)},
                 {"size", U(size)},
                 {"stream", U(stream)},
                 {"frames", frames}});
  }
  Value Snapshot(std::vector<Value> segments, std::vector<std::vector<Value>> traces) {
    std::vector<Value> devices;
    for (auto& t : traces) devices.push_back(List(t));
    Value root = Dict({{"segments", List(segments)}, {"device_traces", List(devices)}});
    doc_.set_root(root);
    return root;
  }

 private:
  Document doc_;
};

}  // namespace fragscope::sources::testing

#endif  // FRAGSCOPE_TESTS_SOURCES_SNAPSHOT_TEST_UTIL_H_
