// The one writer of a run directory (docs/observe.md), for `zerowait watch`, StepProfiler.save()
// and `zerowait emulate`: run.json checked against the schema, the JSON Lines files beside it,
// and run.json last, so that a directory holding run.json is a complete run.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::observe {

// A file of a run directory besides run.json.
struct RunFile {
  std::string name;   // relative to the directory: "steps.jsonl", "steps/image-8.jsonl"
  std::string lines;  // JSON Lines: one object per line, each line ending in '\n'
};

// Each object of `objects` on a line of its own, compact (the JSON Lines of a RunFile).
std::string json_lines(const std::vector<nlohmann::ordered_json>& objects);

// Whether `run` is a run.json every reader accepts: an object with "schema" kRunSchema, "kind"
// profile, watch or emulate, and "causes" naming causes of kCauses in its order. Errors:
// invalid_argument naming the field and what it holds.
Status check_run(const nlohmann::ordered_json& run);

// Writes each of `files` and then run.json (indented, ending in a newline) under `dir`, each
// whole (written and renamed), creating the folders. Errors: check_run's (nothing is written);
// a file name that is absolute or climbs out of `dir` (invalid_argument); errno_status naming
// the path that could not be made or written.
Status write_run_directory(const std::string& dir, const nlohmann::ordered_json& run,
                           const std::vector<RunFile>& files);

}  // namespace zerowait::observe
