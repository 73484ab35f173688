// What GPU wait costs in money, and what a change saved: the `cost` and `comparison` objects of
// a run directory's run.json (docs/observe.md). Pure arithmetic; no I/O.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait::observe {

// The `cost` object: every cause's share of wall time priced on `gpus` GPUs.
struct WaitCost {
  int64_t gpus = 0;
  double gpu_hourly_cost = 0;
  std::map<std::string, double> per_day;   // cause -> share x gpus x rate x 24
  std::map<std::string, double> per_year;  // per_day x 365
  double wait_per_day = 0;                 // every cause but "compute"
  double wait_per_year = 0;
};

// Prices `shares` (cause -> share of wall time). Errors (invalid_argument, naming the field and
// value): gpus < 1, a negative or non-finite gpu_hourly_cost, a share outside [0, 1].
Result<WaitCost> wait_cost(const std::map<std::string, double>& shares, int64_t gpus,
                           double gpu_hourly_cost);

// What comparison needs from a run.json: its throughput and its compute share, when it has them.
struct RunFigures {
  std::optional<double> samples_per_s;  // throughput.samples_per_s
  std::optional<double> compute_share;  // shares.compute
};

// The `comparison` object of the later run against `before`.
struct Comparison {
  std::string before;           // where the earlier run is (its directory), as the user named it
  std::string basis;            // "throughput" or "compute share": which rule gave the saving
  double saving_share = 0;      // negative: the later run needs more GPU time (a regression)
  std::optional<double> saving_per_day;   // set when gpus and a rate are given
  std::optional<double> saving_per_year;
};

// saving_share = 1 - before/after samples_per_s when both runs have a throughput; otherwise
// 1 - before/after compute share (the same work needs GPU time in proportion to 1 / compute
// share). Never clamped. The after figure must be > 0; a before of 0 saves everything (1.0).
// gpus 0 leaves the money out. Errors (invalid_argument): neither rule applies (the missing
// figures named), gpus < 0, a negative rate.
Result<Comparison> compare_runs(const RunFigures& before, const RunFigures& after,
                                const std::string& before_name, int64_t gpus,
                                double gpu_hourly_cost);

}  // namespace zerowait::observe
