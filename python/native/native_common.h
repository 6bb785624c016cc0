// What every binding of fragscope._core shares: Status to Python exceptions, the modelled torch
// versions' names, and a snapshot segment as the dict torch.cuda.memory_snapshot() returns.
#ifndef FRAGSCOPE_PYTHON_NATIVE_NATIVE_COMMON_H_
#define FRAGSCOPE_PYTHON_NATIVE_NATIVE_COMMON_H_

#include <string>

#include <pybind11/pybind11.h>

#include "fragscope/status.h"
#include "model/alloc_conf.h"
#include "model/caching_allocator_sim.h"

namespace fragscope::python {

/// ValueError for kInvalidArgument and kLimitExceeded, RuntimeError otherwise.
[[noreturn]] void Raise(const Status& status);
void Check(const Status& status);
/// "1.13", "2", "newest" (fragscope.torch's torch_version=); ValueError naming the others.
model::ConfigVersion VersionOf(const std::string& version);
pybind11::dict SegmentDict(const model::SnapshotSegment& seg);

}  // namespace fragscope::python

#endif  // FRAGSCOPE_PYTHON_NATIVE_NATIVE_COMMON_H_
