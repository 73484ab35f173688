#include "diagnose/bench/fio_run.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <utility>

#include "common/file.hpp"

extern char** environ;

namespace zerowait::internal::bench {

// Runs argv[0] (found on PATH) with stdin from /dev/null and `env` (empty: this process's),
// collecting stdout and stderr. Kills it (kCancelled) when `stop` is set and
// (kDeadlineExceeded) after `timeout_s`. kNotFound when it cannot be started.
Result<ProcessOutput> run_process(const std::vector<std::string>& argv, double timeout_s,
                                  const std::atomic<bool>* stop,
                                  const std::vector<std::string>& env) {
  int out_pipe[2];
  int err_pipe[2];
  if (::pipe2(out_pipe, O_CLOEXEC) != 0)
    return errno_status(errno, "cannot create a pipe for", argv[0]);
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
      stop_reason =
          Status(ErrorCode::kDeadlineExceeded, "'" + argv[0] + "' did not finish within " +
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
  result.exit_code =
      WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
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
                           const std::string& file, uint64_t size, double runtime_s, double ramp_s,
                           const std::atomic<bool>* stop) {
  std::vector<std::string> argv = {fio_command};
  for (std::string& a : fio_job_arguments(job, file, size, runtime_s, ramp_s)) {
    argv.push_back(std::move(a));
  }
  ZW_ASSIGN_OR_RETURN(ProcessOutput output, run_process(argv, ramp_s + runtime_s + kFioGraceSeconds,
                                                        stop, fio_environment()));
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

}  // namespace zerowait::internal::bench
