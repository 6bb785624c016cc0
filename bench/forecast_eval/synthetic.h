// Synthetic request traces for the forecast evaluation (bench/forecast_eval): small models of
// the allocation patterns of six workload types, deterministic from a seed. They stand in for
// the captured workloads until those land in bench/forecast_eval/workloads/, and they are
// labelled "synthetic_*" in the table so nobody mistakes them for captures.
#ifndef FRAGSCOPE_BENCH_FORECAST_EVAL_SYNTHETIC_H_
#define FRAGSCOPE_BENCH_FORECAST_EVAL_SYNTHETIC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "fragscope/event.h"

namespace fragscope::bench {

struct SyntheticWorkload {
  std::string name;
  std::vector<Event> events;  // a request trace: alloc / free_requested / step
};

/// The six synthetic workloads, `steps` steps each.
std::vector<SyntheticWorkload> MakeSyntheticWorkloads(std::int64_t steps, std::uint64_t seed);

}  // namespace fragscope::bench

#endif  // FRAGSCOPE_BENCH_FORECAST_EVAL_SYNTHETIC_H_
