// The JSON of a run directory's parts (docs/observe.md), in one place for the CLI, the Python
// bindings and the run writer: a sample's system.jsonl line, the cost and comparison objects, and
// the figures a comparison reads back from an earlier run.json.
#pragma once

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

nlohmann::ordered_json sample_json(const SystemSample& sample);
nlohmann::ordered_json cost_json(const WaitCost& cost);
nlohmann::ordered_json comparison_json(const Comparison& comparison);

// throughput.samples_per_s and shares.compute of a run.json object. Errors (invalid_argument,
// naming `where` and the field): not an object, a field of the wrong type, a share outside
// [0, 1].
Result<RunFigures> run_figures(const nlohmann::json& run, const std::string& where);

}  // namespace zerowait::observe
