// fio's side of `zerowait bench storage`: running it (a child process with a deadline), its
// environment and arguments, and reading its JSON into the same counts as zerowait's side.
#pragma once

#include <atomic>
#include <string>
#include <string_view>
#include <vector>

#include "diagnose/bench/storage_run.hpp"

namespace zerowait::internal::bench {

struct ProcessOutput {
  int exit_code = -1;  // or 128 + signal
  std::string out;
  std::string err;
};

// Runs argv[0] (found on PATH) with stdin from /dev/null and `env` (empty: this process's),
// collecting stdout and stderr. Kills it (kCancelled) when `stop` is set and
// (kDeadlineExceeded) after `timeout_s`. kNotFound when it cannot be started.
Result<ProcessOutput> run_process(const std::vector<std::string>& argv, double timeout_s,
                                  const std::atomic<bool>* stop,
                                  const std::vector<std::string>& env);

// This process's environment with glibc's malloc asked for transparent huge pages.
std::vector<std::string> fio_environment();
// `path` with its ':' escaped (fio separates file names with ':').
std::string fio_file_name(const std::string& path);
// `seconds` as fio's time argument, in whole milliseconds (at least 1).
std::string fio_time(double seconds);
// The last `max_chars` of `text`, "..." in front when cut.
std::string tail(const std::string& text, size_t max_chars);

// One fio run's side of a job. With --output-format=json+ fio lists every completion time it
// binned, so that runs merge exactly and their percentiles come from the same function as
// zerowait's; without the bins, fio's own percentiles.
struct FioRun {
  RawRun raw;
  bool binned = false;
  JobMeasurement reported;

  JobMeasurement summary() const { return binned ? raw.summary() : reported; }
};

// One fio run's JSON (--output-format=json+). kCorrupt naming what is missing.
Result<FioRun> parse_fio_run(std::string_view output, StoragePattern pattern);
// Runs fio on `job` over `file`. kIo with fio's output when it fails; run_process's errors.
Result<FioRun> run_fio_job(const std::string& fio_command, const StorageJob& job,
                           const std::string& file, uint64_t size, double runtime_s, double ramp_s,
                           const std::atomic<bool>* stop);
// Several fio runs of one job as one measurement.
JobMeasurement merge_fio_runs(const std::vector<FioRun>& runs);

}  // namespace zerowait::internal::bench
