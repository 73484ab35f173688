#include "diagnose/doctor/checks.hpp"

#include <utility>

namespace zerowait::doctor {

std::string limit_text(uint64_t value) {
  return value == UINT64_MAX ? "unlimited" : std::to_string(value);
}

Finding& not_readable(Finding& finding, const std::string& what, const std::string& path) {
  finding.severity = Severity::kInfo;
  finding.summary = what + ": " + path + " " + kNotReadable;
  finding.evidence = path + ": permission denied (EACCES/EPERM) to this user";
  finding.why = "the check could not read what it judges by, so it gives no verdict";
  finding.fix = "run zerowait doctor as root (sudo), or give this user read access to " + path +
                " (chmod o+rX, or setfacl -m u:$USER:rX)";
  return finding;
}

Finding& FindingList::add(std::string check, Severity severity, std::string summary) {
  Finding finding;
  finding.check = area_ + "." + std::move(check);
  finding.area = area_;
  finding.severity = severity;
  finding.summary = std::move(summary);
  out_.push_back(std::move(finding));
  return out_.back();
}

}  // namespace zerowait::doctor
