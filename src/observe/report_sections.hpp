// The report page's sections that have files of their own. Each returns its <section> element,
// or "" when the run has nothing for it.
#pragma once

#include <string>

#include "observe/report_run.hpp"

namespace zerowait::observe {

// id="timeline": the per-step bars from steps.jsonl and, on the same time axis, the system
// samples from system.jsonl (disk, process I/O, memory, CPU, GPU, the main thread), with the
// run's events as markers listed underneath.
std::string timeline_section(const RunRecord& run);

}  // namespace zerowait::observe
