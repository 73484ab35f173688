// Machine-wide checks: limits and CPU (open files, CPU count, cgroup quota, frequency governor)
// and io_uring (the sysctl, seccomp, a real ring). Memory is memory_checks.cpp.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "diagnose/doctor/mounts.hpp"
#include "diagnose/doctor/checks.hpp"

namespace zerowait::doctor {
namespace {

void check_open_files(const System& system, const DoctorOptions& options, FindingList& findings) {
  const std::optional<Limit> limit = system.open_files_limit();
  const uint64_t need = 256 + uint64_t(options.planned_workers) * 64;
  const std::string need_text = std::to_string(need) + " (256 + " +
                                std::to_string(options.planned_workers) + " workers x 64)";
  if (!limit) {
    findings.add("open_files", Severity::kInfo, "open files limit not measured").evidence =
        "getrlimit(RLIMIT_NOFILE): not available";
    return;
  }
  const std::string evidence = "getrlimit(RLIMIT_NOFILE): soft " + limit_text(limit->soft) +
                               ", hard " + limit_text(limit->hard) + "; needed " + need_text;
  if (limit->soft >= need) {
    findings.add("open_files", Severity::kOk, "ulimit -n " + limit_text(limit->soft)).evidence =
        evidence;
    return;
  }
  Finding& f = findings.add("open_files", Severity::kFail,
                            "ulimit -n " + limit_text(limit->soft) + " with " +
                                std::to_string(options.planned_workers) + " workers, below " +
                                std::to_string(need));
  f.evidence = evidence;
  f.why = "\"Too many open files\" once shards, worker pipes and sockets are open";
  if (limit->hard < need) {
    f.summary += "; the hard limit " + limit_text(limit->hard) + " too";
    f.fix = "raise the hard limit: \"* - nofile 65536\" in /etc/security/limits.conf, systemd "
            "LimitNOFILE=65536, or docker run --ulimit nofile=65536:65536; then ulimit -n 65536";
  } else {
    f.fix = "ulimit -n " + limit_text(std::min<uint64_t>(limit->hard, 65536)) +
            " (the hard limit allows it)";
  }
}

void check_file_max(const System& system, FindingList& findings) {
  const std::optional<int64_t> max = system.read_int("/proc/sys/fs/file-max");
  const std::optional<int64_t> allocated = system.read_int("/proc/sys/fs/file-nr");
  if (!max || !allocated || *max <= 0) {
    Finding& f = findings.add("file_max", Severity::kInfo, "system-wide open files not known");
    f.evidence = "/proc/sys/fs/file-max, /proc/sys/fs/file-nr: absent";
    for (const char* file : {"/proc/sys/fs/file-max", "/proc/sys/fs/file-nr"}) {
      if (system.denied(file)) {
        not_readable(f, "system-wide open files", file);
        break;
      }
    }
    return;
  }
  const double share = double(*allocated) / double(*max);
  Finding& f = findings.add("file_max", share > 0.80 ? Severity::kWarn : Severity::kOk,
                            format_number(uint64_t(*allocated)) + " files open system-wide of " +
                                format_number(uint64_t(*max)) + " (" + format_percent(share) +
                                " %)");
  f.evidence = "/proc/sys/fs/file-nr: " + std::to_string(*allocated) +
               " allocated; /proc/sys/fs/file-max: " + std::to_string(*max);
  if (f.severity == Severity::kOk) return;
  f.why = "past fs.file-max every process gets ENFILE: shard opens and new workers fail";
  f.fix = "sysctl -w fs.file-max=" + std::to_string(uint64_t(*max) * 2) +
          "; find the holders: ls /proc/*/fd | wc -l";
}

// The CPUs a list like "0-15,32-47" names.
unsigned count_cpu_list(const std::string& list) {
  unsigned count = 0;
  std::istringstream ranges(list);
  for (std::string range; std::getline(ranges, range, ',');) {
    const size_t dash = range.find('-');
    const long first = std::strtol(range.c_str(), nullptr, 10);
    const long last = dash == std::string::npos ? first : std::strtol(range.c_str() + dash + 1,
                                                                      nullptr, 10);
    if (!range.empty() && last >= first) count += unsigned(last - first + 1);
  }
  return count;
}

// The CPUs the process may use: its affinity, else the online count; nullopt when neither.
std::optional<unsigned> check_cpu_count(const System& system, FindingList& findings) {
  const std::optional<unsigned> usable = system.usable_cpus();
  const std::optional<std::string> online = system.read_line("/sys/devices/system/cpu/online");
  const std::optional<unsigned> online_count =
      online ? std::optional<unsigned>(count_cpu_list(*online)) : std::nullopt;
  std::string summary =
      usable ? std::to_string(*usable) + " usable CPUs" : std::string("usable CPUs not known");
  if (online_count) summary += " of " + std::to_string(*online_count) + " online";
  findings.add("count", Severity::kInfo, summary).evidence =
      "sched_getaffinity: " + (usable ? std::to_string(*usable) : std::string("not available")) +
      "; /sys/devices/system/cpu/online: " +
      online.value_or(system.denied("/sys/devices/system/cpu/online") ? kNotReadable : "absent");
  return usable ? usable : online_count;
}

// A CPU quota, in CPUs, and where it was read.
struct CpuQuota {
  double cpus = 0;
  std::string evidence;
};

// Where cgroup `path` lives: the mount point of its hierarchy (cgroup2, or cgroup with
// `controller`; `fallback` when mountinfo lists none) and the path below it.
std::pair<std::string, std::string> cgroup_location(const std::vector<Mount>& mounts,
                                                    const std::string& fstype,
                                                    const char* controller,
                                                    const std::string& fallback,
                                                    std::string path) {
  for (auto it = mounts.rbegin(); it != mounts.rend(); ++it) {
    if (it->fstype != fstype || (controller != nullptr && !it->has_option(controller))) continue;
    // A container may see its own cgroup mounted with root /docker/ID, listed under that path.
    if (it->root != "/" && path.rfind(it->root, 0) == 0) path.erase(0, it->root.size());
    return {it->mount_point, path.empty() ? "/" : path};
  }
  return {fallback, path};
}

// The tightest quota from `dir` up to the hierarchy's root: limits nest, the smallest wins.
// Quota files this user may not read are added to `denied`.
std::optional<CpuQuota> tightest_quota(const System& system, std::string base, std::string path,
                                       bool v2, std::vector<std::string>& denied) {
  const auto note_denied = [&](const std::string& file) {
    if (system.denied(file)) denied.push_back(file);
  };
  std::optional<CpuQuota> tightest;
  while (true) {
    const std::string dir = base + (path == "/" ? "" : path);
    std::optional<double> quota, period;
    std::string evidence;
    if (v2) {
      const std::optional<std::string> line = system.read_line(dir + "/cpu.max");
      if (!line) note_denied(dir + "/cpu.max");
      std::istringstream fields(line.value_or(""));
      std::string max_text;
      double period_value = 0;
      if (fields >> max_text >> period_value && max_text != "max" && period_value > 0) {
        quota = std::strtod(max_text.c_str(), nullptr);
        period = period_value;
        evidence = dir + "/cpu.max: " + *line;
      }
    } else {
      const std::optional<int64_t> quota_us = system.read_int(dir + "/cpu.cfs_quota_us");
      const std::optional<int64_t> period_us = system.read_int(dir + "/cpu.cfs_period_us");
      if (!quota_us) note_denied(dir + "/cpu.cfs_quota_us");
      if (quota_us && period_us && *quota_us > 0 && *period_us > 0) {
        quota = double(*quota_us);
        period = double(*period_us);
        evidence = dir + "/cpu.cfs_quota_us: " + std::to_string(*quota_us) +
                   ", cpu.cfs_period_us: " + std::to_string(*period_us);
      }
    }
    if (quota && (!tightest || *quota / *period < tightest->cpus)) {
      tightest = CpuQuota{*quota / *period, evidence};
    }
    if (path.empty() || path == "/") break;
    const size_t slash = path.rfind('/');
    path = slash == 0 || slash == std::string::npos ? "/" : path.substr(0, slash);
  }
  return tightest;
}

void check_cgroup_quota(const System& system, const std::vector<Mount>& mounts,
                        std::optional<unsigned> cpus, FindingList& findings) {
  const std::optional<std::string> cgroups = system.read("/proc/self/cgroup");
  if (!cgroups) {
    Finding& f = findings.add("cgroup_quota", Severity::kInfo, "could not read /proc/self/cgroup");
    f.evidence = "/proc/self/cgroup: absent";
    if (system.denied("/proc/self/cgroup")) not_readable(f, "CPU quota", "/proc/self/cgroup");
    return;
  }
  // "hierarchy:controllers:path"; v2 is "0::/path", v1's CPU controller "4:cpu,cpuacct:/path".
  std::optional<CpuQuota> quota;
  std::string looked_at;
  std::vector<std::string> denied;
  std::istringstream lines(*cgroups);
  for (std::string line; std::getline(lines, line);) {
    const size_t first = line.find(':'), second = line.find(':', first + 1);
    if (first == std::string::npos || second == std::string::npos) continue;
    const std::string controllers = "," + line.substr(first + 1, second - first - 1) + ",";
    const std::string path = line.substr(second + 1);
    const bool v2 = line.compare(0, 3, "0::") == 0;
    if (!v2 && controllers.find(",cpu,") == std::string::npos) continue;
    const std::string fallback = v2 ? "/sys/fs/cgroup"
                                 : system.exists("/sys/fs/cgroup/cpu,cpuacct")
                                     ? "/sys/fs/cgroup/cpu,cpuacct"
                                     : "/sys/fs/cgroup/cpu";
    const auto [base, relative] = cgroup_location(mounts, v2 ? "cgroup2" : "cgroup",
                                                  v2 ? nullptr : "cpu", fallback, path);
    const std::optional<CpuQuota> found = tightest_quota(system, base, relative, v2, denied);
    looked_at += (looked_at.empty() ? "" : ", ") + base + (relative == "/" ? "" : relative) +
                 (v2 ? "/cpu.max" : "/cpu.cfs_quota_us");
    if (found && (!quota || found->cpus < quota->cpus)) quota = found;
  }
  // A quota file this user may not read could hold the tightest quota: no "ok" then.
  if (!quota && !denied.empty()) {
    not_readable(findings.add("cgroup_quota", Severity::kInfo, ""), "CPU quota", denied.front());
    return;
  }
  if (!quota) {
    findings.add("cgroup_quota", Severity::kOk, "no CPU quota").evidence =
        "/proc/self/cgroup: " + (looked_at.empty() ? "no cpu controller" : looked_at) +
        " (and parents): no quota";
    return;
  }
  const std::string quota_text = format_fixed(quota->cpus, 1) + " CPUs";
  if (!cpus || quota->cpus >= double(*cpus)) {
    Finding& f = findings.add("cgroup_quota", denied.empty() ? Severity::kOk : Severity::kInfo,
                              "CPU quota " + quota_text);
    f.evidence = quota->evidence;
    if (!denied.empty()) {
      f.summary += " (" + denied.front() + " " + kNotReadable + ": a tighter one may be there)";
      f.evidence += "; " + denied.front() + ": " + kNotReadable;
    }
    return;
  }
  const unsigned threads = std::max(1u, unsigned(quota->cpus));
  Finding& f = findings.add("cgroup_quota", Severity::kWarn,
                            "CPU quota " + quota_text + ", below the " + std::to_string(*cpus) +
                                " usable CPUs");
  f.evidence = quota->evidence;
  f.why = "thread pools sized by the CPU count run out of quota each period and are throttled: "
          "the loader stalls in bursts";
  f.fix = "size the loader to the quota: Loader(threads=" + std::to_string(threads) +
          "), or raise the quota (docker run --cpus, Kubernetes resources.limits.cpu)";
}

void check_governor(const System& system, FindingList& findings) {
  std::map<std::string, unsigned> governors;  // "powersave (acpi-cpufreq)" -> CPUs
  std::string slow_example;
  unsigned slow = 0, seen = 0;
  std::vector<std::string> denied;  // governor files this user may not read
  for (const std::string& name : system.list("/sys/devices/system/cpu")) {
    const auto is_digit = [](unsigned char c) { return std::isdigit(c) != 0; };
    if (name.size() < 4 || name.compare(0, 3, "cpu") != 0 ||
        !std::all_of(name.begin() + 3, name.end(), is_digit)) {
      continue;  // cpufreq, cpuidle, online...
    }
    const std::string dir = "/sys/devices/system/cpu/" + name + "/cpufreq/";
    const std::optional<std::string> governor = system.read_line(dir + "scaling_governor");
    if (!governor) {
      if (system.denied(dir + "scaling_governor")) denied.push_back(dir + "scaling_governor");
      continue;
    }
    const std::string driver = system.read_line(dir + "scaling_driver").value_or("?");
    ++seen;
    ++governors[*governor + " (" + driver + ")"];
    // intel_pstate and amd-pstate-epp run "powersave" as a dynamic policy; others pin it low.
    if (*governor == "powersave" && driver != "intel_pstate" && driver != "amd-pstate-epp") {
      if (slow++ == 0) {
        slow_example = dir + "scaling_governor: powersave; scaling_driver: " + driver;
      }
    }
  }
  if (seen == 0) {
    Finding& f = findings.add("governor", Severity::kInfo, "no cpufreq (virtual machine?)");
    f.evidence = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor: absent";
    if (!denied.empty()) not_readable(f, "CPU frequency governor", denied.front());
    if (denied.empty() && system.denied("/sys/devices/system/cpu")) {
      not_readable(f, "CPU frequency governor", "/sys/devices/system/cpu");
    }
    return;
  }
  std::string summary;
  for (const auto& [governor, count] : governors) {
    summary += (summary.empty() ? "" : ", ") + governor + " on " + std::to_string(count) +
               (count == 1 ? " CPU" : " CPUs");
  }
  // CPUs whose governor could not be read are not judged "ok".
  const Severity fine = denied.empty() ? Severity::kOk : Severity::kInfo;
  if (!denied.empty()) {
    summary += "; " + std::to_string(denied.size()) + " CPUs' governor " + kNotReadable;
  }
  Finding& f = findings.add("governor", slow ? Severity::kWarn : fine, summary);
  f.evidence = slow ? slow_example + " (" + std::to_string(slow) + " of " + std::to_string(seen) +
                          " CPUs)"
                    : "/sys/devices/system/cpu/cpu*/cpufreq: " + summary;
  if (!denied.empty()) f.evidence += "; " + denied.front() + ": " + kNotReadable;
  if (!slow) return;
  f.why = "the powersave governor keeps CPUs at their lowest frequency: decode and collation "
          "run slower than the GPU consumes";
  f.fix = "cpupower frequency-set -g performance";
}

}  // namespace

void check_limits_and_cpu(const System& system, const DoctorOptions& options,
                          std::vector<Finding>& out) {
  FindingList limits(out, "limits");
  check_open_files(system, options, limits);
  check_file_max(system, limits);
  FindingList cpu(out, "cpu");
  const std::optional<unsigned> cpus = check_cpu_count(system, cpu);
  const std::vector<Mount> mounts =
      parse_mountinfo(system.read("/proc/self/mountinfo").value_or(""));
  check_cgroup_quota(system, mounts, cpus, cpu);
  check_governor(system, cpu);
}

void check_io_uring(const System& system, std::vector<Finding>& out) {
  FindingList findings(out, "io_uring");
  const std::optional<ProbeResult> setup = system.io_uring_setup();
  const bool setup_failed = setup && !setup->ok;
  const char* kFallback = "zerowait falls back to a pread thread pool: fewer reads in flight, "
                          "no cancellation at deadlines";

  constexpr const char* kSysctl = "/proc/sys/kernel/io_uring_disabled";
  const std::optional<int64_t> disabled = system.read_int(kSysctl);
  if (!disabled && system.denied(kSysctl)) {
    not_readable(findings.add("sysctl", Severity::kInfo, ""), "io_uring_disabled", kSysctl);
  } else if (!disabled) {
    findings.add("sysctl", Severity::kOk, "no io_uring_disabled sysctl (kernel without the knob)")
        .evidence = std::string(kSysctl) + ": absent";
  } else {
    const Severity severity = *disabled == 0   ? Severity::kOk
                              : *disabled == 1 ? Severity::kWarn
                                               : Severity::kFail;
    Finding& f = findings.add("sysctl", severity,
                              *disabled == 0   ? "io_uring enabled"
                              : *disabled == 1 ? "io_uring limited to kernel.io_uring_group"
                                               : "io_uring disabled by sysctl");
    f.evidence = std::string(kSysctl) + ": " + std::to_string(*disabled);
    if (severity != Severity::kOk) {
      f.why = kFallback;
      f.fix = "sysctl -w kernel.io_uring_disabled=0";
    }
  }

  const std::optional<std::string> status = system.read("/proc/self/status");
  std::string seccomp;
  if (status) {
    const size_t at = status->find("\nSeccomp:");
    if (at != std::string::npos) {
      std::istringstream(status->substr(at + 9)) >> seccomp;
    }
  }
  if (seccomp.empty()) {
    Finding& f = findings.add("seccomp", Severity::kInfo, "seccomp mode not known");
    f.evidence = "/proc/self/status: no Seccomp line";
    if (!status && system.denied("/proc/self/status")) {
      not_readable(f, "seccomp mode", "/proc/self/status");
    }
  } else if (seccomp == "0") {
    findings.add("seccomp", Severity::kOk, "no seccomp filter").evidence =
        "/proc/self/status: Seccomp: 0";
  } else {
    Finding& f = findings.add("seccomp", setup_failed ? Severity::kWarn : Severity::kInfo,
                              seccomp == "2" ? "a seccomp filter is active (container profile)"
                                             : "seccomp strict mode");
    f.evidence = "/proc/self/status: Seccomp: " + seccomp;
    if (setup_failed) {
      f.why = std::string("the filter may be what refuses io_uring_setup; ") + kFallback;
      f.fix = "docker run --security-opt seccomp=<profile allowing io_uring_setup, "
              "io_uring_enter, io_uring_register>";
    }
  }

  if (!setup) {
    findings.add("setup", Severity::kInfo, "io_uring setup not measured").evidence =
        "io_uring_setup: not available";
  } else if (setup->ok) {
    findings.add("setup", Severity::kOk, "io_uring works").evidence = setup->detail;
  } else {
    Finding& f = findings.add("setup", Severity::kWarn, "io_uring_setup fails");
    f.evidence = setup->detail;
    f.why = kFallback;
    f.fix = setup->detail.rfind("ENOSYS", 0) == 0
                ? "a kernel with io_uring (Linux >= 5.6, CONFIG_IO_URING=y)"
                : "sysctl -w kernel.io_uring_disabled=0, or docker run --security-opt "
                  "seccomp=<profile allowing io_uring_setup, io_uring_enter, io_uring_register>";
  }
}

}  // namespace zerowait::doctor
