// `zerowait doctor` run by a user who may not read some of what it checks: every such finding is
// "info", says "not readable as this user" with the path and the fix, and none is "ok". Planted
// two ways: the fixture's "unreadable" list (whom no mode bit stops, root included), and real
// files with mode 000 read by an unprivileged user (the test drops to `nobody` when it runs as
// root, as CI does).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>

#include "testing/doctor_fixture.hpp"
#include "zerowait/diagnose/doctor.hpp"

namespace zerowait {
namespace {

using doctor::DoctorOptions;
using doctor::DoctorReport;
using doctor::Finding;
using doctor::Severity;
using testing::contains;
using testing::DoctorFixture;
using testing::findings_of;
using testing::only_finding;

constexpr const char* kNotReadable = "not readable as this user";

// A finding about evidence nobody could read here: info, the path, and the fix.
void expect_not_readable(const Finding& f, const std::string& path) {
  EXPECT_EQ(f.severity, Severity::kInfo) << f.check << ": " << f.summary;
  EXPECT_TRUE(contains(f.summary, kNotReadable)) << f.check;
  EXPECT_TRUE(contains(f.summary, path)) << f.check;
  EXPECT_TRUE(contains(f.evidence, path)) << f.check;
  EXPECT_TRUE(contains(f.fix, "root")) << f.check;
}

// A machine whose checks all have something to read: the paths tests make unreadable.
void plant_machine(DoctorFixture& fx) {
  fx.file("/proc/self/mountinfo", "22 1 0:21 / / rw,relatime - ext4 /dev/vda1 rw\n");
  fx.file("/proc/meminfo",
          "MemTotal: 16000000 kB\nMemAvailable: 8000000 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n");
  fx.file("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
  fx.file("/sys/kernel/mm/transparent_hugepage/defrag", "defer [madvise] never\n");
  fx.file("/proc/sys/vm/dirty_bytes", "0\n");
  fx.file("/proc/sys/vm/dirty_ratio", "20\n");
  fx.file("/proc/sys/vm/dirty_background_bytes", "0\n");
  fx.file("/proc/sys/vm/dirty_background_ratio", "10\n");
  fx.file("/proc/sys/kernel/io_uring_disabled", "0\n");
  fx.file("/proc/self/status", "Name:\tzerowait\nSeccomp:\t0\n");
  fx.file("/proc/self/cgroup", "0::/job\n");
  fx.file("/sys/fs/cgroup/job/cpu.max", "max 100000\n");
  fx.file("/data/train/a.jpg", "a");
  fx.file("/data/train/b.jpg", "b");
}

std::vector<std::string> planted_unreadable() {
  return {"/proc/meminfo",
          "/sys/kernel/mm/transparent_hugepage/enabled",
          "/proc/sys/vm/dirty_bytes",
          "/proc/sys/kernel/io_uring_disabled",
          "/proc/self/status",
          "/sys/fs/cgroup/job/cpu.max",
          "/data/train"};
}

void expect_unreadable_reported(const DoctorReport& report) {
  expect_not_readable(only_finding(report, "memory.available"), "/proc/meminfo");
  expect_not_readable(only_finding(report, "memory.swap"), "/proc/meminfo");
  expect_not_readable(only_finding(report, "memory.thp_enabled"),
                      "/sys/kernel/mm/transparent_hugepage/enabled");
  // dirty_bytes overrides dirty_ratio: the readable ratio alone gives no limit.
  expect_not_readable(only_finding(report, "memory.dirty"), "/proc/sys/vm/dirty_bytes");
  // Was "ok: kernel without the knob".
  expect_not_readable(only_finding(report, "io_uring.sysctl"),
                      "/proc/sys/kernel/io_uring_disabled");
  expect_not_readable(only_finding(report, "io_uring.seccomp"), "/proc/self/status");
  // Was "ok: no CPU quota".
  expect_not_readable(only_finding(report, "cpu.cgroup_quota"), "/sys/fs/cgroup/job/cpu.max");
  // Was "ok: no files under /data/train".
  expect_not_readable(only_finding(report, "storage.small_files"), "/data/train");
  // What could be read is still judged.
  EXPECT_EQ(only_finding(report, "memory.thp_defrag").severity, Severity::kOk);
  EXPECT_EQ(only_finding(report, "storage.atime").severity, Severity::kOk);
}

TEST(DoctorUnreadable, PlantedUnreadableFilesAreReportedNotJudged) {
  DoctorFixture fx;
  plant_machine(fx);
  fx.facts()["unreadable"] = planted_unreadable();
  DoctorOptions options;
  options.paths = {"/data/train"};
  expect_unreadable_reported(fx.run(options));
}

TEST(DoctorUnreadable, ReadableFixtureGivesVerdicts) {
  // The same machine, readable: the findings above are verdicts, so the test above tests the
  // unreadable files and not a machine that lacks them.
  DoctorFixture fx;
  plant_machine(fx);
  DoctorOptions options;
  options.paths = {"/data/train"};
  const DoctorReport report = fx.run(options);
  for (const Finding& f : report.findings) {
    EXPECT_FALSE(contains(f.summary, kNotReadable)) << f.check << ": " << f.summary;
  }
  EXPECT_EQ(only_finding(report, "io_uring.sysctl").summary, "io_uring enabled");
  EXPECT_EQ(only_finding(report, "cpu.cgroup_quota").severity, Severity::kOk);
  EXPECT_EQ(only_finding(report, "storage.small_files").summary, "2 files, median 1 B");
}

// An NVIDIA GPU on PCI at 0000:00:05.0, and an empty path for the storage checks.
constexpr const char* kGpuDir = "/sys/devices/pci0000:00/0000:00:05.0";
void plant_gpu(DoctorFixture& fx) {
  fx.dir("/empty");
  fx.file(std::string(kGpuDir) + "/vendor", "0x10de\n");
  fx.file(std::string(kGpuDir) + "/class", "0x030200\n");
  fx.link("/sys/bus/pci/devices/0000:00:05.0", "../../../devices/pci0000:00/0000:00:05.0");
}

TEST(DoctorUnreadable, PlantedUnreadableDevicesAndNetwork) {
  DoctorFixture fx;
  plant_gpu(fx);
  fx.file("/proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15\n");
  fx.file("/sys/class/infiniband/mlx5_0/ports/1/state", "4: ACTIVE\n");
  fx.file("/sys/class/net/eth0/operstate", "up\n");
  fx.facts()["env"] = {{"NCCL_SOCKET_IFNAME", "eth0"}};
  fx.facts()["unreadable"] = {"/proc/driver/nvidia/version",
                              "/sys/class/infiniband/mlx5_0/ports/1/state", "/sys/class/net"};
  DoctorOptions options;
  options.paths = {"/empty"};
  const DoctorReport report = fx.run(options);
  // Was "FAIL: NVIDIA driver not loaded".
  expect_not_readable(only_finding(report, "devices.gpus"), "/proc/driver/nvidia/version");
  // Was "WARN: state unreadable".
  expect_not_readable(only_finding(report, "network.rdma"),
                      "/sys/class/infiniband/mlx5_0/ports/1/state");
  // Was "FAIL: no interface eth0".
  const std::vector<Finding> ifname = findings_of(report, "network.nccl_socket_ifname");
  ASSERT_EQ(ifname.size(), 2u);
  expect_not_readable(ifname[0], "/sys/class/net");
}

TEST(DoctorUnreadable, APciFunctionWhoseVendorCannotBeReadIsNotNoGpu) {
  DoctorFixture fx;
  plant_gpu(fx);
  fx.facts()["unreadable"] = {std::string(kGpuDir) + "/vendor"};
  DoctorOptions options;
  options.paths = {"/empty"};
  expect_not_readable(only_finding(fx.run(options), "devices.gpus"),
                      std::string(kGpuDir) + "/vendor");
}

// ---- real permissions --------------------------------------------------------------------------

TEST(DoctorUnreadable, FilesWithModeZeroAsAnUnprivilegedUser) {
  DoctorFixture fx;
  plant_machine(fx);
  fx.file("/zerowait-facts.json", "{}");
  // The fixture is walked by the unprivileged user: everything readable but the planted files.
  namespace fs = std::filesystem;
  for (const fs::directory_entry& entry : fs::recursive_directory_iterator(fx.root())) {
    fs::permissions(entry.path(), entry.is_directory() ? fs::perms(0755) : fs::perms(0644));
  }
  fs::permissions(fx.root(), fs::perms(0755));
  for (const std::string& path : planted_unreadable()) {
    fs::permissions(fx.root() + path, fs::perms::none);
  }
  const std::string lines = testing::run_unprivileged([&] {
    DoctorOptions options;
    options.root = fx.root();
    options.paths = {"/data/train"};
    std::ostringstream out;
    for (const Finding& f : doctor::run_doctor(options).findings) {
      out << f.check << '\t' << int(f.severity) << '\t' << f.summary << '\t' << f.evidence << '\t'
          << f.fix << '\n';
    }
    return out.str();
  });
  DoctorReport report;
  std::istringstream in(lines);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    Finding f;
    std::string severity;
    std::getline(fields, f.check, '\t');
    std::getline(fields, severity, '\t');
    std::getline(fields, f.summary, '\t');
    std::getline(fields, f.evidence, '\t');
    std::getline(fields, f.fix, '\t');
    f.severity = Severity(std::stoi(severity));
    report.findings.push_back(f);
  }
  ASSERT_FALSE(report.findings.empty());
  expect_unreadable_reported(report);
}

}  // namespace
}  // namespace zerowait
