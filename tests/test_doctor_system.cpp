// `zerowait doctor`'s memory, limits, CPU and io_uring checks against fixture machines: /proc and
// /sys files and facts planted under a temporary root.
#include <gtest/gtest.h>

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
using testing::kGiB;
using testing::kMiB;
using testing::DoctorFixture;
using testing::findings_of;
using testing::only_finding;


// A problem names what it read, why it matters and the fix.
void expect_explained(const Finding& f) {
  EXPECT_FALSE(f.evidence.empty()) << f.check;
  EXPECT_FALSE(f.why.empty()) << f.check;
  EXPECT_FALSE(f.fix.empty()) << f.check;
}

std::string meminfo(uint64_t total_kb, uint64_t available_kb, uint64_t swap_total_kb,
                    uint64_t swap_free_kb) {
  return "MemTotal:       " + std::to_string(total_kb) + " kB\nMemFree:        1000 kB\n" +
         "MemAvailable:   " + std::to_string(available_kb) + " kB\nSwapCached:     0 kB\n" +
         "SwapTotal:      " + std::to_string(swap_total_kb) + " kB\n" +
         "SwapFree:       " + std::to_string(swap_free_kb) + " kB\n";
}

// The checks of this file do not look at paths; the storage checks get an empty directory.
DoctorReport run(DoctorFixture& fx, DoctorOptions options = {}) {
  fx.dir("/empty");
  options.paths = {"/empty"};
  return fx.run(options);
}

TEST(DoctorMemory, AHealthyMachinePassesEveryMemoryCheck) {
  DoctorFixture fx;
  fx.file("/proc/meminfo", meminfo(64 << 20, 48 << 20, 8 << 20, 8 << 20));
  fx.file("/proc/vmstat", "pswpin 0\npswpout 0\n");
  fx.file("/sys/kernel/mm/transparent_hugepage/enabled", "always [madvise] never\n");
  fx.file("/sys/kernel/mm/transparent_hugepage/defrag",
          "always defer [defer+madvise] madvise never\n");
  fx.file("/proc/sys/vm/dirty_bytes", "0\n");
  fx.file("/proc/sys/vm/dirty_ratio", "20\n");
  fx.file("/proc/sys/vm/dirty_background_bytes", "0\n");
  fx.file("/proc/sys/vm/dirty_background_ratio", "10\n");
  fx.facts()["space"]["/dev/shm"] = {{"bytes_total", 32 * kGiB},
                                     {"bytes_available", 32 * kGiB}};
  fx.facts()["locked_memory"] = {"unlimited", "unlimited"};
  const DoctorReport report = run(fx);
  for (const char* check : {"memory.available", "memory.swap", "memory.thp_enabled",
                            "memory.thp_defrag", "memory.dirty", "memory.dev_shm"}) {
    const Finding f = only_finding(report, check);
    EXPECT_EQ(f.severity, Severity::kOk) << check << ": " << f.summary;
    EXPECT_FALSE(f.evidence.empty()) << check;
  }
  EXPECT_EQ(only_finding(report, "memory.available").summary,
            "48.0 GiB available of 64.0 GiB (75 %)");
  EXPECT_EQ(only_finding(report, "memory.swap").summary, "swap unused");
  EXPECT_EQ(only_finding(report, "memory.thp_enabled").summary, "transparent huge pages: madvise");
  EXPECT_TRUE(contains(only_finding(report, "memory.dirty").evidence,
                       "/proc/sys/vm/dirty_ratio: 20"));
  const Finding locked = only_finding(report, "memory.locked_memory");
  EXPECT_EQ(locked.severity, Severity::kInfo);
  EXPECT_EQ(locked.summary, "locked memory limit unlimited");
}

TEST(DoctorMemory, MemoryPressureSwapHugePagesDirtyPagesAndSmallShmAreFlagged) {
  DoctorFixture fx;
  // 128 GiB of RAM, 5 % available, 1 GiB of 8 GiB swap used.
  fx.file("/proc/meminfo", meminfo(128 << 20, (128 << 20) / 20, 8 << 20, 7 << 20));
  fx.file("/proc/vmstat", "pgfault 5\npswpin 12\npswpout 34000\n");
  fx.file("/sys/kernel/mm/transparent_hugepage/enabled", "[always] madvise never\n");
  fx.file("/sys/kernel/mm/transparent_hugepage/defrag",
          "[always] defer defer+madvise madvise never\n");
  fx.file("/proc/sys/vm/dirty_bytes", "0\n");
  fx.file("/proc/sys/vm/dirty_ratio", "40\n");
  fx.file("/proc/sys/vm/dirty_background_ratio", "10\n");
  fx.facts()["space"]["/dev/shm"] = {{"bytes_total", 64 * kMiB},
                                     {"bytes_available", 64 * kMiB}};
  fx.facts()["locked_memory"] = {8 * kMiB, 8 * kMiB};
  const DoctorReport report = run(fx);

  const Finding available = only_finding(report, "memory.available");
  EXPECT_EQ(available.severity, Severity::kWarn);
  EXPECT_TRUE(contains(available.evidence, "MemAvailable 6710886 kB"));
  expect_explained(available);

  const Finding swap = only_finding(report, "memory.swap");
  EXPECT_EQ(swap.severity, Severity::kWarn);
  EXPECT_EQ(swap.summary, "swap in use: 1.00 GiB, 34,000 pages swapped out since boot");
  EXPECT_TRUE(contains(swap.fix, "vm.swappiness=1"));
  expect_explained(swap);

  for (const char* check : {"memory.thp_enabled", "memory.thp_defrag"}) {
    const Finding f = only_finding(report, check);
    EXPECT_EQ(f.severity, Severity::kWarn) << check;
    EXPECT_TRUE(contains(f.evidence, "[always]"));
    expect_explained(f);
  }
  EXPECT_TRUE(contains(only_finding(report, "memory.thp_enabled").fix, "echo madvise >"));
  EXPECT_TRUE(contains(only_finding(report, "memory.thp_defrag").fix, "echo defer+madvise >"));

  const Finding dirty = only_finding(report, "memory.dirty");
  EXPECT_EQ(dirty.severity, Severity::kWarn);
  EXPECT_EQ(dirty.summary, "dirty page limit 51.2 GiB (40 % of RAM)");
  EXPECT_TRUE(contains(dirty.evidence, "/proc/sys/vm/dirty_background_ratio: 10"));
  EXPECT_TRUE(contains(dirty.fix, "vm.dirty_bytes=4294967296"));
  expect_explained(dirty);

  const Finding shm = only_finding(report, "memory.dev_shm");
  EXPECT_EQ(shm.severity, Severity::kFail);
  EXPECT_EQ(shm.summary, "/dev/shm: 64.0 MiB free of 64.0 MiB");
  EXPECT_TRUE(contains(shm.fix, "--shm-size"));
  expect_explained(shm);

  const Finding locked = only_finding(report, "memory.locked_memory");
  EXPECT_EQ(locked.severity, Severity::kWarn);
  EXPECT_TRUE(contains(locked.evidence, "soft 8388608"));
  expect_explained(locked);
}

TEST(DoctorMemory, DirtyBytesWinOverTheRatioAndAMidSizedShmOnlyWarns) {
  DoctorFixture fx;
  fx.file("/proc/meminfo", meminfo(128 << 20, 100 << 20, 0, 0));
  fx.file("/proc/sys/vm/dirty_bytes", "4294967296\n");
  fx.file("/proc/sys/vm/dirty_ratio", "40\n");
  fx.facts()["space"]["/dev/shm"] = {{"bytes_total", 512 * kMiB},
                                     {"bytes_available", 512 * kMiB}};
  const DoctorReport report = run(fx);
  const Finding dirty = only_finding(report, "memory.dirty");
  EXPECT_EQ(dirty.severity, Severity::kOk);
  EXPECT_TRUE(contains(dirty.summary, "4.00 GiB"));
  EXPECT_EQ(only_finding(report, "memory.dev_shm").severity, Severity::kWarn);
  EXPECT_EQ(only_finding(report, "memory.swap").summary, "no swap");
  // Without facts the machine-wide facts are said to be unmeasured, not guessed.
  EXPECT_EQ(only_finding(report, "memory.locked_memory").severity, Severity::kInfo);
  EXPECT_EQ(only_finding(report, "memory.locked_memory").summary,
            "locked memory limit not measured");
}

TEST(DoctorMemory, TheDefaultRatioOnALargeMachineWarns) {
  DoctorFixture fx;
  // 256 GiB of RAM at the kernel's default dirty_ratio of 20: 51.2 GiB may be dirty at once.
  fx.file("/proc/meminfo", meminfo(256 << 20, 200 << 20, 0, 0));
  fx.file("/proc/sys/vm/dirty_bytes", "0\n");
  fx.file("/proc/sys/vm/dirty_ratio", "20\n");
  const Finding dirty = only_finding(run(fx), "memory.dirty");
  EXPECT_EQ(dirty.severity, Severity::kWarn);
  EXPECT_TRUE(contains(dirty.summary, "51.2 GiB"));
  EXPECT_TRUE(contains(dirty.fix, "vm.dirty_bytes="));
}

TEST(DoctorLimits, OpenFilesBelowWhatTheWorkersNeedFail) {
  struct Case {
    uint64_t soft, hard;
    unsigned workers;
    Severity severity;
    const char* fix;
  };
  const Case cases[] = {
      {1024, 4096, 16, Severity::kFail, "ulimit -n 4096"},
      {1024, 1024, 16, Severity::kFail, "LimitNOFILE=65536"},
      {4096, 1048576, 100, Severity::kFail, "ulimit -n 65536"},
      {65536, 65536, 16, Severity::kOk, ""},
  };
  for (const Case& c : cases) {
    DoctorFixture fx;
    fx.facts()["open_files"] = {c.soft, c.hard};
    DoctorOptions options;
    options.planned_workers = c.workers;
    const Finding f = only_finding(run(fx, options), "limits.open_files");
    EXPECT_EQ(f.severity, c.severity) << c.soft << " " << c.workers;
    EXPECT_TRUE(contains(f.evidence, "soft " + std::to_string(c.soft)));
    EXPECT_TRUE(contains(f.fix, c.fix));
    if (c.severity == Severity::kFail) expect_explained(f);
  }
  DoctorFixture fx;
  fx.facts()["open_files"] = {1024, 1024};
  const Finding f = only_finding(run(fx), "limits.open_files");
  EXPECT_EQ(f.summary, "ulimit -n 1024 with 16 workers, below 1280; the hard limit 1024 too");
  EXPECT_TRUE(contains(f.evidence, "needed 1280 (256 + 16 workers x 64)"));
}

TEST(DoctorLimits, SystemWideOpenFilesNearFileMaxWarn) {
  DoctorFixture full;
  full.file("/proc/sys/fs/file-max", "1000000\n");
  full.file("/proc/sys/fs/file-nr", "900000\t0\t1000000\n");
  const Finding warn = only_finding(run(full), "limits.file_max");
  EXPECT_EQ(warn.severity, Severity::kWarn);
  EXPECT_EQ(warn.summary, "900,000 files open system-wide of 1,000,000 (90 %)");
  expect_explained(warn);

  DoctorFixture fine;
  fine.file("/proc/sys/fs/file-max", "9223372036854775807\n");
  fine.file("/proc/sys/fs/file-nr", "780\t0\t9223372036854775807\n");
  EXPECT_EQ(only_finding(run(fine), "limits.file_max").severity, Severity::kOk);
}

TEST(DoctorCpu, CountsUsableAndOnlineCpus) {
  DoctorFixture fx;
  fx.facts()["usable_cpus"] = 8;
  fx.file("/sys/devices/system/cpu/online", "0-15,32-47\n");
  const Finding f = only_finding(run(fx), "cpu.count");
  EXPECT_EQ(f.severity, Severity::kInfo);
  EXPECT_EQ(f.summary, "8 usable CPUs of 32 online");
  EXPECT_TRUE(contains(f.evidence, "/sys/devices/system/cpu/online: 0-15,32-47"));
}

TEST(DoctorCpu, ACgroupV2QuotaBelowTheCpuCountWarnsAndTheTightestLevelWins) {
  DoctorFixture fx;
  fx.facts()["usable_cpus"] = 16;
  fx.file("/proc/self/cgroup", "0::/job/step\n");
  fx.file("/sys/fs/cgroup/job/cpu.max", "200000 100000\n");
  fx.file("/sys/fs/cgroup/job/step/cpu.max", "max 100000\n");
  const Finding f = only_finding(run(fx), "cpu.cgroup_quota");
  EXPECT_EQ(f.severity, Severity::kWarn);
  EXPECT_EQ(f.summary, "CPU quota 2.0 CPUs, below the 16 usable CPUs");
  EXPECT_EQ(f.evidence, "/sys/fs/cgroup/job/cpu.max: 200000 100000");
  EXPECT_TRUE(contains(f.fix, "Loader(threads=2)"));
  expect_explained(f);
}

TEST(DoctorCpu, CgroupHierarchiesAreFoundWhereMountinfoPutsThem) {
  // A hybrid machine: cgroup2 at /sys/fs/cgroup/unified without a quota, the v1 CPU controller
  // mounted at /sys/fs/cgroup/cpu with 4 CPUs for 4 usable ones.
  DoctorFixture hybrid;
  hybrid.facts()["usable_cpus"] = 4;
  hybrid.file("/proc/self/mountinfo",
              "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
              "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
              "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
  hybrid.file("/proc/self/cgroup", "1:cpu:/batch\n0::/\n");
  hybrid.dir("/sys/fs/cgroup/unified");
  hybrid.file("/sys/fs/cgroup/cpu/batch/cpu.cfs_quota_us", "400000\n");
  hybrid.file("/sys/fs/cgroup/cpu/batch/cpu.cfs_period_us", "100000\n");
  const Finding ok = only_finding(run(hybrid), "cpu.cgroup_quota");
  EXPECT_EQ(ok.severity, Severity::kOk);
  EXPECT_EQ(ok.summary, "CPU quota 4.0 CPUs");
  EXPECT_EQ(ok.evidence,
            "/sys/fs/cgroup/cpu/batch/cpu.cfs_quota_us: 400000, cpu.cfs_period_us: 100000");

  // A container that sees its own cgroup (root /docker/abc) mounted at /sys/fs/cgroup.
  DoctorFixture container;
  container.facts()["usable_cpus"] = 4;
  container.file("/proc/self/mountinfo",
                 "22 1 0:40 / / rw,relatime - overlay overlay rw\n"
                 "31 22 0:38 /docker/abc /sys/fs/cgroup ro,relatime - cgroup2 cgroup2 rw\n");
  container.file("/proc/self/cgroup", "0::/docker/abc\n");
  container.file("/sys/fs/cgroup/cpu.max", "150000 100000\n");
  const Finding throttled = only_finding(run(container), "cpu.cgroup_quota");
  EXPECT_EQ(throttled.severity, Severity::kWarn);
  EXPECT_EQ(throttled.summary, "CPU quota 1.5 CPUs, below the 4 usable CPUs");
  EXPECT_TRUE(contains(throttled.fix, "Loader(threads=1)"));

  // cgroup v1 where mountinfo lists nothing: the usual cpu,cpuacct directory.
  DoctorFixture v1;
  v1.facts()["usable_cpus"] = 8;
  v1.file("/proc/self/cgroup", "4:cpu,cpuacct:/batch\n");
  v1.file("/sys/fs/cgroup/cpu,cpuacct/batch/cpu.cfs_quota_us", "400000\n");
  v1.file("/sys/fs/cgroup/cpu,cpuacct/batch/cpu.cfs_period_us", "100000\n");
  const Finding capped = only_finding(run(v1), "cpu.cgroup_quota");
  EXPECT_EQ(capped.severity, Severity::kWarn);
  EXPECT_TRUE(contains(capped.evidence, "/sys/fs/cgroup/cpu,cpuacct/batch/cpu.cfs_quota_us"));

  DoctorFixture none;
  none.file("/proc/self/cgroup", "0::/\n");
  const Finding unlimited = only_finding(run(none), "cpu.cgroup_quota");
  EXPECT_EQ(unlimited.severity, Severity::kOk);
  EXPECT_EQ(unlimited.summary, "no CPU quota");
}

TEST(DoctorCpu, PowersaveWarnsOnlyWhereItPinsTheFrequency) {
  const auto machine = [](DoctorFixture& fx, const std::string& governor,
                          const std::string& driver) {
    for (int cpu = 0; cpu < 4; ++cpu) {
      const std::string dir = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/cpufreq/";
      fx.file(dir + "scaling_governor", governor + "\n");
      fx.file(dir + "scaling_driver", driver + "\n");
    }
    fx.dir("/sys/devices/system/cpu/cpufreq");
  };
  DoctorFixture acpi;
  machine(acpi, "powersave", "acpi-cpufreq");
  const Finding slow = only_finding(run(acpi), "cpu.governor");
  EXPECT_EQ(slow.severity, Severity::kWarn);
  EXPECT_EQ(slow.summary, "powersave (acpi-cpufreq) on 4 CPUs");
  EXPECT_TRUE(contains(slow.evidence, "cpu0/cpufreq/scaling_governor: powersave"));
  EXPECT_EQ(slow.fix, "cpupower frequency-set -g performance");
  expect_explained(slow);

  DoctorFixture pstate;
  machine(pstate, "powersave", "intel_pstate");
  EXPECT_EQ(only_finding(run(pstate), "cpu.governor").severity, Severity::kOk);

  DoctorFixture vm;
  vm.dir("/sys/devices/system/cpu/cpu0");
  const Finding none = only_finding(run(vm), "cpu.governor");
  EXPECT_EQ(none.severity, Severity::kInfo);
  EXPECT_EQ(none.summary, "no cpufreq (virtual machine?)");
}

TEST(DoctorIoUring, TheSysctlDecidesWhoMayUseIt) {
  const std::pair<const char*, Severity> cases[] = {
      {"0\n", Severity::kOk}, {"1\n", Severity::kWarn}, {"2\n", Severity::kFail}};
  for (const auto& [value, severity] : cases) {
    DoctorFixture fx;
    fx.file("/proc/sys/kernel/io_uring_disabled", value);
    const Finding f = only_finding(run(fx), "io_uring.sysctl");
    EXPECT_EQ(f.severity, severity) << value;
    EXPECT_TRUE(contains(f.evidence, "/proc/sys/kernel/io_uring_disabled: "));
    if (severity != Severity::kOk) {
      EXPECT_EQ(f.fix, "sysctl -w kernel.io_uring_disabled=0");
      expect_explained(f);
    }
  }
  DoctorFixture old_kernel;
  EXPECT_EQ(only_finding(run(old_kernel), "io_uring.sysctl").severity, Severity::kOk);
}

TEST(DoctorIoUring, ASeccompFilterIsBlamedOnlyWhenSetupFails) {
  DoctorFixture blocked;
  blocked.file("/proc/self/status", "Name:\tpython\nSeccomp:\t2\nSeccomp_filters:\t1\n");
  blocked.facts()["io_uring"] = "EPERM: io_uring_setup(4 entries): Operation not permitted";
  const DoctorReport report = run(blocked);
  const Finding seccomp = only_finding(report, "io_uring.seccomp");
  EXPECT_EQ(seccomp.severity, Severity::kWarn);
  EXPECT_EQ(seccomp.evidence, "/proc/self/status: Seccomp: 2");
  EXPECT_TRUE(contains(seccomp.fix, "--security-opt seccomp="));
  const Finding setup = only_finding(report, "io_uring.setup");
  EXPECT_EQ(setup.severity, Severity::kWarn);
  EXPECT_TRUE(contains(setup.evidence, "EPERM"));
  expect_explained(setup);

  DoctorFixture allowed;
  allowed.file("/proc/self/status", "Name:\tpython\nSeccomp:\t2\n");
  allowed.facts()["io_uring"] = true;
  const DoctorReport fine = run(allowed);
  EXPECT_EQ(only_finding(fine, "io_uring.seccomp").severity, Severity::kInfo);
  EXPECT_EQ(only_finding(fine, "io_uring.setup").severity, Severity::kOk);

  DoctorFixture unfiltered;
  unfiltered.file("/proc/self/status", "Name:\tpython\nSeccomp:\t0\n");
  unfiltered.facts()["io_uring"] = "ENOSYS: io_uring_setup(4 entries): Function not implemented";
  const DoctorReport old = run(unfiltered);
  EXPECT_EQ(only_finding(old, "io_uring.seccomp").severity, Severity::kOk);
  EXPECT_TRUE(contains(only_finding(old, "io_uring.setup").fix, "Linux >= 5.6"));
}

}  // namespace
}  // namespace zerowait
