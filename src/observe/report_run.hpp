// A run directory (docs/observe.md, schema "zerowait.run/1") as the report reads it. Optional
// fields may be absent or null in the files; here they are std::nullopt or empty.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "observe/run/run_json.hpp"
#include "zerowait/observe/report.hpp"

namespace zerowait::observe {

struct RunAu {
  double value = 0;
  std::optional<double> floor;
  std::optional<bool> pass;
  std::optional<double> steps;
  std::string rule;
};

struct RunCost {
  std::optional<double> gpus;
  std::optional<double> gpu_hourly_cost;
  std::map<std::string, double> per_day;
  std::map<std::string, double> per_year;
  std::optional<double> wait_per_day;
  std::optional<double> wait_per_year;
};

struct RunComparison {
  std::string before;
  std::optional<double> saving_share;
  std::optional<double> saving_per_day;
  std::optional<double> saving_per_year;
};

struct RunEvent {
  double t = 0;
  std::string what;
  std::string before;
};

// One configuration of an emulate run.
struct RunRow {
  std::string input;
  std::optional<double> accelerators;
  std::optional<double> au;
  std::optional<double> floor;
  std::optional<bool> pass;
  std::optional<double> samples_per_s;
  std::optional<double> mb_per_s;
  std::map<std::string, double> shares;  // by cause, when the producer gives them
};

struct RunInfo {
  std::string kind;
  std::string title;
  std::vector<std::string> command;
  std::optional<double> started_unix;
  std::optional<double> duration_s;
  std::vector<std::string> causes;  // the drawing order
  std::map<std::string, double> seconds;
  std::map<std::string, double> shares;  // of wall time; from seconds when run.json has none
  std::string verdict;
  std::optional<RunAu> au;
  std::optional<double> samples_per_s;
  std::optional<double> mb_per_s;
  std::optional<RunCost> cost;
  std::optional<RunComparison> comparison;
  std::vector<RunEvent> events;
  std::vector<RunRow> rows;
  std::optional<std::vector<ReportFinding>> doctor;
  // run.json's `advice`: each one's summary, the change that follows the verdict
  std::vector<std::string> advice;
};

struct StepRecord {
  int64_t step = 0;
  int64_t rank = 0;
  double t = 0;
  double wall = 0;
  std::vector<double> buckets;  // seconds, one per RunInfo::causes entry
  int64_t steps = 1;            // consecutive steps the row covers (a profiler's merged rows)
};

struct DiskRecord {
  std::string name;
  std::optional<double> busy;
  std::optional<double> queue;
};

struct SystemRecord {
  double t = 0;
  std::optional<double> cpu;
  std::optional<double> proc_cpu;
  std::optional<double> rss;
  std::optional<double> mem_available;
  std::optional<double> read_bps;
  std::optional<double> write_bps;
  std::optional<double> gpu_util;
  std::vector<DiskRecord> disks;
  std::string main;  // watch only: what the main thread was doing; "" when absent
};

struct RunRecord {
  std::string dir;
  RunInfo info;
  std::vector<StepRecord> steps;      // empty without steps.jsonl
  std::vector<SystemRecord> system;   // empty without system.jsonl
  std::vector<std::string> notes;     // what was left out, said on the page
};

// Reads run.json, and steps.jsonl and system.jsonl when they exist. Blank lines are skipped; a
// last line without its newline that does not parse (a producer still writing, or killed) is
// left out with a note; any other bad line is an error naming the file, line and field.
Result<RunRecord> read_run_directory(const std::string& dir);

}  // namespace zerowait::observe
