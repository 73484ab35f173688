// Storage baselines for `zerowait bench storage`: O_DIRECT sequential writes and reads and random
// reads of one test file, through io_uring and through pread/pwrite, each job measured beside
// fio's run of the same job on the same file in the same invocation.
//
// Why side by side: the disk under a VM varies about 2x from minute to minute, so a bare number
// says little; the ratio to fio, measured seconds apart, says whether zerowait's engines reach
// what the storage gives. Each job alternates the two sides in slices, zerowait first and last
// (storage_bench_cycles), so that a drift during the job (linear in time) weighs the same on
// both sides and a burst of a few seconds is likely to touch both.
//
// Both sides' requests reach the device in the same shape, fio running with its defaults:
// buffers in 4 KiB pages faulted in by the first request (see IoBuffer in the .cpp for what huge
// pages, pre-faulting or registered buffers change), each request submitted as soon as it is
// prepared (fio's iodepth_batch=1), latency counted from submission to completion (fio's clat).
//
// Library code: nothing is printed; progress goes to a callback.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

enum class StoragePattern { kSeqWrite, kSeqRead, kRandRead };
// kIoUring: one thread keeps `depth` requests in flight on a ring (fio's io_uring, iodepth=N).
// kPsync: `depth` threads, each with one synchronous pread/pwrite at a time (fio's psync,
// numjobs=N).
enum class StorageEngine { kIoUring, kPsync };

// fio's --rw name: "write", "read", "randread".
const char* storage_pattern_rw(StoragePattern pattern);
// fio's --ioengine name: "io_uring", "psync".
const char* storage_engine_name(StorageEngine engine);

// The queue depth of the sequential jobs: 4 x 1 MiB in flight saturates the virtual disk here
// (fio: 1.7-2.3 GB/s) without turning a sequential stream into what looks like random I/O.
inline constexpr unsigned kSequentialDepth = 4;
inline constexpr uint64_t kSequentialBlock = uint64_t{1} << 20;
// The test file's size is rounded down to a multiple of this (a block for each sequential
// stream), and must be at least this.
inline constexpr uint64_t kStorageBenchMinSize = kSequentialDepth * kSequentialBlock;
// Kept free on the filesystem beyond the test file and its 10 % margin.
inline constexpr uint64_t kStorageBenchReserve = uint64_t{1} << 30;

struct StorageJob {
  StoragePattern pattern = StoragePattern::kSeqRead;
  uint64_t block_size = kSequentialBlock;
  unsigned depth = 1;
  StorageEngine engine = StorageEngine::kIoUring;

  // "randread-4k-qd32-io_uring": unique within a plan; also the fio job's --name.
  std::string name() const;
};

// One side's numbers for one job over its measured time (the ramp left out).
struct JobMeasurement {
  uint64_t bytes = 0;
  uint64_t ios = 0;
  double seconds = 0;
  // Per-request completion time (submission to completion; fio's clat), microseconds.
  double p50_us = 0;
  double p99_us = 0;
  double p999_us = 0;

  double mb_s() const { return seconds > 0 ? double(bytes) / seconds / 1e6 : 0; }  // decimal
  double iops() const { return seconds > 0 ? double(ios) / seconds : 0; }
};

struct StorageJobResult {
  StorageJob job;
  JobMeasurement zerowait;
  std::optional<JobMeasurement> fio;  // none with --no-fio or without fio

  // zerowait's MB/s over fio's; none without fio's number.
  std::optional<double> ratio_mb_s() const;
};

struct StorageBenchOptions {
  std::string dir;  // where the test file goes: a directory on the storage to measure
  uint64_t size = uint64_t{1} << 30;
  double runtime_s = 3;  // per job and side, after the ramps (storage_ramp_seconds)
  std::vector<unsigned> random_depths = {1, 32};
  bool use_fio = true;  // run fio beside each job when `fio_command` runs
  std::string fio_command = "fio";
  // Set (from a signal handler) to stop: the running job ends, fio is killed, the test file is
  // removed and run_storage_bench returns kCancelled. May be null.
  const std::atomic<bool>* stop = nullptr;
  // "job 3/12 randread-4k-qd1-io_uring: fio" before each step. Called on the calling thread.
  std::function<void(const std::string& message)> progress;
};

struct StorageBenchReport {
  std::string dir;
  std::string file;  // the test file's path (removed by the time the report is returned)
  uint64_t size = 0;
  double runtime_s = 0;
  double ramp_s = 0;
  unsigned fio_slices = 0;  // fio runs per job (storage_bench_cycles); 0 without fio
  std::string fio_version;  // "fio-3.33"; empty when fio did not run
  // What was left out and why: "fio not run (--no-fio)", io_uring jobs skipped where the
  // kernel or a sandbox refuses io_uring.
  std::vector<std::string> notes;
  std::vector<StorageJobResult> jobs;
};

// The ramp before each measured slice: a fifth of the runtime, at most half a second.
double storage_ramp_seconds(double runtime_s);

// How many fio slices a job of `runtime_s` per side is cut into: fio runs C times for
// runtime/C each, zerowait C + 1 times (runtime/2C first and last, runtime/C between), in
// alternation. One per 1.5 s of runtime, from 1 to 4.
unsigned storage_bench_cycles(double runtime_s);

// The jobs, in the order they run: sequential read, 4 KiB and 128 KiB random reads at each of
// `random_depths`, then sequential write (last: the host of a virtual disk writes back what it
// cached long after, which would slow the reads); each through io_uring, then psync.
// kInvalidArgument for an empty list or a depth of 0 or above 1024.
Result<std::vector<StorageJob>> plan_storage_jobs(const std::vector<unsigned>& random_depths);

// The free space bench storage needs for a test file of `size` bytes: size + 10 % + 1 GiB.
uint64_t storage_bench_required_bytes(uint64_t size);

// Checks `dir` before anything is written: it is a directory (kNotFound / kInvalidArgument), has
// storage_bench_required_bytes(size) available to this user (statvfs f_bavail; kResourceExhausted
// naming both numbers and --size), and accepts O_DIRECT (kUnsupported naming the directory).
Status check_storage_bench_dir(const std::string& dir, uint64_t size);

// fio's version ("fio-3.33") from `fio_command --version`; kNotFound when it cannot be run.
Result<std::string> fio_version(const std::string& fio_command);

// The numbers of fio's --output-format=json (or json+) for a job run with --group_reporting:
// the read or write side (by `pattern`) of its first job; the percentiles computed from
// clat_ns.bins as zerowait computes its own where json+ gives them, else fio's clat_ns
// percentiles. Text before the JSON (fio's warnings) is skipped. kCorrupt when the JSON or a
// field is missing; kIo when fio reports an error in the job.
Result<JobMeasurement> parse_fio_json(std::string_view output, StoragePattern pattern);

// The fio command line (after the program name) that runs `job` on `file` of `size` bytes for
// `runtime_s` after `ramp_s`, JSON (json+) on stdout.
std::vector<std::string> fio_job_arguments(const StorageJob& job, const std::string& file,
                                           uint64_t size, double runtime_s, double ramp_s);

// Runs `job` with zerowait's own engine on `fd` (open O_RDWR | O_DIRECT, `size` bytes, a multiple
// of the job's block size) for `ramp_s` and then `runtime_s`, stopping early when `stop` is set
// (kCancelled). Errors name `path` and the offset.
Result<JobMeasurement> run_storage_job(int fd, const std::string& path, uint64_t size,
                                       const StorageJob& job, double ramp_s, double runtime_s,
                                       const std::atomic<bool>* stop = nullptr);

// The whole benchmark: checks `dir` (check_storage_bench_dir), creates
// dir/.zerowait-bench-<pid>, fills it, runs every planned job (the sides alternating) and
// removes the file, also on error or when stopped. Errors: those of the checks, I/O
// errors naming the file and offset, fio's failure with its stderr, kCancelled when stopped.
Result<StorageBenchReport> run_storage_bench(const StorageBenchOptions& options);

}  // namespace zerowait
