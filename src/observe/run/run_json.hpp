// The JSON of a run directory's parts (docs/observe.md), in one place for the CLI, the Python
// bindings and the run writer: a sample's system.jsonl line, the cost and comparison objects, and
// the figures a comparison reads back from an earlier run.json.
#pragma once

#include <map>
#include <nlohmann/json.hpp>
#include <string>

#include "zerowait/common/status.hpp"
#include "zerowait/observe/cost.hpp"
#include "zerowait/observe/system_sampler.hpp"

namespace zerowait::observe {

// run.json's "schema": what every producer writes and the report accepts.
inline constexpr char kRunSchema[] = "zerowait.run/1";

// `value` to `decimals` places: shares to 4, money to a cent. Dividing by a power of ten gives
// the double nearest the decimal, which JSON prints short (0.1946, not 0.19460000000000002).
double rounded(double value, int decimals);

// run.json's causes, seconds, shares and verdict from each cause's `seconds` over `wall_s`: the
// causes given, in kCauses's order; a share is seconds / wall_s (0 when wall_s is 0); the verdict
// is verdict_of's ("unknown" when wall_s is 0). `decimals` >= 0 rounds the seconds and shares
// written, not those the verdict reads. The one summary of every producer (watch, profile,
// emulate). invalid_argument naming a cause that is not one of kCauses.
Result<nlohmann::ordered_json> cause_summary(const std::map<std::string, double>& seconds,
                                             double wall_s, int decimals = -1);

nlohmann::ordered_json sample_json(const SystemSample& sample);
nlohmann::ordered_json cost_json(const WaitCost& cost);
nlohmann::ordered_json comparison_json(const Comparison& comparison);

// throughput.samples_per_s and shares.compute of a run.json object. Errors (invalid_argument,
// naming `where` and the field): not an object, a field of the wrong type, a share outside
// [0, 1].
Result<RunFigures> run_figures(const nlohmann::json& run, const std::string& where);

}  // namespace zerowait::observe
