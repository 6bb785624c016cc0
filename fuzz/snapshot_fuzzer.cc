// Fuzz target for the snapshot path after the pickle reader: bytes -> Snapshot by the streaming
// decode (ReadSnapshotBytes: the pickle reader hands trace lists to the decoder as it reads;
// JSON through a Document), checked against the Document path (ReadPickleBytes ->
// DecodeSnapshot: when both succeed they agree on segments, blocks and entries per device)
// -> SnapshotReader (the history walked
// backwards to its start state) -> every event through the TraceAnalyzer, errors skipped as
// `fragscope analyze` skips them; then the re-simulation as `fragscope replay` runs it: the
// events again through SnapshotRequests (start state rebuilt with requests) into a
// RequestReplayer whose simulators take the recorded segment addresses, going on after OOMs.
// Oracles: no crash, no sanitizer report; every decoded block lies in the decoded blocks array;
// the reader yields a finite number of events; every simulator's invariants hold at the end.
//
// Built two ways: with libFuzzer (fuzz/CMakeLists.txt, preset "fuzz") and with replay_main.cc
// (snapshot_fuzz_replay, a ctest that runs fuzz/corpus/snapshot/).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <string_view>

#include "analysis/trace_analyzer.h"
#include "model/recorded_addresses.h"
#include "model/request_replayer.h"
#include "sources/document/json_document.h"
#include "sources/pickle/pickle_reader.h"
#include "sources/snapshot/snapshot_reader.h"
#include "sources/snapshot/snapshot_requests.h"

namespace {

using namespace fragscope;           // NOLINT: a fuzz target, not library code
using namespace fragscope::sources;  // NOLINT

constexpr std::size_t kMaxInputBytes = std::size_t{256} << 10;

void Fail(const char* what) {
  std::fprintf(stderr, "snapshot fuzzer: %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size > kMaxInputBytes) return 0;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  PickleLimits limits;
  limits.max_depth = 200;
  limits.max_objects = 200'000;
  limits.max_memo = 100'000;
  limits.max_string_bytes = 1 << 20;
  limits.max_stack = 100'000;
  Result<Snapshot> snapshot = ReadSnapshotBytes(bytes, limits);
  if (!snapshot.ok() && snapshot.status().message().empty()) Fail("an error without a message");
  {
    Result<Document> doc = DetectDocumentFormat(bytes) == DocumentFormat::kJson
                               ? ReadJsonDocumentBytes(bytes, limits)
                               : ReadPickleBytes(bytes, limits);
    Result<Snapshot> reference = doc.ok() ? DecodeSnapshot(*doc) : Result<Snapshot>(doc.status());
    if (snapshot.ok() && reference.ok()) {
      if (snapshot->segments.size() != reference->segments.size() ||
          snapshot->blocks.size() != reference->blocks.size() ||
          snapshot->device_traces.size() != reference->device_traces.size()) {
        Fail("the streaming and Document paths disagree on the segments or devices");
      }
      for (std::size_t d = 0; d < snapshot->device_traces.size(); ++d) {
        if (snapshot->device_traces[d].size() != reference->device_traces[d].size()) {
          Fail("the streaming and Document paths disagree on a device's entries");
        }
      }
    }
  }
  if (!snapshot.ok()) return 0;
  for (const SnapshotSegment& s : snapshot->segments) {
    if (std::uint64_t{s.first_block} + s.num_blocks > snapshot->blocks.size()) {
      Fail("a segment's blocks run past the blocks array");
    }
  }
  std::unique_ptr<SnapshotReader> reader =
      SnapshotReader::FromSnapshot(std::move(*snapshot), "fuzz");
  Result<std::unique_ptr<analysis::TraceAnalyzer>> analyzer =
      analysis::TraceAnalyzer::Create(reader->header(), {});
  if (!analyzer.ok()) return 0;
  Event e;
  std::uint64_t events = 0;
  while (true) {
    Result<bool> next = reader->Next(&e);
    if (!next.ok()) Fail("SnapshotReader::Next failed");
    if (!*next) break;
    if (++events > 50'000'000) Fail("the reader does not end");
    (void)(*analyzer)->Consume(e);  // errors are skipped, as analyze does
  }
  (void)(*analyzer)->Finish("fuzz");

  // Re-simulation on a 1 TiB device (bounds the simulated address space), at the addresses the
  // file recorded.
  reader->Rewind();
  std::map<std::int32_t, model::RecordedAddresses> plans = RecordedSegmentAddresses(*reader);
  model::RequestReplayer replayer(
      [&](std::int32_t device) {
        model::SimOptions o;
        o.driver.capacity_bytes = std::uint64_t{1} << 40;
        o.device = device;
        if (auto plan = plans.find(device); plan != plans.end()) plan->second.Attach(&o.driver);
        return o;
      },
      model::OomPolicy::kContinue, {});
  SnapshotRequests requests(*reader, model::AllocatorRules{},
                            [&](const Event& r) { return replayer.Consume(r); });
  while (true) {
    Result<bool> next = reader->Next(&e);
    if (!next.ok()) Fail("SnapshotReader::Next failed after Rewind");
    if (!*next) break;
    (void)requests.Consume(e);  // errors are skipped, as replay does
  }
  for (const auto& [device, sim] : replayer.devices()) {
    if (!sim->CheckInvariants().ok()) Fail("a simulator's invariants broke");
  }
  return 0;
}
