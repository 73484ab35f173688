// From a watched run's samples to what run.json says about it: each cause's seconds and share,
// the verdict, and the moments utilisation dropped with what the system did just before
// (docs/observe.md, "How watch attributes").
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "zerowait/observe/system_sampler.hpp"

namespace zerowait::observe {

// The thresholds, one source of truth (docs/observe.md quotes them).
struct AttributionRules {
  double bound_share = 0.25;          // a wait this large names the verdict "<cause>-bound"
  double compute_bound_share = 0.6;   // else compute this large: "compute-bound"
  double window_s = 1.0;              // drops are looked for in windows this long
  double drop_fraction = 0.5;         // a window below this x the run's median is a drop...
  double drop_min_median = 0.2;       // ...when the median is at least this
  double lookback_s = 2.0;            // what happened this long before a drop's window
  double write_burst_factor = 4.0;    // write_bps above this x the run's median...
  double write_burst_min_bps = 16.0 * 1024 * 1024;  // ...and at least this is a burst
  size_t min_window_samples = 3;      // fewer samples say nothing about a window
};

struct DropEvent {
  double t = 0;        // the window's start, CLOCK_MONOTONIC seconds
  std::string what;    // "compute share fell from 0.92 to 0.20"
  std::string before;  // "disk queue 131 on vda; 3 threads blocked on I/O"
  double depth = 0;    // how far below the median (for ordering: deepest first)
};

struct Attribution {
  double duration_s = 0;                  // first to last sample
  std::map<std::string, double> seconds;  // cause -> share x duration
  std::map<std::string, double> shares;   // cause -> share of the samples with `main`
  std::string verdict;
  std::vector<DropEvent> events;          // in time order
  size_t classified = 0;                  // samples with `main`
};

// "input-bound" when input is the largest of input/checkpoint/h2d/communication and its share
// >= bound_share (likewise the others); else "compute-bound" when compute >=
// compute_bound_share; else "unknown". The one rule of every producer (profile, watch, emulate).
std::string verdict_of(const std::map<std::string, double>& shares,
                       const AttributionRules& rules = {});

// Windows of `window_s` from the first sample; each one's value is the mean gpu_util when the run
// has it, else its compute share. A window below drop_fraction x the median of the windows (when
// that median >= drop_min_median) is an event, explained from the samples from lookback_s before
// the window to its end: the deepest disk queue and its device, swap-in, threads blocked on I/O,
// a write burst.
std::vector<DropEvent> find_drops(const std::vector<SystemSample>& samples,
                                  const AttributionRules& rules = {});

// Shares, verdict and drops of a run that lasted `duration_s` (its wall time; 0: from the first
// sample to the last). No sample with `main`: every share 0 and verdict "unknown".
Attribution attribute(const std::vector<SystemSample>& samples, double duration_s,
                      const AttributionRules& rules = {});

}  // namespace zerowait::observe
