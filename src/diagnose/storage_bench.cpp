#include "zerowait/diagnose/storage_bench.hpp"

#include <fcntl.h>
#include <liburing.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>
#include <utility>

#include "common/align.hpp"
#include "common/file.hpp"
#include "common/random.hpp"
#include "zerowait/storage/byte_source.hpp"

extern char** environ;

namespace zerowait {
namespace {

using internal::File;

constexpr unsigned kMaxDepth = 1024;
constexpr double kMaxRamp = 0.5;
// fio's slices of a job are at least this long (each costs a start and a ramp), and there are
// at most kMaxCycles of them.
constexpr double kMinFioSlice = 1.5;
constexpr unsigned kMaxCycles = 4;
// fio starts its threads and lays nothing out (the file is written already): a run that takes
// this much longer than asked has hung.
constexpr double kFioGraceSeconds = 60;
// A child asked to stop (SIGTERM) is killed after this long.
constexpr double kTermGraceSeconds = 5;

uint64_t now_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1'000'000'000u + uint64_t(ts.tv_nsec);
}

uint64_t to_ns(double seconds) { return uint64_t(std::llround(seconds * 1e9)); }

bool stopped(const std::atomic<bool>* stop) {
  return stop != nullptr && stop->load(std::memory_order_relaxed);
}

Status cancelled() { return Status(ErrorCode::kCancelled, "stopped by a signal"); }

std::string gib_text(uint64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof text, "%.1f GiB", double(bytes) / double(uint64_t{1} << 30));
  return std::to_string(bytes) + " bytes (" + text + ")";
}

std::string size_suffix(uint64_t bytes) {
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

// The offsets one stream asks for: sequential through [begin, begin + length) (wrapping), or
// uniform over its blocks (xoshiro256**: a few ns per offset).
class OffsetStream {
 public:
  OffsetStream(const StorageJob& job, uint64_t begin, uint64_t length, uint64_t seed)
      : random_(job.pattern == StoragePattern::kRandRead),
        block_(job.block_size),
        begin_(begin),
        blocks_(length / job.block_size),
        rng_(seed) {}

  uint64_t next() {
    if (random_) return begin_ + rng_.below(blocks_) * block_;
    const uint64_t offset = begin_ + position_ * block_;
    if (++position_ == blocks_) {
      position_ = 0;
      wrapped_ = true;
    }
    return offset;
  }
  // A sequential stream has handed out every block once.
  bool wrapped() const { return wrapped_; }

 private:
  bool random_;
  uint64_t block_;
  uint64_t begin_;
  uint64_t blocks_;
  uint64_t position_ = 0;
  bool wrapped_ = false;
  internal::Rng rng_;
};

uint64_t fresh_seed(uint64_t stream) {
  return internal::combine_seed(now_ns(), uint64_t(::getpid()), stream);
}

// One run's request buffers, in transparent huge pages where the kernel gives them (fio gets
// the same through fio_environment() and --mem_align). Why it matters more than anything else
// here: the buffer's physical layout decides how many DMA segments a request takes. In 4 KiB
// pages a 1 MiB request is up to 256 segments (virtio-blk takes 254 per request), fewer only
// where pages happen to be physically adjacent, and fio's own 1 MiB reads measured 0.9 GB/s
// with no two adjacent pages in its buffer and 2.2 GB/s with 891 of 1023 adjacent, run to run.
// In huge pages a request is one segment and both sides read about 3 GB/s. Read buffers are
// faulted in before the clock starts; write buffers hold random bytes, not zeros, which some
// disks compress or skip.
class IoBuffer {
 public:
  IoBuffer() = default;
  IoBuffer(const IoBuffer&) = delete;
  IoBuffer& operator=(const IoBuffer&) = delete;
  ~IoBuffer() {
    if (mapping_ != nullptr) ::munmap(mapping_, mapping_size_);
  }

  Status allocate(size_t bytes, bool for_writes) {
    // A huge page needs an aligned 2 MiB range: map one more and start at the boundary.
    mapping_size_ = internal::align_up(bytes, kHugePage) + kHugePage;
    void* memory = ::mmap(nullptr, mapping_size_, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
      mapping_ = nullptr;
      return Status(ErrorCode::kResourceExhausted,
                    "cannot map " + std::to_string(mapping_size_) +
                        " bytes of request buffers: " + std::strerror(errno));
    }
    mapping_ = memory;
    data_ = reinterpret_cast<std::byte*>(
        internal::align_up(reinterpret_cast<uintptr_t>(memory), kHugePage));
    ::madvise(data_, internal::align_up(bytes, kHugePage), MADV_HUGEPAGE);  // only a hint
    if (for_writes) {
      internal::Rng rng(fresh_seed(bytes));
      auto* words = reinterpret_cast<uint64_t*>(data_);
      for (size_t i = 0; i < bytes / 8; ++i) words[i] = rng.next();
    } else {
      std::memset(data_, 0, bytes);
    }
    return Status::ok();
  }
  std::byte* data() const { return data_; }

 private:
  static constexpr size_t kHugePage = size_t{2} << 20;
  void* mapping_ = nullptr;
  size_t mapping_size_ = 0;
  std::byte* data_ = nullptr;
};

Status io_failure(const std::string& path, const StorageJob& job, uint64_t offset, long result) {
  const char* what = job.pattern == StoragePattern::kSeqWrite ? "cannot write" : "cannot read";
  if (result < 0) return errno_status(int(-result), what, path, (long long)offset);
  return io_error(std::string(what) + " '" + path + "' at offset " + std::to_string(offset) +
                  ": " + std::to_string(result) + " of " + std::to_string(job.block_size) +
                  " bytes transferred");
}

class Ring {
 public:
  Ring() = default;
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;
  ~Ring() {
    if (ready_) io_uring_queue_exit(&ring_);
  }
  int init(unsigned entries) {
    // Only this thread submits, and completions are posted when it waits for them (as fio sets
    // up its rings): no inter-processor interrupts.
    int rc = io_uring_queue_init(entries, &ring_,
                                 IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_DEFER_TASKRUN);
    if (rc == -EINVAL) rc = io_uring_queue_init(entries, &ring_, 0);  // before Linux 6.1
    ready_ = rc == 0;
    return rc;
  }
  io_uring* get() { return &ring_; }

 private:
  io_uring ring_{};
  bool ready_ = false;
};

// One thread, job.depth requests in flight: each completion starts the next request at once,
// the way fio's io_uring engine keeps its iodepth. Neither the file nor the buffers are
// registered with the ring, as fio's are not by default: in 4 KiB pages registration faults a
// buffer in a different physical order, and that moved MB/s more than registration saved.
Result<RawRun> run_io_uring(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                            const RunWindow& window, const std::atomic<bool>* stop) {
  const unsigned depth = job.depth;
  const size_t block = job.block_size;
  const bool writes = job.pattern == StoragePattern::kSeqWrite;
  IoBuffer buffers;  // declared before the ring: outlives every request in flight
  ZW_RETURN_IF_ERROR(buffers.allocate(depth * block, writes));
  Ring ring;
  if (const int rc = ring.init(depth); rc < 0) {
    return errno_status(-rc, "cannot set up an io_uring of depth " + std::to_string(depth) +
                                 " to measure", path);
  }

  OffsetStream offsets(job, 0, size, fresh_seed(0));
  struct Slot {
    uint64_t offset = 0;
    uint64_t started = 0;
  };
  std::vector<Slot> slots(depth);
  const auto prepare = [&](unsigned slot) {
    io_uring_sqe* sqe = io_uring_get_sqe(ring.get());  // never null: depth entries, depth slots
    const uint64_t offset = offsets.next();
    std::byte* buffer = buffers.data() + slot * block;
    const auto length = unsigned(block);
    if (writes) {
      io_uring_prep_write(sqe, fd, buffer, length, offset);
    } else {
      io_uring_prep_read(sqe, fd, buffer, length, offset);
    }
    io_uring_sqe_set_data64(sqe, slot);
    slots[slot].offset = offset;
  };

  RawRun run;
  Status error;
  const auto may_start = [&](uint64_t now) {
    return error.is_ok() && window.open(run, now) && !stopped(stop) &&
           !(window.one_pass && offsets.wrapped());
  };
  unsigned in_flight = 0;
  // Each request goes to the kernel as soon as it is prepared, as fio submits (iodepth_batch=1):
  // submitting the replacements of a whole batch of completions together measured 15 % fewer
  // 4 KiB IOPS at depth 32 here, the device's queue running short meanwhile.
  const auto issue = [&](unsigned slot) {
    prepare(slot);
    int rc = 0;
    do {
      rc = io_uring_submit(ring.get());
    } while (rc == -EINTR);
    if (rc < 0) {
      error = errno_status(-rc, "cannot submit an io_uring request while measuring", path);
      return;
    }
    slots[slot].started = now_ns();  // once the kernel has taken it, as fio's clat starts
    ++in_flight;
  };
  uint64_t now = now_ns();
  for (unsigned slot = 0; slot < depth && may_start(now); ++slot) issue(slot);
  while (in_flight > 0) {
    io_uring_cqe* cqe = nullptr;
    const int rc = io_uring_wait_cqe(ring.get(), &cqe);
    if (rc == -EINTR) continue;  // a signal: the stop flag is seen below
    if (rc < 0) {
      // The ring itself failed: nothing more can be reaped. The requests still in flight hold
      // their pages until they complete, whatever happens to the buffer here.
      return errno_status(-rc, "cannot wait for io_uring requests while measuring", path);
    }
    unsigned head = 0;
    unsigned seen = 0;
    // Submitting a replacement also posts completions that arrived meanwhile: the loop reads
    // the ring's tail again at every step, so they are reaped here too.
    io_uring_for_each_cqe(ring.get(), head, cqe) {
      ++seen;
      --in_flight;
      now = now_ns();
      const auto slot = unsigned(io_uring_cqe_get_data64(cqe));
      if (cqe->res != int(block)) {
        if (error.is_ok()) error = io_failure(path, job, slots[slot].offset, cqe->res);
        continue;
      }
      window.record(run, block, slots[slot].started, now);
      if (may_start(now)) issue(slot);
    }
    io_uring_cq_advance(ring.get(), seen);
  }
  if (!error.is_ok()) return error;
  run.seconds = window.seconds(run, now);
  return run;
}

// job.depth threads, each with one synchronous pread/pwrite at a time (fio's psync with
// numjobs=N). Sequential streams each take their own stripe of the file, as fio's
// offset_increment gives them; random ones each range over the whole file.
Result<RawRun> run_psync(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                         const RunWindow& window, const std::atomic<bool>* stop) {
  const unsigned threads = job.depth;
  const uint64_t block = job.block_size;
  const bool writes = job.pattern == StoragePattern::kSeqWrite;
  const bool random = job.pattern == StoragePattern::kRandRead;
  const uint64_t stripe = random ? size : internal::align_down(size / threads, block);
  std::vector<RawRun> runs(threads);
  std::mutex error_mutex;
  Status error;
  std::atomic<bool> failed{false};
  const auto fail = [&](Status status) {
    std::lock_guard lock(error_mutex);
    if (error.is_ok()) error = std::move(status);
    failed = true;
  };
  const auto work = [&](unsigned index) {
    IoBuffer buffer;
    if (Status s = buffer.allocate(block, writes); !s.is_ok()) return fail(std::move(s));
    OffsetStream offsets(job, random ? 0 : index * stripe, stripe, fresh_seed(index + 1));
    for (;;) {
      const uint64_t started = now_ns();
      if (!window.open(runs[index], started) || stopped(stop) ||
          failed.load(std::memory_order_relaxed) ||
          (window.one_pass && offsets.wrapped())) {
        return;
      }
      const uint64_t offset = offsets.next();
      ssize_t done = 0;
      do {
        done = writes ? ::pwrite(fd, buffer.data(), block, off_t(offset))
                      : ::pread(fd, buffer.data(), block, off_t(offset));
      } while (done < 0 && errno == EINTR);
      const uint64_t finished = now_ns();
      if (done != ssize_t(block)) {
        return fail(io_failure(path, job, offset, done < 0 ? -errno : done));
      }
      window.record(runs[index], block, started, finished);
    }
  };
  {
    std::vector<std::jthread> workers;
    workers.reserve(threads);
    for (unsigned i = 0; i < threads; ++i) workers.emplace_back(work, i);
  }  // joined
  if (!error.is_ok()) return error;
  RawRun run;
  for (const RawRun& r : runs) run.merge(r);  // the threads ran at the same time: one window
  run.seconds = window.seconds(run, now_ns());
  return run;
}

Result<RawRun> run_job_raw(int fd, const std::string& path, uint64_t size, const StorageJob& job,
                           const RunWindow& window, const std::atomic<bool>* stop) {
  Result<RawRun> run = job.engine == StorageEngine::kIoUring
                           ? run_io_uring(fd, path, size, job, window, stop)
                           : run_psync(fd, path, size, job, window, stop);
  if (stopped(stop)) return cancelled();
  return run;
}

RunWindow timed_window(double ramp_s, double runtime_s) {
  const uint64_t measure_from = now_ns() + to_ns(ramp_s);
  return {measure_from, measure_from + to_ns(runtime_s), false};
}

// ---- fio ------------------------------------------------------------------------------------

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
                                  const std::vector<std::string>& env) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0) return errno_status(errno, "cannot create a pipe for",
                                                             argv[0]);
  if (::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int err = errno;
    ::close(out_pipe[0]);
    ::close(out_pipe[1]);
    return errno_status(err, "cannot create a pipe for", argv[0]);
  }
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_adddup2(&actions, out_pipe[1], 1);
  posix_spawn_file_actions_adddup2(&actions, err_pipe[1], 2);
  std::vector<char*> args;
  for (const std::string& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  std::vector<char*> envp;
  for (const std::string& e : env) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  pid_t pid = 0;
  const int spawn_error = posix_spawnp(&pid, argv[0].c_str(), &actions, nullptr, args.data(),
                                       env.empty() ? environ : envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(out_pipe[1]);
  ::close(err_pipe[1]);
  File out_fd(out_pipe[0], "stdout of " + argv[0]);
  File err_fd(err_pipe[0], "stderr of " + argv[0]);
  if (spawn_error != 0) {
    return Status(ErrorCode::kNotFound,
                  "cannot run '" + argv[0] + "': " + std::strerror(spawn_error));
  }
  ProcessOutput result;
  const uint64_t deadline = now_ns() + to_ns(timeout_s);
  Status stop_reason;
  pollfd fds[2] = {{out_fd.fd(), POLLIN, 0}, {err_fd.fd(), POLLIN, 0}};
  std::string* sinks[2] = {&result.out, &result.err};
  int open_streams = 2;
  while (open_streams > 0) {
    if (stop_reason.is_ok() && stopped(stop)) stop_reason = cancelled();
    if (stop_reason.is_ok() && now_ns() > deadline) {
      stop_reason = Status(ErrorCode::kDeadlineExceeded,
                           "'" + argv[0] + "' did not finish within " +
                               std::to_string(int(timeout_s)) + " s");
    }
    if (!stop_reason.is_ok()) {
      ::kill(pid, SIGTERM);
      break;
    }
    if (::poll(fds, 2, 100) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char chunk[65536];
      const ssize_t n = ::read(fds[i].fd, chunk, sizeof chunk);
      if (n > 0) {
        sinks[i]->append(chunk, size_t(n));
      } else if (n == 0 || errno != EINTR) {
        fds[i].fd = -1;  // poll() skips negative descriptors
        --open_streams;
      }
    }
  }
  int wait_status = 0;
  if (!stop_reason.is_ok()) {
    // Its output is not wanted any more: closed pipes cannot block it on a write. A child that
    // ignores SIGTERM is killed after a grace period.
    out_fd = File();
    err_fd = File();
    const uint64_t give_up = now_ns() + to_ns(kTermGraceSeconds);
    pid_t reaped = 0;
    while ((reaped = ::waitpid(pid, &wait_status, WNOHANG)) == 0 && now_ns() < give_up) {
      ::usleep(10'000);
    }
    if (reaped == 0) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
      }
    }
    return stop_reason;
  }
  while (::waitpid(pid, &wait_status, 0) < 0 && errno == EINTR) {
  }
  // A Ctrl-C reaches the child too, which may end on its own before the flag is seen above.
  if (stopped(stop)) return cancelled();
  result.exit_code = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status)
                                            : 128 + WTERMSIG(wait_status);
  return result;
}

// fio's environment: this process's, with glibc's malloc asked to back large allocations with
// transparent huge pages (glibc >= 2.35; ignored elsewhere), so that fio's buffers are laid out
// as zerowait's (see IoBuffer). With --mem_align=2M they start on a huge page.
std::vector<std::string> fio_environment() {
  constexpr std::string_view kTunables = "GLIBC_TUNABLES=";
  std::vector<std::string> env;
  std::string tunables = std::string(kTunables) + "glibc.malloc.hugetlb=1";
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view entry(*e);
    if (entry.substr(0, kTunables.size()) == kTunables) {
      tunables += ":" + std::string(entry.substr(kTunables.size()));  // the caller's kept
    } else {
      env.emplace_back(entry);
    }
  }
  env.push_back(std::move(tunables));
  return env;
}

// fio reads ':' as a separator between file names; a literal one is escaped.
std::string fio_file_name(const std::string& path) {
  std::string escaped;
  for (char c : path) {
    if (c == ':') escaped += '\\';
    escaped += c;
  }
  return escaped;
}

std::string fio_time(double seconds) {
  return std::to_string(std::max<long long>(1, std::llround(seconds * 1e3))) + "ms";
}

std::string tail(const std::string& text, size_t max_chars) {
  return text.size() <= max_chars ? text : "..." + text.substr(text.size() - max_chars);
}

// One fio run's side of a job. With --output-format=json+ fio lists every completion time it
// binned, so that runs merge exactly and their percentiles come from the same function as
// zerowait's; without the bins, fio's own percentiles.
struct FioRun {
  RawRun raw;
  bool binned = false;
  JobMeasurement reported;

  JobMeasurement summary() const { return binned ? raw.summary() : reported; }
};

Result<FioRun> parse_fio_run(std::string_view output, StoragePattern pattern) {
  const size_t start = output.find('{');
  if (start == std::string_view::npos) {
    return corrupt("fio printed no JSON: " + tail(std::string(output), 500));
  }
  const nlohmann::json doc = nlohmann::json::parse(output.substr(start), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return corrupt("fio's JSON output cannot be parsed: " + tail(std::string(output), 500));
  }
  const auto jobs = doc.find("jobs");
  if (jobs == doc.end() || !jobs->is_array() || jobs->empty() || !(*jobs)[0].is_object()) {
    return corrupt("fio's JSON output has no \"jobs\"");
  }
  const nlohmann::json& job = (*jobs)[0];
  if (const auto err = job.find("error"); err != job.end() && err->is_number() && *err != 0) {
    const int code = err->get<int>();
    return io_error("fio reported error " + std::to_string(code) + " (" + std::strerror(code) +
                    ") in job " + job.value("jobname", std::string("?")));
  }
  const char* side_name = pattern == StoragePattern::kSeqWrite ? "write" : "read";
  const auto side = job.find(side_name);
  if (side == job.end() || !side->is_object()) {
    return corrupt(std::string("fio's JSON output has no \"") + side_name + "\" section");
  }
  const auto number = [&](const nlohmann::json& object, const char* key) -> std::optional<double> {
    const auto it = object.find(key);
    if (it == object.end() || !it->is_number()) return std::nullopt;
    return it->get<double>();
  };
  const std::optional<double> bytes = number(*side, "io_bytes");
  const std::optional<double> ios = number(*side, "total_ios");
  const std::optional<double> runtime_ms = number(*side, "runtime");
  if (!bytes || !ios || !runtime_ms) {
    return corrupt(std::string("fio's \"") + side_name +
                   "\" section lacks io_bytes, total_ios or runtime");
  }
  if (*ios <= 0 || *runtime_ms <= 0) {
    return corrupt(std::string("fio completed no ") + side_name + " in its run");
  }
  FioRun run;
  run.raw.bytes = uint64_t(*bytes);
  run.raw.ios = uint64_t(*ios);
  run.raw.seconds = *runtime_ms / 1e3;
  JobMeasurement& m = run.reported;
  m = {run.raw.bytes, run.raw.ios, run.raw.seconds};
  const nlohmann::json* percentiles = nullptr;
  if (const auto clat = side->find("clat_ns"); clat != side->end() && clat->is_object()) {
    if (const auto p = clat->find("percentile"); p != clat->end() && p->is_object()) {
      percentiles = &*p;
    }
    // json+ only: every completion time fio binned, as "<ns>": count.
    if (const auto bins = clat->find("bins"); bins != clat->end() && bins->is_object()) {
      for (const auto& [ns, count] : bins->items()) {
        if (!count.is_number_unsigned()) continue;
        run.raw.latency.add(std::strtoull(ns.c_str(), nullptr, 10), count.get<uint64_t>());
      }
      run.binned = run.raw.latency.count() > 0;
    }
  }
  const auto percentile_us = [&](const char* key) -> std::optional<double> {
    if (percentiles == nullptr) return std::nullopt;
    const std::optional<double> ns = number(*percentiles, key);
    return ns ? std::optional<double>(*ns / 1e3) : std::nullopt;
  };
  const auto p50 = percentile_us("50.000000");
  const auto p99 = percentile_us("99.000000");
  const auto p999 = percentile_us("99.900000");
  if (!p50 || !p99 || !p999) {
    return corrupt(std::string("fio's \"") + side_name +
                   "\" section lacks clat_ns percentiles 50, 99 and 99.9");
  }
  m.p50_us = *p50;
  m.p99_us = *p99;
  m.p999_us = *p999;
  return run;
}

Result<FioRun> run_fio_job(const std::string& fio_command, const StorageJob& job,
                           const std::string& file, uint64_t size, double runtime_s,
                           double ramp_s, const std::atomic<bool>* stop) {
  std::vector<std::string> argv = {fio_command};
  for (std::string& a : fio_job_arguments(job, file, size, runtime_s, ramp_s)) {
    argv.push_back(std::move(a));
  }
  ZW_ASSIGN_OR_RETURN(ProcessOutput output,
                      run_process(argv, ramp_s + runtime_s + kFioGraceSeconds, stop,
                                  fio_environment()));
  if (output.exit_code != 0) {
    return io_error("fio failed (exit status " + std::to_string(output.exit_code) + ") on job " +
                    job.name() + ": " + tail(output.err + output.out, 2000) +
                    " (rerun with --no-fio to measure without it)");
  }
  Result<FioRun> measured = parse_fio_run(output.out, job.pattern);
  if (!measured.is_ok()) return measured.status().with_context("fio job " + job.name());
  return measured;
}

// Several fio runs of one job as one: counts and time summed; percentiles from the merged bins,
// or, where fio gave none, its percentiles weighted by each run's requests (an approximation).
JobMeasurement merge_fio_runs(const std::vector<FioRun>& runs) {
  RawRun total;
  bool binned = true;
  double p50 = 0, p99 = 0, p999 = 0;
  for (const FioRun& run : runs) {
    total.merge(run.raw);
    binned = binned && run.binned;
    const double weight = double(run.reported.ios);
    p50 += run.reported.p50_us * weight;
    p99 += run.reported.p99_us * weight;
    p999 += run.reported.p999_us * weight;
  }
  JobMeasurement merged = total.summary();
  if (!binned && total.ios > 0) {
    merged.p50_us = p50 / double(total.ios);
    merged.p99_us = p99 / double(total.ios);
    merged.p999_us = p999 / double(total.ios);
  }
  return merged;
}

// Whether madvise(MADV_HUGEPAGE) can give huge pages ("always" or "madvise" selected).
bool huge_pages_enabled() {
  std::ifstream in("/sys/kernel/mm/transparent_hugepage/enabled");
  std::string modes;
  std::getline(in, modes);
  return modes.find("[always]") != std::string::npos ||
         modes.find("[madvise]") != std::string::npos;
}

// ---- the test file --------------------------------------------------------------------------

Status direct_unsupported(const std::string& dir, const std::string& detail) {
  return unsupported("the filesystem of '" + dir + "' does not accept O_DIRECT (" + detail +
                     "), which bench storage needs to measure the storage past the page cache "
                     "(tmpfs before Linux 6.6 and some FUSE filesystems refuse it); choose a "
                     "directory on the disk to measure");
}

// The test file, removed (unlinked) when this goes, whatever the path out. Its descriptor
// closes silently: the file is deleted, a failed close loses nothing.
class TestFile {
 public:
  static Result<TestFile> create(const std::string& dir) {
    const std::string path = dir + "/.zerowait-bench-" + std::to_string(::getpid());
    // O_EXCL: a file of that name is not ours to overwrite or remove.
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_DIRECT | O_CLOEXEC, 0600);
    if (fd < 0 && errno == EINVAL) return direct_unsupported(dir, std::strerror(errno));
    if (fd < 0) return errno_status(errno, "cannot create the test file", path);
    TestFile test;
    test.file_ = File(fd, path);
    test.path_ = path;
    return test;
  }
  TestFile() = default;
  TestFile(TestFile&& other) noexcept
      : file_(std::move(other.file_)), path_(std::exchange(other.path_, {})) {}
  TestFile& operator=(TestFile&&) = delete;
  TestFile(const TestFile&) = delete;
  ~TestFile() {
    file_ = File();
    if (!path_.empty()) ::unlink(path_.c_str());
  }

  int fd() const { return file_.fd(); }
  const std::string& path() const { return path_; }

 private:
  File file_;
  std::string path_;
};

}  // namespace

// ---- public -----------------------------------------------------------------------------------

const char* storage_pattern_rw(StoragePattern pattern) {
  switch (pattern) {
    case StoragePattern::kSeqWrite: return "write";
    case StoragePattern::kSeqRead: return "read";
    case StoragePattern::kRandRead: return "randread";
  }
  return "?";
}

const char* storage_engine_name(StorageEngine engine) {
  return engine == StorageEngine::kIoUring ? "io_uring" : "psync";
}

std::string StorageJob::name() const {
  return std::string(storage_pattern_rw(pattern)) + "-" + size_suffix(block_size) + "-qd" +
         std::to_string(depth) + "-" + storage_engine_name(engine);
}

std::optional<double> StorageJobResult::ratio_mb_s() const {
  if (!fio || fio->mb_s() <= 0) return std::nullopt;
  return zerowait.mb_s() / fio->mb_s();
}

double storage_ramp_seconds(double runtime_s) { return std::min(kMaxRamp, runtime_s / 5); }

unsigned storage_bench_cycles(double runtime_s) {
  return unsigned(std::clamp(std::floor(runtime_s / kMinFioSlice), 1.0, double(kMaxCycles)));
}

Result<std::vector<StorageJob>> plan_storage_jobs(const std::vector<unsigned>& random_depths) {
  if (random_depths.empty()) return invalid_argument("--depths needs at least one queue depth");
  for (unsigned depth : random_depths) {
    if (depth == 0 || depth > kMaxDepth) {
      return invalid_argument("queue depth " + std::to_string(depth) + " is out of range: give "
                              "--depths values from 1 to " + std::to_string(kMaxDepth));
    }
  }
  std::vector<StorageJob> jobs;
  const StorageEngine engines[] = {StorageEngine::kIoUring, StorageEngine::kPsync};
  for (StorageEngine engine : engines) {
    jobs.push_back({StoragePattern::kSeqRead, kSequentialBlock, kSequentialDepth, engine});
  }
  for (uint64_t block : {uint64_t{4} << 10, uint64_t{128} << 10}) {
    for (unsigned depth : random_depths) {
      for (StorageEngine engine : engines) {
        jobs.push_back({StoragePattern::kRandRead, block, depth, engine});
      }
    }
  }
  for (StorageEngine engine : engines) {
    jobs.push_back({StoragePattern::kSeqWrite, kSequentialBlock, kSequentialDepth, engine});
  }
  return jobs;
}

uint64_t storage_bench_required_bytes(uint64_t size) {
  return size + size / 10 + kStorageBenchReserve;
}

Status check_storage_bench_dir(const std::string& dir, uint64_t size) {
  struct stat info {};
  if (::stat(dir.c_str(), &info) != 0) return errno_status(errno, "cannot measure", dir);
  if (!S_ISDIR(info.st_mode)) {
    return invalid_argument("'" + dir + "' is not a directory: give a directory on the storage "
                            "to measure (the test file is created in it)");
  }
  struct statvfs space {};
  if (::statvfs(dir.c_str(), &space) != 0) {
    return errno_status(errno, "cannot read the free space (statvfs) of", dir);
  }
  const uint64_t available = uint64_t(space.f_bavail) * space.f_frsize;
  const uint64_t needed = storage_bench_required_bytes(size);
  if (available < needed || needed < size) {
    return Status(ErrorCode::kResourceExhausted,
                  "not enough free space in '" + dir + "': a test file of " + gib_text(size) +
                      " needs " + gib_text(needed) + " free (the file, 10 % more and 1 GiB "
                      "kept free), and " + gib_text(available) +
                      " are available; choose a smaller --size");
  }
  // An unnamed file tells without leaving anything behind; where O_TMPFILE itself is not
  // supported, creating the test file tells later.
  const int fd = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_DIRECT | O_CLOEXEC, 0600);
  if (fd >= 0) {
    ::close(fd);
  } else if (errno == EINVAL) {
    return direct_unsupported(dir, "open(O_TMPFILE | O_DIRECT): Invalid argument");
  }
  return Status::ok();
}

Result<std::string> fio_version(const std::string& fio_command) {
  ZW_ASSIGN_OR_RETURN(ProcessOutput output,
                      run_process({fio_command, "--version"}, 30, nullptr, {}));
  std::string version = output.out.substr(0, output.out.find('\n'));
  if (output.exit_code != 0 || version.empty()) {
    return not_found("'" + fio_command + " --version' failed (exit status " +
                     std::to_string(output.exit_code) + "): " + tail(output.err, 500));
  }
  return version;
}

Result<JobMeasurement> parse_fio_json(std::string_view output, StoragePattern pattern) {
  ZW_ASSIGN_OR_RETURN(FioRun run, parse_fio_run(output, pattern));
  return run.summary();
}

std::vector<std::string> fio_job_arguments(const StorageJob& job, const std::string& file,
                                           uint64_t size, double runtime_s, double ramp_s) {
  const bool psync = job.engine == StorageEngine::kPsync;
  const bool random = job.pattern == StoragePattern::kRandRead;
  // psync's sequential threads each stream through their own stripe, as run_psync's do.
  const uint64_t job_size =
      psync && !random ? internal::align_down(size / job.depth, job.block_size) : size;
  std::vector<std::string> args = {
      "--name=" + job.name(),
      "--filename=" + fio_file_name(file),
      "--size=" + std::to_string(job_size),
      "--direct=1",
      std::string("--ioengine=") + storage_engine_name(job.engine),
      std::string("--rw=") + storage_pattern_rw(job.pattern),
      "--bs=" + std::to_string(job.block_size),
      "--time_based",
      "--runtime=" + fio_time(runtime_s),
      "--randrepeat=0",
      "--group_reporting",
      "--thread",
      "--output-format=json+",
      "--mem_align=" + std::to_string(2 << 20),  // buffers on a huge page (fio_environment)
  };
  if (ramp_s > 0) args.push_back("--ramp_time=" + fio_time(ramp_s));
  // Uniform offsets with repeats, as zerowait draws them (fio's default map avoids repeats).
  if (random) args.push_back("--norandommap");
  if (psync) {
    args.push_back("--numjobs=" + std::to_string(job.depth));
    if (!random) args.push_back("--offset_increment=" + std::to_string(job_size));
  } else {
    args.push_back("--iodepth=" + std::to_string(job.depth));
  }
  return args;
}

Result<JobMeasurement> run_storage_job(int fd, const std::string& path, uint64_t size,
                                       const StorageJob& job, double ramp_s, double runtime_s,
                                       const std::atomic<bool>* stop) {
  if (job.depth == 0 || job.block_size == 0 || job.block_size % kDirectIoAlignment != 0 ||
      size < job.block_size * job.depth || size % job.block_size != 0) {
    return invalid_argument("job " + job.name() + " does not fit a file of " +
                            std::to_string(size) + " bytes");
  }
  ZW_ASSIGN_OR_RETURN(RawRun run,
                      run_job_raw(fd, path, size, job, timed_window(ramp_s, runtime_s), stop));
  return run.summary();
}

Result<StorageBenchReport> run_storage_bench(const StorageBenchOptions& options) {
  if (!(options.runtime_s > 0) || options.runtime_s > 3600) {
    return invalid_argument("--runtime must be between 0 and 3600 seconds, not " +
                            std::to_string(options.runtime_s));
  }
  ZW_ASSIGN_OR_RETURN(std::vector<StorageJob> jobs, plan_storage_jobs(options.random_depths));
  // Whole blocks for every sequential stream, so that the fill covers the file exactly.
  const uint64_t size = internal::align_down(options.size, kStorageBenchMinSize);
  if (size < kStorageBenchMinSize) {
    return invalid_argument("--size " + std::to_string(options.size) + " is too small: the test "
                            "file needs at least " + std::to_string(kStorageBenchMinSize >> 20) +
                            " MiB");
  }
  ZW_RETURN_IF_ERROR(check_storage_bench_dir(options.dir, size));
  const auto progress = [&](const std::string& message) {
    if (options.progress) options.progress(message);
  };

  StorageBenchReport report;
  report.dir = options.dir;
  report.size = size;
  report.runtime_s = options.runtime_s;
  report.ramp_s = storage_ramp_seconds(options.runtime_s);
  if (!options.use_fio) {
    report.notes.push_back("fio not run (--no-fio)");
  } else if (Result<std::string> version = fio_version(options.fio_command); version.is_ok()) {
    report.fio_version = *version;
  } else {
    report.notes.push_back("fio not run: " + version.status().message() +
                           " (install it: apt-get install fio)");
  }
  if (!io_uring_available()) {
    std::erase_if(jobs, [](const StorageJob& j) { return j.engine == StorageEngine::kIoUring; });
    report.notes.push_back("io_uring jobs skipped: " + io_uring_unavailable_reason());
  }
  const bool with_fio = !report.fio_version.empty();
  if (!huge_pages_enabled()) {
    report.notes.push_back(
        "transparent huge pages are off (/sys/kernel/mm/transparent_hugepage/enabled): buffers "
        "are in 4 KiB pages on both sides, and their physical layout moves the MB/s of 128 KiB "
        "and 1 MiB requests up to 2.4x from run to run");
  }

  ZW_ASSIGN_OR_RETURN(TestFile file, TestFile::create(options.dir));
  report.file = file.path();
  // A write run ends with fdatasync, which makes the virtual disk's host write back what it
  // cached: otherwise that write-back slows whichever run comes next (reads measured up to 1.8x
  // apart right after 40 GB of writes).
  const auto flush_writes = [&](const StorageJob& job) -> Status {
    if (job.pattern != StoragePattern::kSeqWrite) return Status::ok();
    if (::fdatasync(file.fd()) != 0) return errno_status(errno, "cannot fdatasync", file.path());
    return Status::ok();
  };
  const auto run_zerowait = [&](const StorageJob& job, double runtime_s) -> Result<RawRun> {
    ZW_ASSIGN_OR_RETURN(RawRun run,
                        run_job_raw(file.fd(), file.path(), size, job,
                                    timed_window(report.ramp_s, runtime_s), options.stop));
    ZW_RETURN_IF_ERROR(flush_writes(job));
    return run;
  };

  // Written whole before anything reads it: reading never-written blocks costs the disk nothing.
  progress("writing the " + std::to_string(size >> 20) + " MiB test file " + file.path());
  const StorageJob fill{StoragePattern::kSeqWrite, kSequentialBlock, kSequentialDepth,
                        StorageEngine::kPsync};
  ZW_RETURN_IF_ERROR(
      run_job_raw(file.fd(), file.path(), size, fill, {0, UINT64_MAX, true}, options.stop)
          .status());
  ZW_RETURN_IF_ERROR(flush_writes(fill));
  struct stat written {};
  if (::fstat(file.fd(), &written) != 0) return errno_status(errno, "cannot fstat", file.path());
  if (uint64_t(written.st_size) != size) {
    return Status(ErrorCode::kInternal, "the test file '" + file.path() + "' holds " +
                                            std::to_string(written.st_size) + " bytes after "
                                            "the fill, not " + std::to_string(size));
  }

  // With fio the sides alternate in slices, zerowait first and last (A BB AA BB ... BB A): a
  // drift of the disk during the job (linear in time) weighs the same on both, and a burst of
  // a few seconds (this disk has them) lands on both sides more often than with one swap.
  const unsigned cycles = with_fio ? storage_bench_cycles(options.runtime_s) : 1;
  const double slice = options.runtime_s / (2.0 * cycles);
  report.fio_slices = with_fio ? cycles : 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const StorageJob& job = jobs[i];
    const std::string step = "job " + std::to_string(i + 1) + "/" + std::to_string(jobs.size()) +
                             " " + job.name() + ": ";
    progress(step + "zerowait");
    ZW_ASSIGN_OR_RETURN(RawRun ours, run_zerowait(job, with_fio ? slice : options.runtime_s));
    std::vector<FioRun> fio_runs;
    for (unsigned cycle = 0; cycle < (with_fio ? cycles : 0); ++cycle) {
      progress(step + "fio" + (cycles > 1 ? " " + std::to_string(cycle + 1) + "/" +
                                                std::to_string(cycles)
                                          : std::string()));
      ZW_ASSIGN_OR_RETURN(FioRun fio,
                          run_fio_job(options.fio_command, job, file.path(), size, 2 * slice,
                                      report.ramp_s, options.stop));
      fio_runs.push_back(std::move(fio));
      ZW_RETURN_IF_ERROR(flush_writes(job));
      progress(step + "zerowait");
      ZW_ASSIGN_OR_RETURN(RawRun more,
                          run_zerowait(job, cycle + 1 < cycles ? 2 * slice : slice));
      ours.merge(more);
    }
    if (stopped(options.stop)) return cancelled();
    StorageJobResult result{job, ours.summary(), std::nullopt};
    if (!fio_runs.empty()) result.fio = merge_fio_runs(fio_runs);
    report.jobs.push_back(std::move(result));
  }
  return report;
}

}  // namespace zerowait
