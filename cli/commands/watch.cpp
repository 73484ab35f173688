// `zerowait watch`: where a training job's seconds go, seen from outside. Starts the job (or
// follows a running one), samples its main thread and the system until it ends, and writes a
// run directory (docs/observe.md). Sampling and attribution live in src/observe/.
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
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "observe/proc_reading.hpp"
#include "observe/report_text.hpp"
#include "zerowait/observe/activity.hpp"
#include "zerowait/observe/attribution.hpp"
#include "zerowait/observe/cost.hpp"
#include "zerowait/observe/system_sampler.hpp"
#include "zerowait/observe/watch_run.hpp"

extern char** environ;

namespace zerowait::cli {
namespace {

using observe::SystemSample;

struct WatchArgs {
  std::string out;
  double interval = observe::SystemSamplerOptions{}.interval;
  int64_t gpus = 0;
  double gpu_hourly_cost = -1;  // -1: not given
  std::string compare;
  bool json = false;
  int64_t pid = 0;
  std::vector<std::string> command;
  std::vector<std::string> argv;  // zerowait's own, for run.json
};

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
  std::ifstream in("/proc/" + std::to_string(pid) + "/cmdline", std::ios::binary);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  while (!text.empty() && text.back() == '\0') text.pop_back();
  std::replace(text.begin(), text.end(), '\0', ' ');
  return text;
}

// Alive and not a zombie (a zombie of another parent is as good as gone).
bool process_running(pid_t pid) {
  if (kill(pid, 0) != 0 && errno != EPERM) return false;
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return observe::stat_state(stat) != 'Z';
}

pid_t spawn_command(const std::vector<std::string>& command) {
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
    throw CliError("cannot execute '" + command[0] + "': " + std::strerror(error) +
                   (error == ENOENT ? " (not a file, and not found in PATH)" : ""));
  }
  return pid;
}

// Waits for the job and returns the exit status watch passes on: the job's own, or 128 + the
// signal that ended it (as a shell reports it).
int wait_for_child(pid_t pid) {
  int status = 0;
  while (waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw CliError(std::string("waitpid: ") + std::strerror(errno));
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return kExitError;
}

void sleep_seconds(double seconds) {
  timespec pause{};
  pause.tv_sec = static_cast<time_t>(seconds);
  pause.tv_nsec = static_cast<long>((seconds - double(pause.tv_sec)) * 1e9);
  nanosleep(&pause, nullptr);  // EINTR (Ctrl-C) ends it early, which is the point
}

std::string fixed(double value, int digits) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.*f", digits, value);
  return text;
}

// $1,234,567 for large sums, $76.80 below a thousand.
std::string money(double value) { return observe::format_money(value, 1000); }

std::string percent(double share) { return fixed(share * 100, 1) + "%"; }

void print_summary(const observe::WatchRun& run, const std::string& out_dir, double t0) {
  const observe::Attribution& a = run.attribution;
  std::cout << "\nzerowait watch: " << run.title << "\n  " << format_duration(run.duration_s)
            << ", " << count_noun(a.classified, "sample", "samples")
            << " of the main thread\n\n";
  Table table({{"cause"}, {"share", Align::kRight}, {"seconds", Align::kRight}});
  for (observe::Activity activity : observe::kActivities) {
    const std::string cause = observe::activity_name(activity);
    table.add_row({cause, percent(a.shares.at(cause)), fixed(a.seconds.at(cause), 2)});
  }
  table.print(std::cout);
  std::cout << "\nverdict: " << a.verdict << '\n';
  if (!a.events.empty()) {
    std::vector<observe::DropEvent> top = a.events;
    std::stable_sort(top.begin(), top.end(), [](const auto& x, const auto& y) {
      return x.depth > y.depth;
    });
    std::cout << "drops (" << a.events.size() << ", deepest first):\n";
    for (size_t i = 0; i < top.size() && i < 3; ++i) {
      std::cout << "  at " << fixed(top[i].t - t0, 1) << " s: " << top[i].what << "; before: "
                << top[i].before << '\n';
    }
  }
  if (run.cost) {
    // The largest wait, priced; then every wait together.
    std::string cause = "input";
    for (const char* c : {"input", "checkpoint", "communication", "other"}) {
      if (run.cost->per_day.at(c) > run.cost->per_day.at(cause)) cause = c;
    }
    const std::string on = " on " + count_noun(uint64_t(run.cost->gpus), "GPU", "GPUs") + " at " +
                           money(run.cost->gpu_hourly_cost) + "/h";
    if (run.cost->wait_per_day > 0) {
      std::cout << cause << " wait costs " << money(run.cost->per_day.at(cause)) << "/day, "
                << money(run.cost->per_year.at(cause)) << "/year" << on << " (all waits: "
                << money(run.cost->wait_per_day) << "/day, " << money(run.cost->wait_per_year)
                << "/year)\n";
    } else {
      std::cout << "no wait to pay for" << on << '\n';
    }
  }
  if (run.comparison) {
    const observe::Comparison& c = *run.comparison;
    std::cout << (c.saving_share >= 0 ? "saving: " : "regression: ")
              << percent(std::fabs(c.saving_share))
              << (c.saving_share >= 0 ? " less" : " more") << " GPU time than " << c.before
              << " (by " << c.basis << ")";
    if (c.saving_per_day) {
      std::cout << ", " << money(*c.saving_per_day) << "/day, " << money(*c.saving_per_year)
                << "/year";
    }
    std::cout << '\n';
  }
  std::cout << "run written to " << out_dir << " (run.json, system.jsonl)\n";
}

int run_watch(const WatchArgs& args) {
  const bool by_pid = args.pid != 0;
  if (by_pid == !args.command.empty()) {
    throw CliError(by_pid ? "give either --pid PID or -- CMD, not both"
                          : "nothing to watch: give --pid PID, or the command after --, e.g. "
                            "zerowait watch -- python train.py");
  }
  if ((args.gpus > 0) != (args.gpu_hourly_cost >= 0)) {
    throw CliError("--gpus and --gpu-hourly-cost go together: give both to price the waits "
                   "(e.g. --gpus 8 --gpu-hourly-cost 2.0)");
  }
  if (by_pid && !process_running(pid_t(args.pid))) {
    throw CliError("--pid " + std::to_string(args.pid) + ": no such process is running");
  }
  std::optional<observe::RunFigures> before;
  if (!args.compare.empty()) before = unwrap(observe::read_run_figures(args.compare));
  const std::string out_dir =
      !args.out.empty() ? args.out : "zerowait-watch-" + std::to_string(std::time(nullptr));
  if (std::filesystem::exists(out_dir + "/run.json")) {
    throw CliError("--out " + out_dir + " already holds a run (run.json); name another directory");
  }

  observe::WatchRun run;
  run.command = args.argv;
  run.started_unix = std::chrono::duration<double>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  const double t0 = observe::monotonic_seconds();
  install_signal_handlers();
  pid_t pid = pid_t(args.pid);
  if (!by_pid) {
    pid = spawn_command(args.command);
    g_child.store(pid);
    run.title = join_command(args.command);
  } else {
    run.title = "pid " + std::to_string(pid) + ": " + process_command_line(pid);
  }
  observe::SystemSamplerOptions options;
  options.pid = pid;
  options.interval = args.interval;
  options.main_thread = true;
  observe::SystemSampler sampler(options);
  const Status started = sampler.start();
  int exit_code = kExitOk;
  if (!by_pid) {
    exit_code = wait_for_child(pid);  // reaps it even when the sampler failed to start
    g_child.store(0);
  } else {
    while (started.is_ok() && !g_interrupted && process_running(pid)) sleep_seconds(args.interval);
  }
  sampler.stop();
  check(started);
  run.duration_s = observe::monotonic_seconds() - t0;

  // Samples after the job's main thread ended have no `main`; they are not the job's.
  for (SystemSample& s : sampler.samples()) {
    if (s.main) run.samples.push_back(std::move(s));
  }
  run.attribution = observe::attribute(run.samples, run.duration_s);
  if (args.gpus > 0) {
    run.cost = unwrap(observe::wait_cost(run.attribution.shares, args.gpus, args.gpu_hourly_cost));
  }
  if (before) {
    const observe::RunFigures after{std::nullopt, run.attribution.shares.at("compute")};
    run.comparison = unwrap(observe::compare_runs(*before, after, args.compare, args.gpus,
                                                  std::max(0.0, args.gpu_hourly_cost)));
  }
  check(observe::write_watch_run(out_dir, run));
  if (args.json) {
    std::cout << observe::watch_run_json(run);
  } else {
    print_summary(run, out_dir, t0);
  }
  return exit_code;
}

}  // namespace

Command add_watch_command(CLI::App& app) {
  auto args = std::make_shared<WatchArgs>();
  CLI::App* cmd = app.add_subcommand(
      "watch", "Watch a training job from outside: where its main thread's time goes");
  cmd->add_option("--out", args->out,
                  "Run directory to write (default: zerowait-watch-<unix time> here)")
      ->type_name("RUN")
      ->check(local_path("--out"));
  cmd->add_option("--interval", args->interval, "Seconds between samples")
      ->type_name("S")
      ->check(quiet(CLI::Range(0.001, 60.0)))
      ->capture_default_str();
  cmd->add_option("--gpus", args->gpus, "GPUs the job runs on (to price the waits)")
      ->type_name("N")
      ->check(integer_at_least(1));
  cmd->add_option("--gpu-hourly-cost", args->gpu_hourly_cost, "Price of one GPU-hour, e.g. 2.0")
      ->type_name("X")
      ->check(quiet(CLI::NonNegativeNumber));
  cmd->add_option("--compare", args->compare,
                  "An earlier run directory: how much GPU time this run saves against it")
      ->type_name("BEFORE_RUN")
      ->check(local_path("--compare"));
  cmd->add_option("--pid", args->pid, "Follow a running process instead of starting one")
      ->type_name("PID")
      ->check(integer_at_least(1));
  add_json_flag(cmd, &args->json);
  cmd->add_option("CMD", args->command, "The job to start, after --")->type_name("-- CMD ARGS");
  cmd->footer(
      "Samples the job's main thread every --interval seconds: running in user space, asleep\n"
      "(a sleep standing for the GPU) or in a CUDA ioctl is compute; reading files, or waiting\n"
      "on a pipe from child processes (DataLoader workers), is input; writing, fsync and rename\n"
      "of files is checkpoint; sockets are communication; the rest is other. Beside it, the\n"
      "machine's CPU, memory, swap, each disk's queue and latency, and GPU utilisation.\n"
      "The verdict names a wait of 25 % or more (input-bound...), else compute-bound at 60 %\n"
      "compute; drops of compute come with what the disks, swap and writes did just before.\n"
      "\n"
      "Writes RUN/run.json and RUN/system.jsonl (docs/observe.md). With --gpus and\n"
      "--gpu-hourly-cost the waits are priced; --compare BEFORE_RUN says how much less GPU time\n"
      "the same work takes now (1 - compute share before / after). The job's stdio passes\n"
      "through, Ctrl-C and SIGTERM reach it, and watch exits with its exit status (128 + N when\n"
      "signal N ended it). With --pid, watch stops when the process exits or on Ctrl-C.\n"
      "\n"
      "Examples:\n"
      "  zerowait watch --out runs/before --gpus 8 --gpu-hourly-cost 2.0 -- python train.py\n"
      "  zerowait watch --out runs/after --compare runs/before -- python train.py --workers 8\n"
      "  zerowait watch --pid 4242 --out runs/live");
  return {cmd, [args, cmd]() -> int {
            // Zerowait's own command line for run.json, rebuilt from what was parsed.
            args->argv = {"zerowait", "watch"};
            for (const CLI::Option* option : cmd->get_options()) {
              if (option->get_name() == "CMD" || option->count() == 0) continue;
              args->argv.push_back(option->get_name());
              if (option->get_type_size() != 0) {
                for (const std::string& value : option->results()) args->argv.push_back(value);
              }
            }
            if (!args->command.empty()) args->argv.push_back("--");
            for (const std::string& word : args->command) args->argv.push_back(word);
            return run_watch(*args);
          }};
}

}  // namespace zerowait::cli
