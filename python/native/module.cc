// fragscope._core: the native core of the Python package (python/fragscope), built from the same
// C++ libraries as the `fragscope` command and linking no framework: the allocator-settings
// grammar, sizes, the simulator, the virtual GPU's session (whose c10 hook is compiled apart,
// against the user's torch: fragscope/torch/csrc) and the forecaster. One Bind* function per
// area, so that a new binding adds a file and a call below without touching the others.
#include <string>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "common/units.h"
#include "forecast_binding.h"
#include "model/alloc_conf.h"
#include "native_common.h"
#include "simulator_binding.h"
#include "vgpu_session.h"

namespace py = pybind11;

namespace fragscope::python {
namespace {

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
      "parse_capacity",
      [](const std::string& text) {
        auto r = ParseCapacity(text);
        if (!r.ok()) Raise(r.status());
        return py::make_tuple(r.value().bytes, r.value().note);
      },
      "(bytes, note) of a device capacity as the CLI's --capacity reads it: a bare number below "
      "1 MiB is refused; note says what a decimal unit ('80GB') means, else ''.");
  m.def(
      "canonical_alloc_conf",
      [](const std::string& conf, const std::string& version) {
        auto r = model::ParseUserAllocatorConf(conf, VersionOf(version));
        if (!r.ok()) Raise(r.status());
        return model::ToConfString(r.value());
      },
      "Validates a PYTORCH_CUDA_ALLOC_CONF string as PyTorch would (a pasted `VAR=value` is "
      "accepted, as by the CLI); returns its canonical form.");
  // The allocator_settings dict of a 2.4+ snapshot (shared/spec/memory-snapshot-format.md §5)
  // for `conf` as `version` parses it.
  m.def(
      "snapshot_allocator_settings",
      [](const std::string& conf, const std::string& version) {
        auto r = model::ParseUserAllocatorConf(conf, VersionOf(version));
        if (!r.ok()) Raise(r.status());
        const model::AllocatorConfig& c = r.value();
        py::dict d;
        d["PYTORCH_CUDA_ALLOC_CONF"] = conf;
        d["max_split_size"] = c.max_split_size == model::kUnlimited
                                  ? std::int64_t{-1}
                                  : static_cast<std::int64_t>(c.max_split_size);
        d["garbage_collection_threshold"] = c.garbage_collection_threshold;
        d["expandable_segments"] = c.expandable_segments;
        d["pinned_num_register_threads"] = c.pinned_num_register_threads;
        d["release_lock_on_cudamalloc"] = c.release_lock_on_cudamalloc;
        d["pinned_use_cuda_host_register"] = c.pinned_use_cuda_host_register;
        py::dict divisions;
        for (std::size_t i = 0; i < c.roundup_power2_divisions.size(); ++i) {
          divisions[py::str(std::to_string(std::uint64_t{1} << i))] = c.roundup_power2_divisions[i];
        }
        d["roundup_power2_divisions"] = divisions;
        return d;
      },
      py::arg("conf"), py::arg("torch_version"));
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
  m.def(
      "vgpu_api_address", [] { return reinterpret_cast<std::uintptr_t>(vgpu::Api()); },
      "The address of the C table the c10 hook calls (fragscope/torch/csrc/vgpu_api.h).");
  m.attr("VGPU_API_VERSION") = FRAGSCOPE_VGPU_API_VERSION;
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
      cpu_only[py::str(vgpu::CpuOnlyKindName(k))] = c.cpu_only[k];
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
        d["time_us"] = e.time_us;
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

PYBIND11_MODULE(_core, m) {
  m.doc() = "fragscope's native core: settings, simulator, virtual GPU session, forecaster";
  m.attr("__version__") = FRAGSCOPE_VERSION;
  fragscope::python::BindVirtualGpu(m);
  fragscope::python::BindSimulator(m);
  fragscope::python::BindForecast(m);
}
