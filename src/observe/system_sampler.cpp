#include "zerowait/observe/system_sampler.hpp"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "common/clock.hpp"
#include "host/meminfo.hpp"
#include "host/nvml.hpp"
#include "host/system.hpp"
#include "observe/proc_reading.hpp"
#include "observe/run/run_json.hpp"
#include "observe/thread_activity.hpp"

namespace zerowait::observe {
namespace {

constexpr double kSectorBytes = 512;  // /proc/diskstats counts 512-byte sectors on every device

// A counter's increase; one that went backwards (a device re-added, a pid reused) is no change.
double delta(uint64_t now, uint64_t before) { return now > before ? double(now - before) : 0; }

double per_second(uint64_t now, uint64_t before, double dt) {
  return dt > 0 ? delta(now, before) / dt : 0;
}

double share(uint64_t now, uint64_t before, uint64_t total) {
  return total == 0 ? 0 : std::min(1.0, delta(now, before) / double(total));
}

DiskRates disk_rates(const DiskCounters& now, const DiskCounters& before, double dt) {
  DiskRates d;
  const double interval_ms = dt * 1000;
  if (interval_ms > 0) {
    d.busy = std::min(1.0, delta(now.io_ms, before.io_ms) / interval_ms);
    d.queue = delta(now.weighted_ms, before.weighted_ms) / interval_ms;
  }
  if (now.ios > before.ios) {
    d.await_ms = delta(now.rw_ms, before.rw_ms) / delta(now.ios, before.ios);
  }
  d.read_bps = per_second(now.sectors_read, before.sectors_read, dt) * kSectorBytes;
  d.write_bps = per_second(now.sectors_written, before.sectors_written, dt) * kSectorBytes;
  return d;
}

// A process new since the last reading counts from zero: it was forked during the interval.
SystemSample rates(const ProcReading& now, const ProcReading& before) {
  static const double ticks_per_s = double(sysconf(_SC_CLK_TCK));
  const double dt = now.t - before.t;
  SystemSample s;
  s.t = now.t;
  if (now.cpu && before.cpu) {
    s.cpu = share(now.cpu->busy, before.cpu->busy, now.cpu->total - before.cpu->total);
  }
  double ticks = 0;
  double child_ticks = 0;
  double read_bytes = 0;
  double write_bytes = 0;
  for (const auto& [pid, counters] : now.tree) {
    const auto old = before.tree.find(pid);
    const ProcessCounters zero;
    const ProcessCounters& base = old == before.tree.end() ? zero : old->second;
    ticks += delta(counters.cpu_ticks, base.cpu_ticks);
    if (pid != now.root) child_ticks += delta(counters.cpu_ticks, base.cpu_ticks);
    read_bytes += delta(counters.read_bytes, base.read_bytes);
    write_bytes += delta(counters.write_bytes, base.write_bytes);
  }
  s.proc_cpu = dt > 0 ? ticks / ticks_per_s / dt : 0;
  s.children_cpu = dt > 0 ? child_ticks / ticks_per_s / dt : 0;
  s.children = now.children;
  s.read_bps = dt > 0 ? read_bytes / dt : 0;
  s.write_bps = dt > 0 ? write_bytes / dt : 0;
  s.rss = now.rss;
  s.mem_available = now.mem_available;
  if (now.pswpin && before.pswpin) s.swap_in = per_second(*now.pswpin, *before.pswpin, dt);
  if (now.pswpout && before.pswpout) s.swap_out = per_second(*now.pswpout, *before.pswpout, dt);
  for (const auto& [name, counters] : now.disks) {
    const auto old = before.disks.find(name);
    if (old != before.disks.end()) s.disk[name] = disk_rates(counters, old->second, dt);
  }
  s.threads = now.threads;
  s.has_children = now.has_children;
  return s;
}

double weighted(double a, double wa, double b, double wb) {
  return wa + wb > 0 ? (a * wa + b * wb) / (wa + wb) : b;
}

std::optional<double> weighted(const std::optional<double>& a, double wa,
                               const std::optional<double>& b, double wb) {
  if (a && b) return weighted(*a, wa, *b, wb);
  return b ? b : a;
}

// A device missing from one sample did no I/O in its interval (idle loop devices are left out).
DiskRates weighted(const DiskRates& a, double wa, const DiskRates& b, double wb) {
  DiskRates d;
  d.busy = weighted(a.busy, wa, b.busy, wb);
  d.queue = weighted(a.queue, wa, b.queue, wb);
  d.await_ms = weighted(a.await_ms, wa, b.await_ms, wb);
  d.read_bps = weighted(a.read_bps, wa, b.read_bps, wb);
  d.write_bps = weighted(a.write_bps, wa, b.write_bps, wb);
  return d;
}

SystemSample merged(const SystemSample& a, SystemSample b, double start) {
  const double wa = std::max(0.0, a.t - start);
  const double wb = std::max(0.0, b.t - a.t);
  b.cpu = weighted(a.cpu, wa, b.cpu, wb);
  b.proc_cpu = weighted(a.proc_cpu, wa, b.proc_cpu, wb);
  b.swap_in = weighted(a.swap_in, wa, b.swap_in, wb);
  b.swap_out = weighted(a.swap_out, wa, b.swap_out, wb);
  b.read_bps = weighted(a.read_bps, wa, b.read_bps, wb);
  b.write_bps = weighted(a.write_bps, wa, b.write_bps, wb);
  b.gpu_util = weighted(a.gpu_util, wa, b.gpu_util, wb);
  for (const auto& [name, rates] : a.disk) {
    const auto it = b.disk.find(name);
    b.disk[name] = weighted(rates, wa, it == b.disk.end() ? DiskRates{} : it->second, wb);
  }
  for (auto& [name, rates] : b.disk) {
    if (a.disk.count(name) == 0) rates = weighted(DiskRates{}, wa, rates, wb);
  }
  return b;
}

}  // namespace

void compact_samples(std::vector<SystemSample>& samples, double start) {
  std::vector<SystemSample> out;
  out.reserve(samples.size() / 2 + 1);
  size_t i = 0;
  for (; i + 1 < samples.size(); i += 2) {
    out.push_back(merged(samples[i], std::move(samples[i + 1]), start));
    start = out.back().t;
  }
  if (i < samples.size()) out.push_back(std::move(samples[i]));
  samples = std::move(out);
}

double monotonic_seconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return double(now.tv_sec) + double(now.tv_nsec) / 1e9;
}

// How a running main thread is told apart (see take()): a DataLoader's main thread unpickling
// a batch reads on its workers' sockets and opens or closes a socket or shared-memory file for
// each tensor, well under a millisecond of its own CPU time apart; freeing the batch before
// closes one file per tensor. Compute does neither. The window is counted in the thread's CPU
// time, not the clock's, so that a thread waiting for a core on a loaded machine is watched
// until it has run. Each half of the window (receiving_in_window) is kWindowCpu.
constexpr std::chrono::nanoseconds kWindowCpu{1000000};
constexpr std::chrono::microseconds kWindowPoll{250};
// A half whose thread did not get kWindowCpu of a core in this long ends; a thread that
// blocked ends the window.
constexpr std::chrono::milliseconds kWindowWall{10};
// Reads seen by one poll placed one by one (receiving_in_window), at most this many.
constexpr uint64_t kMaxDrawsPerPoll = 64;
// How long before each sample the sampler looks at the main thread (LookBack), and how much of
// a core the process must have had since for what it did then to count.
constexpr std::chrono::milliseconds kLookBack{4};
constexpr std::chrono::nanoseconds kLookBackCpu{250000};

struct ThreadProgress {
  std::optional<uint64_t> reads;   // the thread's syscr
  std::optional<uint64_t> cpu_ns;  // the process's CPU time; nullopt without its clock
  char state = '?';
};

// The main thread kLookBack before a sample: what it had read, its batch channels, and whether
// it was blocked waiting for its workers.
struct LookBack {
  ThreadProgress progress;
  std::set<std::string> channels;
  bool waiting_for_input = false;
};

std::string main_task(pid_t pid) {
  return "/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid);
}

std::optional<clockid_t> process_cpu_clock(pid_t pid) {
  clockid_t clock{};
  return clock_getcpuclockid(pid, &clock) == 0 ? std::optional<clockid_t>(clock) : std::nullopt;
}

// Whether the blocked main thread of `pid` waits for its workers: next() waiting on them (poll
// on their pipe, a read on a socket) is input; compute ending in another wait is not, nor
// waiting for the GIL (a futex), which compute does whenever another thread holds it.
bool blocked_waiting_for_workers(const host::System& system, pid_t pid) {
  const std::optional<ThreadActivity> blocked = classify_thread(system, pid, pid, true);
  return blocked && blocked->activity == Activity::kInput &&
         !blocked->detail.starts_with("futex");
}

// The process's CPU clock, not the thread's schedstat: schedstat's run time of a thread that
// stays on a core moves only at scheduler ticks (4 ms apart), too coarse for the window.
// Another process's thread clocks cannot be read; its process clock can, and its main thread
// is nearly all of it.
ThreadProgress thread_progress(const host::System& system, const std::string& task,
                               std::optional<clockid_t> process_clock) {
  ThreadProgress p;
  if (const auto io = system.read(task + "/io")) p.reads = host::counter_value(*io, "syscr");
  timespec cpu{};
  if (process_clock && clock_gettime(*process_clock, &cpu) == 0) {
    p.cpu_ns = uint64_t(cpu.tv_sec) * 1000000000u + uint64_t(cpu.tv_nsec);
  }
  if (const auto stat = system.read(task + "/stat")) p.state = stat_state(*stat);
  return p;
}

// Whether the running main thread of `pid` is receiving (or releasing) a batch from its child
// processes. Without a look back (below), what it does is watched over its next 2 x kWindowCpu of
// CPU time, in two halves: it reads, its sockets and /dev/shm files change, or it blocks in a call
// that is input. The sample stands for the middle: input when both halves saw such an event (it is
// inside a stretch of receiving) or when it blocked waiting for its workers in the first. Watching
// ahead only (an event in the next kWindowCpu) read the last kWindowCpu of every compute phase as
// input: on a loaded machine, where that CPU time is more of the phase's wall time, watch over-
// counted input by 3-7 points. What a poll sees happened somewhere in the CPU time since the poll
// before; a poll that came late (the sampler kept off a core while the thread ran on) may straddle
// a half's end, and then each read it saw is placed by a draw of its own, in proportion.
//
// With a look back (taken kLookBack before the sample, the process having run since), the
// window is centred on the sample instead, and only its first half is watched: input when the
// thread blocks waiting for its workers within it, or when it read, its channels changed or it
// was waiting for its workers in the look back and it reads or its channels change within it.
// Looking ahead alone, the sample stands for a moment after itself, and each stretch of
// receiving lost its last half-window to compute while one that starts with a wait for the
// workers gained nothing back: on a loaded machine, where kWindowCpu is several milliseconds of
// the clock, watch under-counted input by 5-8 points (32 tensors a batch, two busy loops).
bool receiving_in_window(const host::System& system, pid_t pid, std::minstd_rand& chance,
                         const std::optional<LookBack>& back) {
  const std::string task = main_task(pid);
  const std::optional<clockid_t> process_clock = process_cpu_clock(pid);
  ThreadProgress last = thread_progress(system, task, process_clock);
  if (!last.reads) return false;
  const std::optional<uint64_t> cpu_start = last.cpu_ns;
  std::set<std::string> channels = batch_channels(system, pid);
  // What the look back says: true (it was receiving), false (it ran and did not), or nothing.
  std::optional<bool> before;
  if (back && back->progress.reads && back->progress.cpu_ns && cpu_start) {
    const bool active = *last.reads > *back->progress.reads || channels != back->channels ||
                        back->waiting_for_input;
    const bool ran = *cpu_start >= *back->progress.cpu_ns + uint64_t(kLookBackCpu.count());
    if (active || ran) before = active;
  }
  const auto start = std::chrono::steady_clock::now();
  // The half (1, 2; 0: past the window) of an event seen at `ran` and not yet at `ran_before`.
  const auto half_of = [&chance](std::chrono::nanoseconds ran_before,
                                 std::chrono::nanoseconds ran) {
    const double at = double(ran_before.count()) +
                      std::uniform_real_distribution<double>(0, 1)(chance) *
                          double((ran - ran_before).count());
    return at <= double(kWindowCpu.count()) ? 1 : at <= 2.0 * double(kWindowCpu.count()) ? 2 : 0;
  };
  bool seen[3] = {false, false, false};
  bool middle = false;  // the first half is over: `channels` are the middle's
  std::chrono::nanoseconds ran_before{0};
  std::chrono::nanoseconds ran{0};
  while (true) {
    std::this_thread::sleep_for(kWindowPoll);
    const ThreadProgress now = thread_progress(system, task, process_clock);
    const auto elapsed = std::chrono::steady_clock::now() - start;
    ran = cpu_start && now.cpu_ns
              ? std::chrono::nanoseconds(*now.cpu_ns - std::min(*now.cpu_ns, *cpu_start))
              : std::chrono::duration_cast<std::chrono::nanoseconds>(elapsed);
    if (now.reads && *now.reads > *last.reads) {
      // Each read placed by a draw of its own: a poll that came late may have seen reads from
      // both halves, and one draw for all of them could place them only in one.
      const uint64_t reads = std::min<uint64_t>(*now.reads - *last.reads, kMaxDrawsPerPoll);
      for (uint64_t r = 0; r < reads; ++r) seen[half_of(ran_before, ran)] = true;
    }
    if (now.state != 'R') {
      if (blocked_waiting_for_workers(system, pid)) {
        const int half = half_of(ran_before, ran);
        if (half == 1) return true;  // waiting for its workers at the middle
        if (before.has_value()) return false;  // centred: it blocked past its half-window
        seen[half] = true;
      }
      break;
    }
    const bool first_over = ran >= kWindowCpu || elapsed >= kWindowWall;
    if (before.has_value() && first_over) break;
    if (first_over && !middle) {
      std::set<std::string> now_channels = batch_channels(system, pid);
      seen[1] = seen[1] || now_channels != channels;
      channels = std::move(now_channels);
      middle = true;
    }
    if (ran >= 2 * kWindowCpu || elapsed >= 2 * kWindowWall) break;
    if (middle && !seen[1]) return false;  // compute at the middle: nothing in the first half
    ran_before = ran;
    last = now;
  }
  if (before.has_value()) {
    return *before && (seen[1] || seen[2] || batch_channels(system, pid) != channels);
  }
  if (!seen[1]) return false;
  return seen[2] || (middle && batch_channels(system, pid) != channels);
}

struct SystemSampler::State {
  explicit State(const SystemSamplerOptions& options)
      : system(options.root), interval(options.interval) {}

  host::System system;
  std::unique_ptr<internal::Nvml> nvml;  // live only, opened by the first reading
  std::optional<ProcReading> previous;
  double baseline_t = 0;  // the first reading's time: where the first sample's interval began
  double interval;        // the thread's interval now: options.interval, doubled per compaction

  mutable std::mutex mutex;
  std::condition_variable wake;
  bool stop_requested = false;
  std::thread thread;
  std::vector<SystemSample> samples;
  SocketHistory sockets;  // the main thread's, from sample to sample
  std::optional<LookBack> look_back;  // taken kLookBack before the next sample
  std::minstd_rand chance{20261206};  // receiving_in_window's draws for late polls
  bool degraded = false;
};

SystemSampler::SystemSampler(SystemSamplerOptions options)
    : options_(std::move(options)), state_(std::make_unique<State>(options_)) {
  if (options_.pid == 0) options_.pid = getpid();
}

SystemSampler::~SystemSampler() { stop(); }

std::optional<SystemSample> SystemSampler::take(double t) {
  State& s = *state_;
  // The main thread first, at `t`: reading the whole process table takes milliseconds on a busy
  // machine, and the sample's time must be when the thread was seen, for its weight (the time
  // until the next sample) to be right. Whether the process has children is from the reading
  // before.
  std::optional<ThreadActivity> main;
  if (options_.main_thread && s.previous) {
    const bool has_children = s.previous->has_children;
    main = classify_thread(s.system, options_.pid, options_.pid, has_children, &s.sockets);
    if (main && main->running && main->activity != Activity::kInput && has_children &&
        s.system.live() && receiving_in_window(s.system, options_.pid, s.chance, s.look_back)) {
      main = ThreadActivity{Activity::kInput, "running, receiving a batch", false, true};
    }
  }
  s.look_back.reset();
  ProcReading now = read_proc(s.system, options_.pid, s.previous ? monotonic_seconds() : t);
  if (!s.system.live()) now.t = t;  // fixture trees: the caller's clock alone
  if (!s.previous) {
    if (s.system.live()) s.nvml = std::make_unique<internal::Nvml>();
    s.baseline_t = t;
    s.previous = std::move(now);
    return std::nullopt;
  }
  SystemSample sample = rates(now, *s.previous);
  sample.t = t;
  if (s.nvml) {
    sample.gpu_util = s.nvml->utilization();
    sample.gpu_mem = s.nvml->memory_used();
  }
  if (options_.main_thread && !now.exiting) {
    if (main) sample.main = activity_name(main->activity);
    sample.main_receiving = main && main->running && main->activity == Activity::kInput;
    if (main && main->degraded) {
      std::lock_guard<std::mutex> lock(s.mutex);
      s.degraded = true;
    }
    sample.pipeline = now.has_children || runs_zerowait_loader(s.system, options_.pid);
  }
  s.previous = std::move(now);
  return sample;
}

void SystemSampler::look_back() {
  State& s = *state_;
  if (!options_.main_thread || !s.previous || !s.previous->has_children || !s.system.live()) {
    return;
  }
  const pid_t pid = options_.pid;
  LookBack back;
  back.progress = thread_progress(s.system, main_task(pid), process_cpu_clock(pid));
  back.channels = batch_channels(s.system, pid);
  back.waiting_for_input =
      back.progress.state != 'R' && blocked_waiting_for_workers(s.system, pid);
  s.look_back = std::move(back);
}

Status SystemSamplerOptions::validate() const {
  if (!(interval > 0) || !std::isfinite(interval)) {
    return invalid_argument("interval = " + std::to_string(interval) +
                            " s: the sampler needs an interval > 0 (default 0.1)");
  }
  if (max_samples < 2) {
    return invalid_argument("max_samples = " + std::to_string(max_samples) +
                            ": the sampler keeps at least 2 samples (default 20000)");
  }
  return Status::ok();
}

Status SystemSampler::start() {
  ZW_RETURN_IF_ERROR(options_.validate());
  State& s = *state_;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.thread.joinable()) return invalid_argument("the system sampler is already running");
  s.stop_requested = false;
  try {
    s.thread = std::thread([this] {
      State& st = *state_;
      auto next = std::chrono::steady_clock::now();
      while (true) {
        std::optional<SystemSample> sample = take(monotonic_seconds());
        std::unique_lock<std::mutex> lock(st.mutex);
        if (sample) st.samples.push_back(std::move(*sample));
        if (st.samples.size() >= options_.max_samples) {
          compact_samples(st.samples, st.baseline_t);
          st.interval *= 2;
        }
        if (st.stop_requested) return;
        const auto period = internal::from_seconds(st.interval);
        // A fixed schedule; a reading that overran skips the ticks it missed.
        const auto now = std::chrono::steady_clock::now();
        next += period;
        while (next <= now) next += period;
        if (next - kLookBack > now) {
          st.wake.wait_until(lock, next - kLookBack, [&st] { return st.stop_requested; });
          if (!st.stop_requested) {
            lock.unlock();
            look_back();
            lock.lock();
          }
        }
        st.wake.wait_until(lock, next, [&st] { return st.stop_requested; });
        if (st.stop_requested) {
          lock.unlock();
          std::optional<SystemSample> last = take(monotonic_seconds());
          lock.lock();
          if (last) st.samples.push_back(std::move(*last));
          return;
        }
      }
    });
  } catch (const std::system_error& error) {
    return Status(ErrorCode::kResourceExhausted,
                  std::string("cannot start the system sampler thread: ") +
                          error.what());
  }
  return Status::ok();
}

void SystemSampler::stop() {
  State& s = *state_;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (!s.thread.joinable()) return;
    s.stop_requested = true;
  }
  s.wake.notify_all();
  s.thread.join();
}

bool SystemSampler::running() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->thread.joinable();
}

std::vector<SystemSample> SystemSampler::samples() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->samples;
}

bool SystemSampler::degraded() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->degraded;
}

double SystemSampler::current_interval() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->interval;
}

std::string to_json(const SystemSample& sample) { return sample_json(sample).dump(); }

}  // namespace zerowait::observe
