// Finding, probing and exec-ing the Python interpreter of python_module.hpp.
#include "python_module.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>

#include "output.hpp"

extern char** environ;

namespace zerowait::cli {
namespace {

// Exit statuses of the probe script: which import the interpreter lacks. find_spec does not
// import torch itself (seconds); it does import the zerowait package, whose errors then show.
constexpr int kNoTorch = 10;
constexpr int kNoModule = 11;

std::string probe_script(const std::string& module) {
  return "import importlib.util as u, sys\n"
         "sys.exit(10 if u.find_spec('torch') is None else\n"
         "         11 if u.find_spec('" + module + "') is None else 0)\n";
}

struct Interpreter {
  std::string path;
  std::string origin;  // how it was found, for messages
};

bool is_executable(const std::string& path) {
  return !path.empty() && ::access(path.c_str(), X_OK) == 0 &&
         !std::filesystem::is_directory(path);
}

// $ZEROWAIT_PYTHON, else the interpreter that launched this command (python -m zerowait, or the
// `zerowait` script of a pip install: python/zerowait/__main__.py names it in
// $ZEROWAIT_LAUNCHER_PYTHON), else python3 on PATH (a development build run by hand). `tried`
// collects what was looked at, for the error message.
std::optional<Interpreter> find_interpreter(std::vector<std::string>* tried) {
  if (const char* chosen = std::getenv("ZEROWAIT_PYTHON"); chosen != nullptr && *chosen != 0) {
    // An explicit choice is never replaced by a guess.
    if (is_executable(chosen)) return Interpreter{chosen, "ZEROWAIT_PYTHON"};
    tried->push_back(std::string("ZEROWAIT_PYTHON=") + chosen + " (not an executable file)");
    return std::nullopt;
  }
  tried->push_back("ZEROWAIT_PYTHON (not set)");
  if (const char* launcher = std::getenv("ZEROWAIT_LAUNCHER_PYTHON");
      launcher != nullptr && *launcher != 0) {
    if (is_executable(launcher)) {
      return Interpreter{launcher, "the interpreter that launched zerowait"};
    }
    tried->push_back(std::string("ZEROWAIT_LAUNCHER_PYTHON=") + launcher +
                     " (not an executable file)");
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

// Runs the probe script; returns its exit status (0: ready), or -1 when it did not exit normally.
int probe_interpreter(const Interpreter& python, const std::string& module) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0);
  std::vector<std::string> args = {python.path, "-c", probe_script(module)};
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

Interpreter ready_interpreter(const std::string& module, const std::string& command,
                              const std::string& why) {
  std::vector<std::string> tried;
  const std::optional<Interpreter> python = find_interpreter(&tried);
  const std::string runs_in = command + " runs in Python (" + why + ")";
  if (!python) {
    throw CliError(runs_in + " and found no interpreter; tried " +
                   join_limited(tried, tried.size()) +
                   "; install Python with torch and zerowait (pip install zerowait torch)" +
                   kFix);
  }
  const std::string who = python->path + " (" + python->origin +
                          (tried.empty() ? "" : "; tried first: " +
                                                    join_limited(tried, tried.size())) +
                          ")";
  switch (probe_interpreter(*python, module)) {
    case 0:
      return *python;
    case kNoTorch:
      throw CliError(runs_in + ", and " + who + " has no torch; install it into that "
                     "environment (" + python->path + " -m pip install torch)" + kFix);
    case kNoModule:
      throw CliError(who + " cannot import " + module + "; install zerowait into that "
                     "environment (" + python->path + " -m pip install zerowait)" + kFix);
    default:
      throw CliError(who + " failed to look up torch and " + module + " (its error is above); "
                     "run: " + python->path + " -c 'import torch, " + module + "'");
  }
}

}  // namespace

std::vector<std::string> forwarded_args(const CLI::App& cmd) {
  std::vector<std::string> positionals;
  std::vector<std::string> out;
  for (const CLI::Option* opt : cmd.get_options()) {
    if (opt->count() == 0 || opt->get_name() == "--help") continue;
    std::string value;
    for (const std::string& r : opt->results()) value += (value.empty() ? "" : ",") + r;
    if (opt->get_name().rfind("-", 0) != 0) {  // a positional
      positionals.push_back(value);
      continue;
    }
    out.push_back(opt->get_name());
    if (opt->get_expected_max() == 0) continue;  // a flag
    out.push_back(value);
  }
  positionals.insert(positionals.end(), out.begin(), out.end());
  return positionals;
}

void exec_python_module(const std::string& module, const std::vector<std::string>& args,
                        const std::string& command, const std::string& why) {
  const Interpreter python = ready_interpreter(module, command, why);
  std::vector<std::string> all = {python.path, "-m", module};
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

}  // namespace zerowait::cli
