// What the doctor's check families share: the machine as host::System reads it (under a root
// prefix, so every check runs against fixtures), one report's list of findings, the finding for
// evidence this user may not read, and the check groups, one per file under src/diagnose/doctor/.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "host/system.hpp"
#include "zerowait/diagnose/doctor.hpp"

namespace zerowait::doctor {

using host::Limit;
using host::ProbeResult;
using host::SpaceInfo;
using host::System;

// Appends findings to one report, with the area filled in.
class FindingList {
 public:
  FindingList(std::vector<Finding>& out, std::string area) : out_(out), area_(std::move(area)) {}
  Finding& add(std::string check, Severity severity, std::string summary);
  const std::string& area() const { return area_; }

 private:
  std::vector<Finding>& out_;
  std::string area_;
};

// Turns `finding` into the report of evidence this user may not read (System::denied): kInfo,
// never a verdict, with `path` in the summary and evidence and the fix (run as root, or grant
// read). `what` names what could not be checked ("transparent huge pages").
Finding& not_readable(Finding& finding, const std::string& what, const std::string& path);
// The words every such finding's summary ends with, for tests and readers of --json.
inline constexpr const char* kNotReadable = "not readable as this user";

inline constexpr uint64_t kMiB = uint64_t(1) << 20;
inline constexpr uint64_t kGiB = uint64_t(1) << 30;

// A limit as getrlimit gives it: "unlimited" for UINT64_MAX, else the number.
std::string limit_text(uint64_t value);

// The check groups, one per file under src/diagnose/doctor/. Each appends its findings.
void check_storage(const System& system, const DoctorOptions& options, std::vector<Finding>& out);
void check_memory(const System& system, std::vector<Finding>& out);
void check_limits_and_cpu(const System& system, const DoctorOptions& options,
                          std::vector<Finding>& out);
void check_io_uring(const System& system, std::vector<Finding>& out);
void check_devices(const System& system, std::vector<Finding>& out);
void check_network(const System& system, std::vector<Finding>& out);

}  // namespace zerowait::doctor
