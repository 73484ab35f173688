// What both sides of `zerowait bench storage` share (storage_bench.cpp runs them): the limits
// of a job, the clock, the latency histogram and one run's counts, and zerowait's own side of a
// job (storage_run.cpp: io_uring and pread engines at fio's depths).
#pragma once

#include <time.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/diagnose/storage_bench.hpp"

namespace zerowait::internal::bench {

inline constexpr unsigned kMaxDepth = 1024;
inline constexpr double kMaxRamp = 0.5;
// fio's slices of a job are at least this long (each costs a start and a ramp), and there are
// at most kMaxCycles of them.
inline constexpr double kMinFioSlice = 1.5;
inline constexpr unsigned kMaxCycles = 4;
// fio starts its threads and lays nothing out (the file is written already): a run that takes
// this much longer than asked has hung.
inline constexpr double kFioGraceSeconds = 60;
// A child asked to stop (SIGTERM) is killed after this long.
inline constexpr double kTermGraceSeconds = 5;

inline uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

inline uint64_t to_ns(double seconds) { return uint64_t(std::llround(seconds * 1e9)); }

inline bool stopped(const std::atomic<bool>* stop) {
  return stop != nullptr && stop->load(std::memory_order_relaxed);
}

inline Status cancelled() { return Status(ErrorCode::kCancelled, "stopped by a signal"); }

inline std::string gib_text(uint64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(uint64_t{1} << 30));
  return std::to_string(bytes) + " bytes (" + text + ")";
}

inline std::string size_suffix(uint64_t bytes) {
  if (bytes % (uint64_t{1} << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes % 1024 == 0) return std::to_string(bytes >> 10) + "k";
  return std::to_string(bytes);
}

// Completion times in log-linear buckets (as HdrHistogram and fio keep them): 128 buckets per
// power of two, so a percentile is within 0.4 % of the exact value, in bounded memory whatever
// the run's length.
class LatencyHistogram {
 public:
  void add(uint64_t ns, uint64_t count = 1) {
    counts_[bucket(ns)] += count;
    count_ += count;
  }
  void merge(const LatencyHistogram& other) {
    for (size_t i = 0; i < kBuckets; ++i) counts_[i] += other.counts_[i];
    count_ += other.count_;
  }
  uint64_t count() const { return count_; }
  // The smallest value at or below which `percent` % of the samples lie (its bucket's middle);
  // 0 when empty.
  double percentile_ns(double percent) const {
    if (count_ == 0) return 0;
    const auto rank = std::max<uint64_t>(1, uint64_t(std::ceil(percent / 100.0 * double(count_))));
    uint64_t seen = 0;
    for (size_t i = 0; i < kBuckets; ++i) {
      seen += counts_[i];
      if (seen >= rank) return middle(i);
    }
    return middle(kBuckets - 1);
  }

 private:
  static constexpr unsigned kSubBits = 7;
  static constexpr uint64_t kLinear = uint64_t{2} << kSubBits;  // exact below this
  // Values of bit width 9 to 64 take shifts 1 to 56, buckets from 256 to 57 * 128 + 127.
  static constexpr size_t kBuckets = (64 - kSubBits + 1) << kSubBits;

  static size_t bucket(uint64_t ns) {
    if (ns < kLinear) return size_t(ns);
    const unsigned shift = unsigned(std::bit_width(ns)) - (kSubBits + 1);
    return ((shift + 1) << kSubBits) + size_t((ns >> shift) - (uint64_t{1} << kSubBits));
  }
  static double middle(size_t index) {
    if (index < kLinear) return double(index);
    const unsigned shift = unsigned(index >> kSubBits) - 1;
    const uint64_t low = ((index & ((1u << kSubBits) - 1)) + (uint64_t{1} << kSubBits)) << shift;
    return double(low) + double((uint64_t{1} << shift) - 1) / 2.0;
  }

  std::vector<uint64_t> counts_ = std::vector<uint64_t>(kBuckets);
  uint64_t count_ = 0;
};

// What one run counted: requests that completed inside the measured window.
struct RawRun {
  uint64_t bytes = 0;
  uint64_t ios = 0;
  double seconds = 0;
  uint64_t last_counted_ns = 0;  // when the last counted request completed
  LatencyHistogram latency;

  // Adds another run of the same job (its time too).
  void merge(const RawRun& other) {
    bytes += other.bytes;
    ios += other.ios;
    seconds += other.seconds;
    last_counted_ns = std::max(last_counted_ns, other.last_counted_ns);
    latency.merge(other.latency);
  }
  JobMeasurement summary() const {
    return {bytes,
            ios,
            seconds,
            latency.percentile_ns(50) / 1e3,
            latency.percentile_ns(99) / 1e3,
            latency.percentile_ns(99.9) / 1e3};
  }
};

// When a run counts and stops. Completions before `measure_from` are the ramp; none start after
// `end`, except while a stream has counted nothing: on a machine too busy to complete one
// request inside a short window (seen under the sanitizers with tests running in parallel), a
// run measures that one request rather than none. `one_pass`: each stream stops once it has
// covered its range (the fill).
struct RunWindow {
  uint64_t measure_from = 0;
  uint64_t end = std::numeric_limits<uint64_t>::max();
  bool one_pass = false;

  // Whether a stream whose counts are `run` may start another request at `now`.
  bool open(const RawRun& run, uint64_t now) const { return now < end || run.ios == 0; }
  void record(RawRun& run, uint64_t block, uint64_t started, uint64_t finished) const {
    if (finished < measure_from || (finished >= end && run.ios > 0)) return;
    run.bytes += block;
    ++run.ios;
    run.latency.add(finished - started);
    run.last_counted_ns = std::max(run.last_counted_ns, finished);
  }
  // The measured time: to the window's end, or to the one request counted after it.
  double seconds(const RawRun& run, uint64_t now) const {
    return double(std::max(std::min(now, end), run.last_counted_ns) - measure_from) / 1e9;
  }
};

// zerowait's side of `job` on the open file `fd` (`path` names it in errors) of `size` bytes:
// io_uring at job.depth requests in flight, or job.depth threads of pread/pwrite, counted inside
// `window`. kCancelled once `stop` is set; kIo naming the path and offset of a failed request.
Result<RawRun> run_job_raw(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                           const RunWindow& window, const std::atomic<bool>* stop);
// The psync engine alone (the fill writes the test file with it).
Result<RawRun> run_psync(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                         const RunWindow& window, const std::atomic<bool>* stop);
// A window that ramps for `ramp_s` from now, then counts for `runtime_s`.
RunWindow timed_window(double ramp_s, double runtime_s);

}  // namespace zerowait::internal::bench
