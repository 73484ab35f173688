// The system sampler: what the machine and one process tree were doing, every `interval`
// seconds: CPU, memory, swap, the tree's storage I/O, each whole disk's busy share, queue and
// latency, the tree's threads by state, and GPU utilisation through NVML when present. One
// sample is one line of a run directory's system.jsonl (docs/observe.md).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::observe {

struct DiskRates {
  double busy = 0;                 // share of the interval with I/O in flight (io_ticks)
  double queue = 0;                // mean requests in flight (weighted io ticks / interval)
  std::optional<double> await_ms;  // mean ms per completed request; none completed: nullopt
  double read_bps = 0;
  double write_bps = 0;
};

struct ThreadStates {
  int running = 0;   // R
  int io = 0;        // D (uninterruptible: waiting on storage, page faults)
  int sleeping = 0;  // everything else
};

struct SystemSample {
  double t = 0;                 // CLOCK_MONOTONIC seconds, at the end of the interval: when
                                // the main thread was read
  double cpu = 0;               // the machine's busy share, 0-1
  double proc_cpu = 0;          // CPUs the process tree used (1.0 = one CPU)
  uint64_t rss = 0;             // bytes, summed over the tree's processes
  uint64_t mem_available = 0;   // bytes (MemAvailable)
  double swap_in = 0;           // pages per second
  double swap_out = 0;
  double read_bps = 0;          // the tree's storage reads (/proc/PID/io read_bytes)
  double write_bps = 0;
  std::map<std::string, DiskRates> disk;  // whole block devices only
  ThreadStates threads;
  std::optional<double> gpu_util;  // mean SM utilisation of every GPU, 0-1; no NVML: nullopt
  std::optional<uint64_t> gpu_mem;  // bytes of GPU memory in use, every GPU; no NVML: nullopt
  // watch only: the main thread's activity; unset once the thread has exited
  std::optional<std::string> main;
  bool has_children = false;        // the process had child processes (not in system.jsonl)
  // watch only, not in system.jsonl: the job's data pipeline was running (child processes, or
  // zerowait loader threads); what came before the first such sample is the job's start-up
  bool pipeline = false;
  // watch only, not in system.jsonl: the process's direct children (a DataLoader's workers)
  // and the CPUs their subtree used (1.0 = one CPU)
  int children = 0;
  double children_cpu = 0;
  // watch only, not in system.jsonl: the main thread's input was its own work (unpickling a
  // batch), which more workers would not take off it
  bool main_receiving = false;
};

// The sample as one line of system.jsonl: a JSON object without a trailing newline.
std::string to_json(const SystemSample& sample);

struct SystemSamplerOptions {
  pid_t pid = 0;          // the process tree's root; 0: this process
  double interval = 0.1;  // seconds between samples
  std::string root;       // read /proc and /sys under this prefix (a fixture tree); "": live
  bool main_thread = false;  // classify the pid's main thread into SystemSample::main
  // The samples kept, so that a sampler beside a job of days holds megabytes, not gigabytes.
  // When the thread has taken this many, each two neighbours become one (compact_samples) and
  // the interval doubles: the samples stay evenly spaced, covering the whole run.
  size_t max_samples = 20000;

  // An interval that is not > 0 (or not finite), or max_samples < 2: invalid_argument.
  Status validate() const;
};

// Halves `samples` by merging neighbours 0+1, 2+3...; `start` is where the first sample's
// interval began. Rates (CPU, I/O, swap, disk, GPU) are averaged over the merged interval;
// point readings (memory, GPU memory, thread states, the main thread) are the later sample's, which keeps
// shares counted over samples unbiased, as a sampling profiler's are. An odd last one stays.
void compact_samples(std::vector<SystemSample>& samples, double start);

// Reads the files, keeps the previous reading, and turns two readings into a sample; a sampler
// thread does that every interval. Missing files (no /proc/PID/io, an exited process, no
// diskstats) leave their fields at zero and never fail a sample. Thread-safe: start(), stop()
// and samples() may be called from any thread.
class SystemSampler {
 public:
  explicit SystemSampler(SystemSamplerOptions options);
  ~SystemSampler();  // stops the thread
  SystemSampler(const SystemSampler&) = delete;
  SystemSampler& operator=(const SystemSampler&) = delete;

  // One reading at time `t` (seconds). Returns the sample of the interval since the previous
  // reading; the first reading only sets the baselines and returns nullopt. Not to be mixed
  // with a running thread.
  std::optional<SystemSample> take(double t);
  // With main_thread, on a live system, for a process with children: a look at the main
  // thread a few milliseconds before the next take(), which then judges a running thread by
  // what it did on both sides of the sample. The thread calls it before each reading.
  void look_back();

  // Starts the thread that takes a reading now and then every interval (doubled at each
  // compaction, see max_samples). Errors: an interval that is not > 0 or max_samples < 2
  // (invalid_argument), already started, the thread could not start.
  Status start();
  // Takes a last reading and joins the thread; a no-op when not running.
  void stop();
  bool running() const;
  // Every sample so far, in order (at most max_samples).
  std::vector<SystemSample> samples() const;
  // The interval the thread samples at now: `interval`, doubled at each compaction.
  double current_interval() const;
  // With main_thread: whether some sample classified the main thread from its state alone,
  // because its /proc/PID/task/TID/syscall was unreadable (no ptrace rights over the process).
  bool degraded() const;

  const SystemSamplerOptions& options() const { return options_; }

 private:
  struct State;
  SystemSamplerOptions options_;
  std::unique_ptr<State> state_;
};

// CLOCK_MONOTONIC now, in seconds (Python's time.monotonic()).
double monotonic_seconds();

}  // namespace zerowait::observe
