#include "native_common.h"

#include <stdexcept>

namespace py = pybind11;

namespace fragscope::python {

[[noreturn]] void Raise(const Status& status) {
  if (status.code() == StatusCode::kInvalidArgument || status.code() == StatusCode::kLimitExceeded)
    throw py::value_error(status.message());
  throw std::runtime_error(status.message());
}

void Check(const Status& status) {
  if (!status.ok()) Raise(status);
}

model::ConfigVersion VersionOf(const std::string& version) {
  if (version == "1.13") return model::ConfigVersion::kV1_13;
  if (version == "2") return model::ConfigVersion::kV2;
  if (version == "newest") return model::ConfigVersion::kNewest;
  throw py::value_error("torch_version: '" + version + "' is not one of 1.13, 2, newest");
}

py::dict SegmentDict(const model::SnapshotSegment& seg) {
  py::dict d;
  d["device"] = seg.device;
  d["address"] = seg.address;
  d["total_size"] = seg.total_size;
  d["allocated_size"] = seg.allocated_size;
  d["active_size"] = seg.active_size;
  d["requested_size"] = seg.requested_size;
  d["stream"] = seg.stream;
  d["segment_type"] = seg.segment_type;
  d["is_expandable"] = seg.is_expandable;
  py::list blocks;
  for (const auto& b : seg.blocks) {
    py::dict bd;
    bd["address"] = b.address;
    bd["size"] = b.size;
    bd["requested_size"] = b.requested_size;
    bd["state"] = b.state;
    bd["frames"] = py::list();
    blocks.append(bd);
  }
  d["blocks"] = blocks;
  return d;
}

}  // namespace fragscope::python
