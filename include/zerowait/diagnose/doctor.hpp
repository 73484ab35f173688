// `zerowait doctor`: the configuration that makes GPUs wait, found and explained. Each check
// reads the machine through a root-directory prefix (its /proc, /sys and the paths it is given),
// so the same checks run against fixture trees in the tests; facts that live in no file (free
// space, resource limits, whether io_uring or O_DIRECT work) are measured live, or read from the
// fixture's facts file (docs/doctor.md, "Fixtures").
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait::doctor {

enum class Severity { kOk, kInfo, kWarn, kFail };

// "ok", "info", "warn", "fail": the words of the text output and of the JSON schema.
const char* severity_name(Severity severity);

// One result of one check. Checks report what they found even when it is fine (kOk), so a
// reader sees what was looked at; kInfo is a fact without a verdict (a GPU's model, an MTU).
struct Finding {
  std::string check;  // stable id, "area.name": "storage.nfs_version", "memory.thp_enabled"
  std::string area;   // "storage", "memory", "limits", "cpu", "io_uring", "devices", "network"
  std::string subject;  // the path, device or interface it is about; "" for the machine
  Severity severity = Severity::kOk;
  std::string summary;   // one line: what was found ("NFS mounted vers=3")
  std::string evidence;  // where it was read and the value ("/proc/self/mountinfo: vers=3,...")
  std::string why;       // one line: why it matters for training (may be empty for kOk/kInfo)
  std::string fix;       // a command or setting that fixes it ("" when there is nothing to do)
};

struct DoctorOptions {
  // Storage is checked for each path (a directory or file the job reads or writes). Relative
  // paths are taken from the current directory; under a fixture root they are looked up inside
  // the root. Empty: the current directory.
  std::vector<std::string> paths;
  // "" reads the live system; otherwise every /proc, /sys and path is read under this directory,
  // and facts come from <root>/zerowait-facts.json (missing facts: the check says so, kInfo).
  std::string root;
  // File descriptors the planned job needs at once: loader threads, map workers, shards open.
  unsigned planned_workers = 16;
  // Bounds on the small-file sample of each path's tree (files looked at, time spent).
  uint64_t sample_files = 2000;
  double sample_seconds = 0.5;
};

struct DoctorReport {
  std::vector<Finding> findings;
  double seconds = 0;
  size_t count(Severity severity) const;
  bool failed() const { return count(Severity::kFail) != 0; }
};

// Runs every check. Never throws for what it finds: an unreadable file is a finding (kInfo,
// "could not read"), not an error.
DoctorReport run_doctor(const DoctorOptions& options);
// kNotFound naming the first of `options.paths` that does not exist (under `options.root` when
// set): checking it would describe a file system the job never uses.
Status check_paths_exist(const DoctorOptions& options);

}  // namespace zerowait::doctor
