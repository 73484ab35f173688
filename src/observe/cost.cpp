#include "zerowait/observe/cost.hpp"

#include <cmath>
#include <sstream>

namespace zerowait::observe {
namespace {

constexpr double kHoursPerDay = 24;
constexpr double kDaysPerYear = 365;
constexpr const char* kCompute = "compute";

std::string number_text(double value) {
  std::ostringstream text;
  text << value;
  return text.str();
}

Status check_rate(int64_t gpus, int64_t min_gpus, double gpu_hourly_cost) {
  if (gpus < min_gpus) {
    return invalid_argument("gpus = " + std::to_string(gpus) + ": give at least " +
                            std::to_string(min_gpus) + " GPU(s)");
  }
  if (!std::isfinite(gpu_hourly_cost) || gpu_hourly_cost < 0) {
    return invalid_argument("gpu_hourly_cost = " + number_text(gpu_hourly_cost) +
                            ": give the price of one GPU for one hour, 0 or more (e.g. 2.0)");
  }
  return Status::ok();
}

double per_day(double share, int64_t gpus, double gpu_hourly_cost) {
  return share * double(gpus) * gpu_hourly_cost * kHoursPerDay;
}

}  // namespace

Result<WaitCost> wait_cost(const std::map<std::string, double>& shares, int64_t gpus,
                           double gpu_hourly_cost) {
  ZW_RETURN_IF_ERROR(check_rate(gpus, 1, gpu_hourly_cost));
  WaitCost cost;
  cost.gpus = gpus;
  cost.gpu_hourly_cost = gpu_hourly_cost;
  for (const auto& [cause, share] : shares) {
    if (!std::isfinite(share) || share < 0 || share > 1) {
      return invalid_argument("shares['" + cause + "'] = " + number_text(share) +
                              ": a share of wall time must be within [0, 1]");
    }
    const double day = per_day(share, gpus, gpu_hourly_cost);
    cost.per_day[cause] = day;
    cost.per_year[cause] = day * kDaysPerYear;
    if (cause != kCompute) cost.wait_per_day += day;
  }
  cost.wait_per_year = cost.wait_per_day * kDaysPerYear;
  return cost;
}

Result<Comparison> compare_runs(const RunFigures& before, const RunFigures& after,
                                const std::string& before_name, int64_t gpus,
                                double gpu_hourly_cost) {
  ZW_RETURN_IF_ERROR(check_rate(gpus, 0, gpu_hourly_cost));
  // The after figure divides; a before of 0 (a GPU that did nothing) saves everything.
  const auto usable = [](const std::optional<double>& v, bool may_be_zero) {
    return v.has_value() && std::isfinite(*v) && (*v > 0 || (may_be_zero && *v == 0));
  };
  const auto both = [&](const std::optional<double>& b, const std::optional<double>& a) {
    return usable(b, true) && usable(a, false);
  };
  Comparison comparison;
  comparison.before = before_name;
  if (both(before.samples_per_s, after.samples_per_s)) {
    comparison.basis = "throughput";
    comparison.saving_share = 1 - *before.samples_per_s / *after.samples_per_s;
  } else if (both(before.compute_share, after.compute_share)) {
    comparison.basis = "compute share";
    comparison.saving_share = 1 - *before.compute_share / *after.compute_share;
  } else {
    const auto figures = [&](const RunFigures& run, bool may_be_zero) {
      return std::string(usable(run.samples_per_s, may_be_zero) ? "throughput.samples_per_s"
                                                                 : "no throughput") +
             (usable(run.compute_share, may_be_zero) ? " and shares.compute"
                                                     : " and no usable shares.compute");
    };
    return invalid_argument(
        "cannot compare the runs: the before run has " + figures(before, true) +
        ", the after run has " + figures(after, false) +
        "; both need throughput.samples_per_s or shares.compute (the after run's above 0)");
  }
  if (gpus > 0) {
    comparison.saving_per_day = per_day(comparison.saving_share, gpus, gpu_hourly_cost);
    comparison.saving_per_year = *comparison.saving_per_day * kDaysPerYear;
  }
  return comparison;
}

}  // namespace zerowait::observe
