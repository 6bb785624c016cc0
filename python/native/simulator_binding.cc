// fragscope._core.Simulator: PyTorch's CUDA caching allocator as fragscope models it
// (model::CachingAllocatorSim, docs/simulator.md), driven from Python without any framework:
// "what would these requests do on a 40 GiB card with these settings?"
#include "simulator_binding.h"

#include <memory>
#include <string>

#include <pybind11/stl.h>

#include "model/alloc_conf.h"
#include "model/caching_allocator_sim.h"
#include "native_common.h"

namespace py = pybind11;

namespace fragscope::python {
namespace {

class Simulator {
 public:
  Simulator(std::uint64_t capacity, const std::string& alloc_conf, const std::string& version,
            std::uint64_t used_by_others) {
    if (capacity == 0) throw py::value_error("capacity: must be more than 0 bytes");
    if (used_by_others > capacity) {
      throw py::value_error("used_by_others: " + std::to_string(used_by_others) +
                            " bytes is more than the capacity (" + std::to_string(capacity) +
                            " bytes)");
    }
    model::SimOptions options;
    options.version = VersionOf(version);
    auto parsed = model::ParseAllocatorConfig(alloc_conf, options.version);
    if (!parsed.ok()) Raise(parsed.status());
    options.config = parsed.value();
    options.driver.capacity_bytes = capacity;
    options.driver.used_by_others_bytes = used_by_others;
    sim_ = std::make_unique<model::CachingAllocatorSim>(options);
    capacity_ = capacity;
  }

  // The block's address; MemoryError with PyTorch's message when it would not fit.
  std::uint64_t Malloc(std::uint64_t size, std::uint64_t stream) {
    auto r = sim_->Malloc(size, stream);
    if (!r.ok()) {
      if (r.status().code() == StatusCode::kOutOfMemory) {
        PyErr_SetString(PyExc_MemoryError, r.status().message().c_str());
        throw py::error_already_set();
      }
      Raise(r.status());
    }
    return r.value();
  }

  void Free(std::uint64_t address) { Check(sim_->Free(address)); }

  model::CachingAllocatorSim& sim() { return *sim_; }
  std::uint64_t capacity() const { return capacity_; }

 private:
  std::unique_ptr<model::CachingAllocatorSim> sim_;
  std::uint64_t capacity_ = 0;
};

}  // namespace

void BindSimulator(py::module_& m) {
  py::class_<Simulator>(m, "Simulator",
                        "PyTorch's CUDA caching allocator as fragscope models it, on a device "
                        "of `capacity` bytes (docs/simulator.md).")
      .def(py::init<std::uint64_t, const std::string&, const std::string&, std::uint64_t>(),
           py::arg("capacity"), py::arg("alloc_conf") = "", py::arg("torch_version") = "newest",
           py::arg("used_by_others") = 0)
      .def("malloc", &Simulator::Malloc, py::arg("size"), py::arg("stream") = 0,
           "torch's malloc: the block's address; MemoryError with PyTorch's OOM message.")
      .def("free", &Simulator::Free, py::arg("address"))
      .def("empty_cache", [](Simulator& s) { s.sim().EmptyCache(); })
      .def("memory_stats", [](Simulator& s) { return s.sim().stats().Flatten(); })
      .def("memory_snapshot",
           [](Simulator& s) {
             py::list out;
             for (const auto& seg : s.sim().MemorySnapshot()) out.append(SegmentDict(seg));
             return out;
           })
      .def("mem_get_info",
           [](Simulator& s) { return std::make_pair(s.sim().device_free_bytes(), s.capacity()); });
}

}  // namespace fragscope::python
