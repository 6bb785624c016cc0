// Bindings of the analysis library (forecaster, tune) for the Python package's monitor
// (python/fragscope/torch/monitor.py).
#ifndef FRAGSCOPE_PYTHON_NATIVE_FORECAST_BINDING_H_
#define FRAGSCOPE_PYTHON_NATIVE_FORECAST_BINDING_H_

#include <pybind11/pybind11.h>

namespace fragscope::python {

/// Adds LiveForecasts and tune_requests to `m`.
void BindForecast(pybind11::module_& m);

}  // namespace fragscope::python

#endif  // FRAGSCOPE_PYTHON_NATIVE_FORECAST_BINDING_H_
