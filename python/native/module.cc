// _fragscope_native: the Python extension of the fragscope package (python/fragscope). One
// module, one Bind* function per area, so that later bindings (e.g. the forecaster) add a file
// and a call below without touching the others.
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/units.h"
#include "forecast_binding.h"
#include "model/alloc_conf.h"
#include "virtual_gpu.h"

namespace py = pybind11;

namespace fragscope::python {
namespace {

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

py::dict OomDict(const vgpu::OomRecord& oom) {
  py::dict d;
  d["request_index"] = oom.request_index;
  d["step"] = oom.step >= 0 ? py::object(py::int_(oom.step)) : py::object(py::none());
  d["requested_bytes"] = oom.details.requested;
  d["rounded_bytes"] = oom.details.rounded;
  d["tried_to_allocate_bytes"] = oom.details.reported;
  d["device_total_bytes"] = oom.details.device_total;
  d["device_free_bytes"] = oom.details.device_free;
  d["allocated_bytes"] = oom.details.allocated;
  d["reserved_bytes"] = oom.details.reserved;
  d["limit_bytes"] = oom.details.limit ? py::object(py::int_(*oom.details.limit)) : py::none();
  d["message"] = oom.details.message;
  d["memory_stats"] = oom.stats;
  py::list segments;
  for (const auto& seg : oom.segments) segments.append(SegmentDict(seg));
  d["segments"] = segments;
  return d;
}

void RequireSession() { Check(vgpu::HasSession()); }

void BindVirtualGpu(py::module_& m) {
  m.def(
      "parse_size",
      [](const std::string& text) {
        auto r = ParseSize(text);
        if (!r.ok()) Raise(r.status());
        return r.value();
      },
      "Bytes of a size string ('80GiB', '512MiB'); ValueError naming the text.");
  m.def(
      "canonical_alloc_conf",
      [](const std::string& conf, const std::string& version) {
        auto r = model::ParseAllocatorConfig(conf, VersionOf(version));
        if (!r.ok()) Raise(r.status());
        return model::ToConfString(r.value());
      },
      "Validates a PYTORCH_CUDA_ALLOC_CONF string as PyTorch would; returns its canonical form.");
  m.def(
      "vgpu_start",
      [](std::uint64_t capacity, std::uint64_t used_by_others, const std::string& conf,
         const std::string& version, bool raise_on_oom, bool keep_cpu_only, bool record_trace) {
        vgpu::VirtualGpuOptions options;
        options.sim.version = VersionOf(version);
        auto parsed = model::ParseAllocatorConfig(conf, options.sim.version);
        if (!parsed.ok()) Raise(parsed.status());
        options.sim.config = parsed.value();
        options.sim.driver.capacity_bytes = capacity;
        options.sim.driver.used_by_others_bytes = used_by_others;
        options.alloc_conf = conf;
        options.on_oom = raise_on_oom ? vgpu::OnOom::kRaise : vgpu::OnOom::kRecord;
        options.keep_cpu_only = keep_cpu_only;
        options.record_trace = record_trace;
        Check(vgpu::Start(options));
      },
      py::arg("capacity"), py::arg("used_by_others"), py::arg("alloc_conf"),
      py::arg("torch_version"), py::arg("raise_on_oom"), py::arg("keep_cpu_only"),
      py::arg("record_trace"));
  m.def("vgpu_stop", &vgpu::Stop);
  m.def("scopes_entered_on_this_thread", &vgpu::ScopesEnteredOnThisThread,
        "RecordFunction scopes the CPU-only tracking saw start on this thread (benchmarks)");
  py::class_<vgpu::UserScope>(m, "UserScope",
                              "A record_function range that allocates nothing (cpu_only.h)")
      .def(py::init<std::string>())
      .def("enter", &vgpu::UserScope::Enter)
      .def("exit", &vgpu::UserScope::Exit);
  m.def("vgpu_active", &vgpu::Active);
  m.def("vgpu_has_session", [] { return vgpu::HasSession().ok(); });
  m.def("vgpu_step", [](std::int64_t step) {
    RequireSession();
    vgpu::MarkStep(step);
  });
  m.def("vgpu_memory_stats", [] {
    RequireSession();
    return vgpu::MemoryStats();
  });
  m.def("vgpu_memory_snapshot", [] {
    RequireSession();
    py::list out;
    for (const auto& seg : vgpu::MemorySnapshot()) out.append(SegmentDict(seg));
    return out;
  });
  m.def("vgpu_mem_get_info", [] {
    RequireSession();
    return vgpu::MemGetInfo();
  });
  m.def("vgpu_reset_peak", [] {
    RequireSession();
    vgpu::ResetPeakStats();
  });
  m.def("vgpu_reset_accumulated", [] {
    RequireSession();
    vgpu::ResetAccumulatedStats();
  });
  m.def("vgpu_empty_cache", [] {
    RequireSession();
    vgpu::EmptyCache();
  });
  m.def("vgpu_set_memory_fraction", [](double fraction) {
    RequireSession();
    Check(vgpu::SetMemoryFraction(fraction));
  });
  m.def("vgpu_ooms", [] {
    RequireSession();
    py::list out;
    for (const auto& oom : vgpu::Ooms()) out.append(OomDict(oom));
    return out;
  });
  m.def("vgpu_alloc_conf", [] {
    RequireSession();
    return vgpu::AllocConfCanonical();
  });
  m.def("vgpu_counters", [] {
    RequireSession();
    const vgpu::HookCounters c = vgpu::Counters();
    py::dict d;
    d["allocs"] = c.allocs;
    d["frees"] = c.frees;
    d["zero_size"] = c.zero_size;
    d["after_oom"] = c.after_oom;
    d["threads"] = c.threads;
    py::dict cpu_only;
    for (int k = 1; k < vgpu::kNumCpuOnlyKinds; ++k) {
      cpu_only[py::str(std::string(vgpu::CpuOnlyKindName(static_cast<vgpu::CpuOnlyKind>(k))))] =
          c.cpu_only[k];
    }
    d["cpu_only"] = cpu_only;
    return d;
  });
  // The request trace as (action, id, size) tuples; action: "alloc", "free_requested", "step"
  // (size = the step number).
  m.def("vgpu_request_trace", [] {
    RequireSession();
    py::list out;
    for (const auto& r : vgpu::RequestTrace()) {
      out.append(py::make_tuple(std::string(ActionName(r.action)), r.id, r.size));
    }
    return out;
  });
  // The simulator's allocator events, as torch.cuda.memory._snapshot()["device_traces"][0]
  // entries (action, addr, size, stream) plus step markers.
  m.def("vgpu_allocator_trace", [] {
    RequireSession();
    py::list out;
    for (const auto& e : vgpu::AllocatorTrace()) {
      py::dict d;
      d["action"] = std::string(ActionName(e.action));
      if (e.action == Action::kStep) {
        d["step"] = e.step;
      } else {
        d["addr"] = e.addr;
        d["size"] = e.size;
        d["stream"] = 0;  // one stream
        d["frames"] = py::list();
        if (e.has_device_free) d["device_free"] = e.device_free;
      }
      out.append(d);
    }
    return out;
  });
}

}  // namespace
}  // namespace fragscope::python

PYBIND11_MODULE(_fragscope_native, m) {
  m.doc() = "fragscope's native parts: the virtual GPU hook (docs/virtual-gpu.md)";
  m.attr("TORCH_BUILD_VERSION") = FRAGSCOPE_TORCH_VERSION;
  fragscope::python::BindVirtualGpu(m);
  fragscope::python::BindForecast(m);
}
