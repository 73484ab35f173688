// `zerowait watch`: where a training job's seconds go, seen from outside. Parses the command
// line and prints the summary; starting or following the job, sampling, attribution and the run
// directory are observe::watch_job (src/observe/watch.cpp).
#include <sys/types.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "observe/report_text.hpp"
#include "zerowait/observe/activity.hpp"
#include "zerowait/observe/attribution.hpp"
#include "zerowait/observe/causes.hpp"
#include "zerowait/observe/cost.hpp"
#include "zerowait/observe/system_sampler.hpp"
#include "zerowait/observe/watch.hpp"
#include "zerowait/observe/watch_run.hpp"

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

// $1,234,567 for large sums, $76.80 below a thousand.
std::string money(double value) { return observe::format_money(value, 1000); }

std::string percent(double share) { return format_fixed(share * 100, 1) + "%"; }

void print_summary(const observe::WatchRun& run, const std::string& out_dir, double t0) {
  const observe::Attribution& a = run.attribution;
  std::cout << "\nzerowait watch: " << run.title << "\n  " << format_duration(run.duration_s)
            << ", " << count_noun(a.classified, "sample", "samples") << " of the main thread";
  if (run.startup_s > 0 || run.shutdown_s > 0) {
    std::cout << ";\n  start-up " << format_duration(run.startup_s) << " and shutdown "
              << format_duration(run.shutdown_s)
              << " (before and after the data pipeline ran) are not in the shares";
  }
  std::cout << "\n";
  if (!run.degraded.empty()) std::cout << "  degraded: " << run.degraded << '\n';
  std::cout << '\n';
  Table table({{"cause"}, {"share", Align::kRight}, {"seconds", Align::kRight}});
  for (observe::Activity activity : observe::kActivities) {
    const std::string cause = observe::activity_name(activity);
    table.add_row({cause, percent(a.shares.at(cause)), format_fixed(a.seconds.at(cause), 2)});
  }
  table.print(std::cout);
  if (run.failed) {
    // A job that died is no measurement of its steady state: no verdict, no price.
    std::cout << "\nthe job failed: exit status " << *run.exit_code << " after "
              << format_duration(run.duration_s) << "; no verdict or cost for a failed run\n";
    std::cout << "run written to " << out_dir << " (run.json, system.jsonl)\n";
    return;
  }
  std::cout << "\nverdict: " << a.verdict << '\n';
  for (const observe::WatchAdvice& advice : run.advice) {
    std::cout << "change: " << advice.summary << '\n';
  }
  if (!a.events.empty()) {
    std::vector<observe::DropEvent> top = a.events;
    std::stable_sort(top.begin(), top.end(), [](const auto& x, const auto& y) {
      return x.depth > y.depth;
    });
    constexpr size_t kShown = 3;  // the rest are in run.json
    if (top.size() > kShown) {
      std::cout << "drops (" << kShown << " deepest of " << a.events.size()
                << "; all in run.json):\n";
    } else {
      std::cout << "drops (" << a.events.size() << ", deepest first):\n";
    }
    for (size_t i = 0; i < top.size() && i < kShown; ++i) {
      std::cout << "  at " << format_fixed(top[i].t - t0, 1) << " s: " << top[i].what
                << "; before: " << top[i].before << '\n';
    }
  }
  if (run.cost) {
    // The largest wait, priced; then every wait together.
    std::string cause;
    for (const char* c : observe::kCauses) {
      const auto it = run.cost->per_day.find(c);
      if (!observe::is_wait(c) || it == run.cost->per_day.end()) continue;
      if (cause.empty() || it->second > run.cost->per_day.at(cause)) cause = c;
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
  observe::WatchOptions options;
  options.command = args.command;
  options.pid = pid_t(args.pid);
  options.interval = args.interval;
  options.gpus = args.gpus;
  options.gpu_hourly_cost = args.gpu_hourly_cost;
  options.compare = args.compare;
  options.out = args.out;
  options.argv = args.argv;
  const observe::WatchResult result = unwrap(observe::watch_job(options));
  if (args.json) {
    std::cout << observe::watch_run_json(result.run);
  } else {
    print_summary(result.run, result.out_dir, result.t0);
  }
  return result.exit_code;
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
      "(a sleep standing for the GPU) or in a CUDA ioctl is compute; reading files, waiting\n"
      "on a pipe from child processes (DataLoader workers), or unpickling a batch from them\n"
      "(a new unix socket to a child) is input; writing, fsync and rename of files is\n"
      "checkpoint; sockets are communication; the rest is other. Start-up (until worker\n"
      "processes or zerowait loader threads first run) and shutdown (after they last ran)\n"
      "are timed apart, not in the shares.\n"
      "Without ptrace rights over the job only its state is seen (degraded, said once).\n"
      "Beside it, the machine's CPU, memory, swap, disks' queue and latency, GPU utilisation.\n"
      "The verdict names a wait of 25 % or more (input-bound...), else compute-bound at 60 %\n"
      "compute; drops of compute come with what the disks, swap and writes did just before.\n"
      "\n"
      "Writes RUN/run.json and RUN/system.jsonl (docs/observe.md). With --gpus and\n"
      "--gpu-hourly-cost the waits are priced; --compare BEFORE_RUN says how much less GPU time\n"
      "the same work takes now (1 - compute share before / after). The job's stdio passes\n"
      "through, Ctrl-C and SIGTERM reach it, and watch exits with its exit status (128 + N when\n"
      "signal N ended it); a job that exits non-zero is reported failed, without verdict or\n"
      "cost. With --pid, watch stops when the process exits or on Ctrl-C.\n"
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
