#include "zerowait/diagnose/doctor.hpp"

#include <algorithm>
#include <chrono>

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
