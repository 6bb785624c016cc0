// fragscope._core.Simulator (simulator_binding.cc).
#ifndef FRAGSCOPE_PYTHON_NATIVE_SIMULATOR_BINDING_H_
#define FRAGSCOPE_PYTHON_NATIVE_SIMULATOR_BINDING_H_

#include <pybind11/pybind11.h>

namespace fragscope::python {

/// Adds Simulator to `m`.
void BindSimulator(pybind11::module_& m);

}  // namespace fragscope::python

#endif  // FRAGSCOPE_PYTHON_NATIVE_SIMULATOR_BINDING_H_
