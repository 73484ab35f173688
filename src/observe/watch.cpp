#include "zerowait/observe/watch.hpp"

#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "host/system.hpp"
#include "observe/proc_reading.hpp"
#include "zerowait/observe/attribution.hpp"
#include "zerowait/observe/cost.hpp"

extern char** environ;

namespace zerowait::observe {
namespace {

// The job being watched, for the signal handler: Ctrl-C and `kill` reach watch, and the job
// must get them too. A signal the terminal sent (si_code SI_KERNEL) already went to the whole
// foreground process group, the job included, so it is not sent twice.
std::atomic<pid_t> g_child{0};
volatile sig_atomic_t g_interrupted = 0;

void on_signal(int signal_number, siginfo_t* info, void* /*context*/) {
  g_interrupted = 1;
  const pid_t child = g_child.load();
  if (child > 0 && (info == nullptr || info->si_code != SI_KERNEL)) kill(child, signal_number);
}

void install_signal_handlers() {
  struct sigaction action {};
  action.sa_sigaction = on_signal;
  action.sa_flags = SA_SIGINFO;  // no SA_RESTART: --pid's sleep wakes up on Ctrl-C
  sigemptyset(&action.sa_mask);
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
}

std::string join_command(const std::vector<std::string>& words) {
  std::string text;
  for (const std::string& w : words) {
    if (!text.empty()) text += ' ';
    const bool plain = !w.empty() && w.find_first_of(" \t\"'\\$") == std::string::npos;
    text += plain ? w : "'" + w + "'";
  }
  return text;
}

// /proc/PID/cmdline with its NULs as spaces; "" when unreadable.
std::string process_command_line(pid_t pid) {
  std::string text = host::System().read("/proc/" + std::to_string(pid) + "/cmdline").value_or("");
  while (!text.empty() && text.back() == '\0') text.pop_back();
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

// Alive and not a zombie (a zombie of another parent is as good as gone).
bool process_running(pid_t pid) {
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  return stat_state(host::System().read("/proc/" + std::to_string(pid) + "/stat").value_or("")) !=
         'Z';
}

Result<pid_t> spawn_command(const std::vector<std::string>& command) {
  std::vector<char*> argv;
  for (const std::string& word : command) argv.push_back(const_cast<char*>(word.c_str()));
  argv.push_back(nullptr);
  // The job starts with default signal handling and an empty mask: watch ignores SIGPIPE,
  // and an ignored signal stays ignored across exec.
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t defaults;
  sigemptyset(&defaults);
  for (int s : {SIGPIPE, SIGINT, SIGTERM}) sigaddset(&defaults, s);
  sigset_t empty;
  sigemptyset(&empty);
  posix_spawnattr_setsigdefault(&attributes, &defaults);
  posix_spawnattr_setsigmask(&attributes, &empty);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  pid_t pid = 0;
  const int error = posix_spawnp(&pid, argv[0], nullptr, &attributes, argv.data(), environ);
  posix_spawnattr_destroy(&attributes);
  if (error != 0) {
    return invalid_argument("cannot execute '" + command[0] + "': " + std::strerror(error) +
                            (error == ENOENT ? " (not a file, and not found in PATH)" : ""));
  }
  return pid;
}

// Waits for the job and returns the exit status watch passes on: the job's own, or 128 + the
// signal that ended it (as a shell reports it).
Result<int> wait_for_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return errno_status(errno, "waitpid", std::to_string(pid));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;  // stopped or continued: waitpid without WUNTRACED never reports those
}

std::string percent_text(double share) {
  return std::to_string(static_cast<int>(std::lround(share * 100))) + " %";
}

// An input-bound job's change: twice its worker processes (none: 2). The model: the workers
// hand over a batch as often as they make one, so a step lasts the workers' period; with twice
// the workers the period halves, and the wait left is what exceeds the rest of the step
// (compute, the other waits, and the main thread's own share of input: unpickling, which more
// workers do not take off it). Without workers the main thread makes its batches between
// steps, and workers would overlap them with the step. It assumes the workers' output grows
// with their number: free cores (their CPU use says), or workers that wait on I/O.
std::vector<WatchAdvice> input_advice(const std::vector<SystemSample>& steady,
                                      const Attribution& a) {
  if (a.verdict != "input-bound" || steady.empty()) return {};
  std::vector<int> counts;
  double cpu = 0;
  size_t receiving = 0;
  for (const SystemSample& s : steady) {
    counts.push_back(s.children);
    cpu += s.children_cpu;
    receiving += s.main_receiving ? 1 : 0;
  }
  std::sort(counts.begin(), counts.end());
  WatchAdvice advice;
  advice.workers = counts[counts.size() / 2];
  advice.workers_cpu = cpu / double(steady.size());
  const double input = a.shares.at("input");
  const double own = std::min(input, double(receiving) / double(steady.size()));
  const double rest = 1 - input;
  const int more = advice.workers == 0 ? 2 : 2 * advice.workers;
  const double period = advice.workers == 0 ? input / more : double(advice.workers) / more;
  const double wait = std::max(0.0, period - rest - own) + own;
  advice.predicted_input_share = wait + rest > 0 ? wait / (wait + rest) : 0;
  advice.change = "num_workers=" + std::to_string(advice.workers) + " -> " + std::to_string(more);
  char cpus[32];
  std::snprintf(cpus, sizeof(cpus), "%.2f", advice.workers_cpu);
  advice.summary = "input is " + percent_text(input) + " of the main thread's time, " +
                   (advice.workers == 0 ? std::string("with no worker processes")
                                        : "waiting on " + std::to_string(advice.workers) +
                                              " worker processes that used " + cpus + " CPUs of " +
                                              std::to_string(sysconf(_SC_NPROCESSORS_ONLN))) +
                   ": " + advice.change + " would cut it to about " +
                   percent_text(advice.predicted_input_share) +
                   " (if the workers' output grows with their number: free cores, or waits on I/O)";
  return {advice};
}

void sleep_seconds(double seconds) {
  timespec pause{};
  pause.tv_sec = static_cast<time_t>(seconds);
  pause.tv_nsec = static_cast<long>((seconds - double(pause.tv_sec)) * 1e9);
  nanosleep(&pause, nullptr);  // EINTR (Ctrl-C) ends it early, which is the point
}

}  // namespace

Result<WatchResult> watch_job(const WatchOptions& options) {
  const bool by_pid = options.pid != 0;
  if (by_pid == !options.command.empty()) {
    return invalid_argument(by_pid ? "give either --pid PID or -- CMD, not both"
                                   : "nothing to watch: give --pid PID, or the command after --, "
                                     "e.g. zerowait watch -- python train.py");
  }
  if ((options.gpus > 0) != (options.gpu_hourly_cost >= 0)) {
    return invalid_argument(
        "--gpus and --gpu-hourly-cost go together: give both to price the waits "
        "(e.g. --gpus 8 --gpu-hourly-cost 2.0)");
  }
  if (by_pid && !process_running(options.pid)) {
    return invalid_argument("--pid " + std::to_string(options.pid) +
                            ": no such process is running");
  }
  std::optional<RunFigures> before;
  if (!options.compare.empty()) {
    ZW_ASSIGN_OR_RETURN(RunFigures figures, read_run_figures(options.compare));
    before = figures;
  }
  WatchResult result;
  result.out_dir =
      !options.out.empty() ? options.out : "zerowait-watch-" + std::to_string(std::time(nullptr));
  if (std::filesystem::exists(result.out_dir + "/run.json")) {
    return invalid_argument("--out " + result.out_dir +
                            " already holds a run (run.json); name another directory");
  }

  WatchRun& run = result.run;
  run.command = options.argv;
  run.started_unix =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  result.t0 = monotonic_seconds();
  install_signal_handlers();
  pid_t pid = options.pid;
  if (!by_pid) {
    // A signal that came after the spawn but before g_child names the job would reach watch
    // alone (seen under load: the job started, printed, and never got the SIGTERM): SIGINT and
    // SIGTERM wait, blocked, until the handler can forward them. The job starts with an empty
    // mask (spawn_command), and watch has no other thread yet to take them meanwhile.
    sigset_t forwarded;
    sigemptyset(&forwarded);
    sigaddset(&forwarded, SIGINT);
    sigaddset(&forwarded, SIGTERM);
    sigset_t previous;
    pthread_sigmask(SIG_BLOCK, &forwarded, &previous);
    Result<pid_t> spawned = spawn_command(options.command);
    if (spawned.is_ok()) g_child.store(*spawned);
    pthread_sigmask(SIG_SETMASK, &previous, nullptr);
    ZW_ASSIGN_OR_RETURN(pid, std::move(spawned));
    run.title = join_command(options.command);
  } else {
    run.title = "pid " + std::to_string(pid) + ": " + process_command_line(pid);
  }
  SystemSamplerOptions sampling;
  sampling.pid = pid;
  sampling.interval = options.interval;
  sampling.main_thread = true;
  SystemSampler sampler(sampling);
  const Status started = sampler.start();
  if (!by_pid) {
    Result<int> exit_code = wait_for_child(pid);  // reaps it even when the sampler failed
    g_child.store(0);
    if (!exit_code.is_ok()) {
      sampler.stop();
      return exit_code.status();
    }
    result.exit_code = *exit_code;
  } else {
    while (started.is_ok() && !g_interrupted && process_running(pid)) {
      sleep_seconds(options.interval);
    }
  }
  sampler.stop();
  ZW_RETURN_IF_ERROR(started);
  run.duration_s = monotonic_seconds() - result.t0;

  // Samples after the job's main thread ended have no `main`; they are not the job's.
  for (SystemSample& s : sampler.samples()) {
    if (s.main) run.samples.push_back(std::move(s));
  }
  // Start-up (imports, building the dataset) ends where the data pipeline first runs, and
  // shutdown (interpreter teardown) starts after it last ran: the shares are of the time
  // between, the time the training loop's own clock would measure.
  const auto running = [](const SystemSample& s) { return s.pipeline; };
  // A child that lives shorter than kPipelineS (a tool that an import runs) is no pipeline.
  constexpr double kPipelineS = 0.5;
  auto first = run.samples.begin();
  for (; first != run.samples.end(); ++first) {
    if (!first->pipeline) continue;
    const auto end = std::find_if_not(first, run.samples.end(), running);
    if (end == run.samples.end() || std::prev(end)->t - first->t >= kPipelineS) break;
  }
  const auto last = std::find_if(run.samples.rbegin(), run.samples.rend(), running);
  std::vector<SystemSample> steady = run.samples;
  double steady_s = run.duration_s;
  if (first != run.samples.end()) {
    const double begin_t = first == run.samples.begin() ? result.t0 : std::prev(first)->t;
    run.startup_s = std::max(0.0, begin_t - result.t0);
    run.shutdown_s = std::max(0.0, result.t0 + run.duration_s - last->t);
    steady.assign(first, last.base());
    steady_s = last->t - begin_t;
  }
  run.attribution = attribute(steady, steady_s);
  if (sampler.degraded()) {
    run.degraded = "cannot read /proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                   "/syscall: watch has no ptrace rights over pid " + std::to_string(pid) +
                   (by_pid ? " (another user's process, or kernel.yama.ptrace_scope >= 1 for a "
                             "process that is not watch's child)"
                           : "") +
                   "; blocked waits count as other. Run watch as the job's user with "
                   "ptrace_scope 0, as root, or start the job under it (zerowait watch -- CMD)";
  }
  if (!by_pid) {
    run.exit_code = result.exit_code;
    run.failed = result.exit_code != 0 && !g_interrupted;
  }
  if (!run.failed) run.advice = input_advice(steady, run.attribution);
  if (options.gpus > 0 && !run.failed) {
    ZW_ASSIGN_OR_RETURN(WaitCost cost,
                        wait_cost(run.attribution.shares, options.gpus, options.gpu_hourly_cost));
    run.cost = std::move(cost);
  }
  if (before && !run.failed) {
    const RunFigures after{std::nullopt, run.attribution.shares.at("compute")};
    ZW_ASSIGN_OR_RETURN(Comparison comparison,
                        compare_runs(*before, after, options.compare, options.gpus,
                                     std::max(0.0, options.gpu_hourly_cost)));
    run.comparison = std::move(comparison);
  }
  ZW_RETURN_IF_ERROR(write_watch_run(result.out_dir, run));
  return result;
}

}  // namespace zerowait::observe
