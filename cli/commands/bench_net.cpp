// `zerowait bench net`: all-reduce bandwidth, the path MTU between ranks and the halving test.
// The engine is C++, but torch.distributed (gloo, NCCL, DDP) is only reachable from Python, so
// this command checks its options, finds an interpreter with torch and execs
// `python -m zerowait.bench_net` with them (python/zerowait/bench_net.py does the work).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "commands.hpp"
#include "output.hpp"

extern char** environ;

namespace zerowait::cli {
namespace {

constexpr const char* kModule = "zerowait.bench_net";
// Exit statuses of kProbeScript: which import the interpreter lacks. find_spec does not import
// torch itself (seconds); it does import the zerowait package, whose errors then show.
constexpr int kNoTorch = 10;
constexpr int kNoModule = 11;
constexpr const char* kProbeScript =
    "import importlib.util as u, sys\n"
    "sys.exit(10 if u.find_spec('torch') is None else\n"
    "         11 if u.find_spec('zerowait.bench_net') is None else 0)\n";

struct Interpreter {
  std::string path;
  std::string origin;  // how it was found, for messages
};

bool is_executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0 &&
         !std::filesystem::is_directory(path);
}

// $ZEROWAIT_PYTHON, else python3 beside this executable (the .venv/bin of a pip install), else
// python3 on PATH. `tried` collects what was looked at, for the error message.
std::optional<Interpreter> find_interpreter(std::vector<std::string>* tried) {
  if (const char* chosen = std::getenv("ZEROWAIT_PYTHON"); chosen != nullptr && *chosen != 0) {
    // An explicit choice is never replaced by a guess.
    if (is_executable(chosen)) return Interpreter{chosen, "ZEROWAIT_PYTHON"};
    tried->push_back(std::string("ZEROWAIT_PYTHON=") + chosen + " (not an executable file)");
    return std::nullopt;
  }
  tried->push_back("ZEROWAIT_PYTHON (not set)");
  std::error_code error;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    const std::string beside = (self.parent_path() / "python3").string();
    if (is_executable(beside)) return Interpreter{beside, "next to " + self.string()};
    tried->push_back(beside + " (does not exist)");
  }
  const char* path_env = std::getenv("PATH");
  std::string dirs = path_env != nullptr ? path_env : "";
  size_t start = 0;
  while (start <= dirs.size()) {
    const size_t end = std::min(dirs.find(':', start), dirs.size());
    const std::string dir = dirs.substr(start, end - start);
    const std::string candidate = (dir.empty() ? "." : dir) + "/python3";
    if (is_executable(candidate)) return Interpreter{candidate, "python3 on PATH"};
    start = end + 1;
  }
  tried->push_back("python3 on PATH (not found)");
  return std::nullopt;
}

// Runs kProbeScript; returns its exit status (0: ready), or -1 when it did not exit normally.
int probe_interpreter(const Interpreter& python) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {python.path, "-c", kProbeScript};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int spawn_error =
      posix_spawn(&pid, python.path.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawn_error != 0) {
    throw CliError("cannot run " + python.path + " (" + python.origin +
                   "): " + std::strerror(spawn_error));
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw CliError(std::string("waitpid: ") + std::strerror(errno));
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const std::string kFix = ", or set ZEROWAIT_PYTHON to an interpreter that has torch and zerowait";

Interpreter ready_interpreter() {
  std::vector<std::string> tried;
  const std::optional<Interpreter> python = find_interpreter(&tried);
  if (!python) {
    throw CliError("zerowait bench net runs in Python (torch.distributed) and found no "
                   "interpreter; tried " + join_limited(tried, tried.size()) +
                   "; install Python with torch and zerowait (pip install zerowait torch)" +
                   kFix);
  }
  const std::string who = python->path + " (" + python->origin +
                          (tried.empty() ? "" : "; tried first: " +
                                                    join_limited(tried, tried.size())) +
                          ")";
  switch (probe_interpreter(*python)) {
    case 0:
      return *python;
    case kNoTorch:
      throw CliError("zerowait bench net runs in Python (torch.distributed), and " + who +
                     " has no torch; install it into that environment (" + python->path +
                     " -m pip install torch)" + kFix);
    case kNoModule:
      throw CliError(who + " cannot import " + kModule + "; install zerowait into that "
                     "environment (" + python->path + " -m pip install zerowait)" + kFix);
    default:
      throw CliError(who + " failed to look up torch and " + kModule + " (its error is above); "
                     "run: " + python->path + " -c 'import torch, zerowait.bench_net'");
  }
}

// The options as the user gave them (after CLI11's checks and size transforms), for the Python
// module; options left out keep the module's defaults.
std::vector<std::string> forwarded_args(const CLI::App& cmd) {
  std::vector<std::string> out;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() == 0 || opt->get_name() == "--help") continue;
    out.push_back(opt->get_name());
    if (opt->get_expected_max() == 0) continue;  // a flag
    std::string value;
    for (const std::string& r : opt->results()) value += (value.empty() ? "" : ",") + r;
    out.push_back(value);
  }
  return out;
}

[[noreturn]] void exec_module(const Interpreter& python, const std::vector<std::string>& args) {
  std::vector<std::string> all = {python.path, "-m", kModule};
  all.insert(all.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : all) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::cout.flush();
  std::cerr.flush();
  ::execv(python.path.c_str(), argv.data());
  throw CliError("cannot run " + python.path + " (" + python.origin +
                 "): " + std::strerror(errno));
}

// Values live in the Python module (its argparse defaults); these hold the parse only.
struct NetArgs {
  unsigned ranks = 0;
  std::string backend;
  std::vector<std::string> sizes;
  unsigned iters = 0, warmup = 0, workers = 0, batch_size = 0, steps = 0;
  double compute_ms = 0, sample_ms = 0, timeout = 0;
  uint64_t grad_bytes = 0;
  std::string data;
  bool no_mtu_probe = false, halving = false, json = false;
};

}  // namespace

Command add_bench_net_command(CLI::App& bench) {
  auto args = std::make_shared<NetArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "net", "All-reduce bandwidth, path MTU between ranks, and what bounds a training step");
  cmd->add_option("--ranks", args->ranks, "Local ranks to start when not under torchrun")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("2");
  cmd->add_option("--backend", args->backend,
                  "auto: nccl when CUDA is available (a GPU per local rank), else gloo")
      ->type_name("auto|gloo|nccl")
      ->check(quiet(CLI::IsMember({"auto", "gloo", "nccl"})))
      ->default_str("auto");
  cmd->add_option("--sizes", args->sizes, "All-reduce message sizes")
      ->type_name("SIZE,...")
      ->delimiter(',')
      ->transform(quiet(CLI::AsSizeValue(false)))
      ->check(integer_at_least(1))
      ->default_str("4K,64K,1M,16M,64M");
  cmd->add_option("--iters", args->iters, "Timed all-reduces per size")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("20");
  cmd->add_option("--warmup", args->warmup, "Untimed all-reduces per size before those")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->default_str("5");
  cmd->add_option("--compute-ms", args->compute_ms, "Compute per step beside the all-reduce")
      ->type_name("MS")
      ->check(quiet(CLI::NonNegativeNumber))
      ->default_str("100");
  add_size_option(cmd, "--grad-bytes", &args->grad_bytes, "Gradient bytes all-reduced per step")
      ->default_str("100M");
  cmd->add_flag("--no-mtu-probe", args->no_mtu_probe, "Skip the path-MTU probe between ranks");
  cmd->add_flag("--halving", args->halving,
                "Also time a DDP step with its input, without it, and without the all-reduce");
  cmd->add_option("--data", args->data,
                  "--halving input: a zerowait dataset (zerowait.Loader) or a directory of files "
                  "(torch DataLoader)")
      ->type_name("PATH");
  cmd->add_option("--workers", args->workers, "--halving input workers")
      ->type_name("N")
      ->check(integer_at_least(0))
      ->default_str("2");
  cmd->add_option("--batch-size", args->batch_size, "--halving samples per batch")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("8");
  cmd->add_option("--steps", args->steps, "--halving timed steps per variant")
      ->type_name("N")
      ->check(integer_at_least(1))
      ->default_str("20");
  cmd->add_option("--sample-ms", args->sample_ms,
                  "--halving without --data: what each synthetic sample costs")
      ->type_name("MS")
      ->check(quiet(CLI::NonNegativeNumber))
      ->default_str("2");
  cmd->add_option("--timeout", args->timeout, "Seconds a rank waits for a peer before failing")
      ->type_name("S")
      ->check(quiet(CLI::PositiveNumber))
      ->default_str("120");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Under torchrun (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT set) this process is one rank\n"
      "of that launch; otherwise it starts --ranks processes on 127.0.0.1. Rank 0 prints:\n"
      "  - all-reduce time, algbw and busbw (= algbw * 2(n-1)/n, as nccl-tests) per size, and\n"
      "    the share of a step that --grad-bytes all-reduced beside --compute-ms would take;\n"
      "  - the path MTU each way between rank 0 and every rank on another host (UDP with the\n"
      "    don't-fragment bit), naming a mismatch and the `ip link set ... mtu` that fixes it;\n"
      "  - with --halving: the step time with the input, without it and without the all-reduce,\n"
      "    and a verdict: input-, communication- or compute-bound (10 % threshold).\n"
      "Runs python -m zerowait.bench_net in $ZEROWAIT_PYTHON, else the python3 beside this\n"
      "executable, else python3 on PATH; it needs torch. Exit status 3 on an MTU mismatch.\n"
      "\n"
      "Examples:\n"
      "  zerowait bench net --sizes 1M,64M --iters 10\n"
      "  torchrun --nnodes 2 --nproc-per-node 8 ... -m zerowait.bench_net --halving --data /d");
  return {cmd, [cmd]() -> int {
            const Interpreter python = ready_interpreter();
            exec_module(python, forwarded_args(*cmd));
          }};
}

}  // namespace zerowait::cli
