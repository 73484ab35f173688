// The doctor's per-file cost probe: on a sample of a tree's files, the open+fstat+close a shard
// read does not pay and the whole open+fstat+read+close, within a time budget that holds even
// when a read never returns (a hung NFS or FUSE mount).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace zerowait::doctor {

struct PerFileCost {
  size_t files = 0;  // measured in full
  double overhead_seconds = 0;
  double total_seconds = 0;
  // A file whose open, fstat or read had not returned at the deadline: abandoned ("" none).
  std::string stalled_file;
  double stalled_seconds = 0;  // how long it had been waiting when abandoned
};

// Measures up to 200 of `files` (evenly spread, 64 MiB in all; `sizes` beside them), starting
// none after `max_seconds`, and returns by `max_seconds` + `grace_seconds` whatever happens: the
// reads run in a child process, which is killed and left to the kernel if a read outlasts that
// (a thread would not do: one blocked in such a read holds up the whole process's exit).
// Both costs come from one pass with the clock read between the steps, so both see the same
// cache state (two passes would warm the second's metadata). Nothing measured when the child
// cannot be started.
PerFileCost measure_per_file_cost(const std::vector<std::string>& files,
                                  const std::vector<uint64_t>& sizes, double max_seconds,
                                  double grace_seconds = 0.25);

}  // namespace zerowait::doctor
