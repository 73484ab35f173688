#include "zerowait/diagnose/doctor.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <filesystem>

#include "common/clock.hpp"
#include "diagnose/doctor/checks.hpp"

namespace zerowait::doctor {

const char* severity_name(Severity severity) {
  switch (severity) {
    case Severity::kOk:
      return "ok";
    case Severity::kInfo:
      return "info";
    case Severity::kWarn:
      return "warn";
    case Severity::kFail:
      return "fail";
  }
  return "?";
}

size_t DoctorReport::count(Severity severity) const {
  return size_t(std::count_if(findings.begin(), findings.end(),
                              [severity](const Finding& f) { return f.severity == severity; }));
}

Status check_paths_exist(const DoctorOptions& options) {
  const System system(options.root);
  for (const std::string& path : options.paths) {
    std::error_code error;
    const std::filesystem::file_status status =
        std::filesystem::symlink_status(system.host_path(system.machine_path(path)), error);
    // A path under a directory this user may not search is there: the doctor says so itself.
    if (!std::filesystem::exists(status) && !(error && error.value() == EACCES)) {
      return not_found("'" + path + "' does not exist" +
                       (options.root.empty() ? "" : " under " + options.root) +
                       ": give the directory the job reads data from or writes checkpoints to");
    }
  }
  return Status::ok();
}

DoctorReport run_doctor(const DoctorOptions& options) {
  const auto start = std::chrono::steady_clock::now();
  const System system(options.root);
  DoctorReport report;
  check_storage(system, options, report.findings);
  check_memory(system, report.findings);
  check_limits_and_cpu(system, options, report.findings);
  check_io_uring(system, report.findings);
  check_devices(system, report.findings);
  check_network(system, report.findings);
  report.seconds = internal::seconds_since(start);
  return report;
}

}  // namespace zerowait::doctor
