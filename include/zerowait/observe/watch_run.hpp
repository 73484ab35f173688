// The run directory that `zerowait watch` writes (docs/observe.md, schema zerowait.run/1):
// run.json and system.jsonl.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/observe/attribution.hpp"
#include "zerowait/observe/cost.hpp"
#include "zerowait/observe/system_sampler.hpp"

namespace zerowait::observe {

// The change most likely to cut an input-bound job's wait, with the number behind it
// (docs/observe.md, run.json's `advice`).
struct WatchAdvice {
  std::string change;                // "num_workers=2 -> 4"
  int workers = 0;                   // worker processes seen (median over the samples)
  double workers_cpu = 0;            // CPUs they used (mean)
  double predicted_input_share = 0;  // the input share the change would leave
  std::string summary;               // the line watch prints after the verdict
};

struct WatchRun {
  std::string title;                  // the watched command line, or "pid N: ..."
  std::vector<std::string> command;   // zerowait's own argv
  double started_unix = 0;
  double duration_s = 0;
  // Seconds from the start to the first sample with the data pipeline running (DataLoader
  // workers or zerowait loader threads): imports and setup, left out of the shares. 0 when
  // following a pid whose pipeline already ran, or when no pipeline was ever seen.
  double startup_s = 0;
  // Seconds after the last sample with the pipeline running (interpreter teardown), likewise
  // left out.
  double shutdown_s = 0;
  std::optional<int> exit_code;  // the started job's exit status (none with a pid)
  bool failed = false;           // the job exited non-zero (not after watch's Ctrl-C)
  // Why the main thread was classified from its state alone (no ptrace rights); "" when not.
  std::string degraded;
  Attribution attribution;
  std::vector<WatchAdvice> advice;  // [] unless input-bound
  std::optional<WaitCost> cost;
  std::optional<Comparison> comparison;
  std::vector<SystemSample> samples;  // each with `main`
};

// run.json's text (indented, with a trailing newline).
std::string watch_run_json(const WatchRun& run);

// Writes `dir`/run.json and `dir`/system.jsonl, creating `dir` (and its parents). Errors: the
// directory cannot be made, a file cannot be written (errno_status names the path).
Status write_watch_run(const std::string& dir, const WatchRun& run);

// The figures compare_runs() needs from `dir`/run.json. Errors: not_found naming the path when
// there is no run.json (with the fix), corrupt when it is not JSON, invalid_argument for a
// field of the wrong type.
Result<RunFigures> read_run_figures(const std::string& dir);

}  // namespace zerowait::observe
