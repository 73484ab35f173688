// `zerowait doctor [PATH...]`: the machine's configuration that makes GPUs wait, each finding
// with its evidence, why it matters and the fix (the checks: src/diagnose/doctor/).
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "commands.hpp"
#include "output.hpp"
#include "zerowait/diagnose/doctor.hpp"

namespace zerowait::cli {
namespace {

using doctor::Finding;
using doctor::Severity;

struct DoctorArgs {
  std::vector<std::string> paths;
  std::string root;
  unsigned workers = 16;
  bool json = false;
  bool all = false;
};

// The JSON schema (docs/doctor.md): a version string, the counts and one object per finding.
constexpr const char* kSchema = "zerowait.doctor/1";

nlohmann::ordered_json report_json(const doctor::DoctorReport& report, const DoctorArgs& args) {
  nlohmann::ordered_json findings = nlohmann::ordered_json::array();
  for (const Finding& f : report.findings) {
    findings.push_back({{"check", f.check},
                        {"area", f.area},
                        {"subject", f.subject},
                        {"status", doctor::severity_name(f.severity)},
                        {"summary", f.summary},
                        {"evidence", f.evidence},
                        {"why", f.why},
                        {"fix", f.fix}});
  }
  nlohmann::ordered_json counts;
  for (Severity s : {Severity::kFail, Severity::kWarn, Severity::kInfo, Severity::kOk}) {
    counts[doctor::severity_name(s)] = report.count(s);
  }
  return {{"schema", kSchema},
          {"version", ZEROWAIT_VERSION},
          {"root", args.root},
          {"paths", args.paths},
          {"seconds", report.seconds},
          {"failed", report.failed()},
          {"counts", counts},
          {"findings", findings}};
}

const char* status_word(Severity severity) {
  switch (severity) {
    case Severity::kFail:
      return "FAIL";
    case Severity::kWarn:
      return "WARN";
    case Severity::kInfo:
      return "info";
    case Severity::kOk:
      return "ok";
  }
  return "?";
}

void print_finding(const Finding& f, bool details) {
  const std::string word = status_word(f.severity);
  std::cout << "  " << word << std::string(6 - word.size(), ' ') << f.summary;
  if (!f.subject.empty()) std::cout << "  [" << f.subject << "]";
  std::cout << '\n';
  if (!details) return;
  if (!f.evidence.empty()) std::cout << "        evidence: " << f.evidence << '\n';
  if (!f.why.empty()) std::cout << "        why: " << f.why << '\n';
  if (!f.fix.empty()) std::cout << "        fix: " << f.fix << '\n';
}

void print_report(const doctor::DoctorReport& report, bool all) {
  std::string area;
  size_t hidden = 0;
  for (const Finding& f : report.findings) {
    const bool problem = f.severity == Severity::kFail || f.severity == Severity::kWarn;
    if (!all && f.severity == Severity::kOk) {
      ++hidden;
      continue;
    }
    if (f.area != area) {
      area = f.area;
      std::cout << area << '\n';
    }
    print_finding(f, problem || all);
  }
  std::cout << "\n"
            << report.findings.size() << " checks in " << format_duration(report.seconds) << ": "
            << report.count(Severity::kFail) << " fail, " << report.count(Severity::kWarn)
            << " warn, " << report.count(Severity::kInfo) << " info, "
            << report.count(Severity::kOk) << " ok";
  if (hidden != 0) std::cout << " (--all lists the ok ones)";
  std::cout << '\n';
}

}  // namespace

Command add_doctor_command(CLI::App& app) {
  auto args = std::make_shared<DoctorArgs>();
  CLI::App* cmd = app.add_subcommand(
      "doctor", "Find the system settings that make training wait on I/O, and how to fix them");
  cmd->add_option("PATH", args->paths,
                  "Where the job reads data or writes checkpoints (default: current directory)")
      ->type_name("PATH")
      ->check(local_path("PATH", "the doctor checks a mounted file system"));
  cmd->add_option("--workers", args->workers,
                  "Loader threads and workers the job will run (for the open-files check)")
      ->type_name("N")
      ->check(quiet(CLI::Range(1u, 65536u)))
      ->capture_default_str();
  cmd->add_option("--root", args->root,
                  "Read /proc, /sys and the paths under this directory (a fixture tree)")
      ->type_name("DIR")
      ->check(local_path("--root"));
  cmd->add_flag("--all", args->all, "Also list the checks that passed");
  add_json_flag(cmd, &args->json);
  cmd->footer(
      "Checks storage (mount options, NFS, readahead, scheduler, free space and inodes,\n"
      "O_DIRECT, small files), memory (swap, THP, dirty limits, /dev/shm, locked memory),\n"
      "limits and CPU (open files, cgroup quota, governor), io_uring, devices (GPUs, GPUDirect\n"
      "Storage, NUMA placement, PCIe links) and network (MTU, speed, RDMA, NCCL_* variables).\n"
      "Each problem comes with its evidence, why it matters, and a fix.\n"
      "Exit status 3 when a check failed; warnings alone exit 0.\n"
      "\n"
      "Examples:\n"
      "  zerowait doctor /data/train /ckpt\n"
      "  zerowait doctor --json > doctor.json");
  return {cmd, [args]() -> int {
            doctor::DoctorOptions options;
            options.paths = args->paths.empty() ? std::vector<std::string>{"."} : args->paths;
            options.root = args->root;
            options.planned_workers = args->workers;
            // A path that is not there is a mistyped command line, not a finding.
            if (const Status missing = doctor::check_paths_exist(options); !missing.is_ok()) {
              std::cerr << "zerowait: error: " << missing.message() << '\n';
              return kExitUsage;
            }
            const doctor::DoctorReport report = doctor::run_doctor(options);
            if (args->json) {
              print_json(report_json(report, *args));
            } else {
              print_report(report, args->all);
            }
            return report.failed() ? kExitProblems : kExitOk;
          }};
}

}  // namespace zerowait::cli
