// `zerowait watch` as a library call: start a training job (or follow a running process), sample
// its main thread and the system until it ends, attribute its time, price and compare it, and
// write the run directory (docs/observe.md). The command line only parses and prints.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/observe/system_sampler.hpp"
#include "zerowait/observe/watch_run.hpp"

namespace zerowait::observe {

struct WatchOptions {
  std::vector<std::string> command;  // the job to start (argv, looked up in PATH); or
  pid_t pid = 0;                     // a running process to follow until it exits
  double interval = SystemSamplerOptions{}.interval;  // seconds between samples
  int64_t gpus = 0;                                   // with gpu_hourly_cost: the waits are priced
  double gpu_hourly_cost = -1;                        // < 0: not given
  std::string compare;            // an earlier run directory to compare with, or ""
  std::string out;                // the run directory; "": zerowait-watch-<unix time>
  std::vector<std::string> argv;  // zerowait's own command line, for run.json
};

struct WatchResult {
  WatchRun run;         // as written to out_dir
  std::string out_dir;  // where the run directory was written
  double t0 = 0;        // CLOCK_MONOTONIC seconds when watching began (drops are timed from it)
  int exit_code = 0;    // the job's exit status (128 + N when signal N ended it); 0 with a pid
};

// Watches until the job exits (or, following a pid, until it exits or SIGINT/SIGTERM arrives),
// then writes the run directory. While it runs, SIGINT and SIGTERM are handled: a started job
// gets them too (unless the terminal already sent them to its process group), and it starts
// with default signal handling and an empty signal mask.
//
// Errors (nothing is started): invalid_argument for both or neither of command and pid, gpus
// without gpu_hourly_cost or the reverse, a pid that is not running, an `out` that already holds
// a run.json; read_run_figures' errors for `compare`; a command that cannot be executed. After
// the job ran: the sampler's and write_watch_run's errors.
Result<WatchResult> watch_job(const WatchOptions& options);

}  // namespace zerowait::observe
