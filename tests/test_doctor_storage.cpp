// `zerowait doctor`'s storage checks against fixture machines: mountinfo lines, sysfs files and
// facts planted under a temporary root, and real file trees to sample.
#include <gtest/gtest.h>

#include <string>

#include "testing/doctor_fixture.hpp"
#include "testing/testing.hpp"
#include "zerowait/diagnose/doctor.hpp"

namespace zerowait {
namespace {

using doctor::DoctorOptions;
using doctor::Finding;
using doctor::Severity;
using testing::contains;
using testing::kGiB;
using testing::DoctorFixture;
using testing::findings_of;
using testing::only_finding;


constexpr const char* kRootMount = "22 1 254:0 / / rw,relatime - ext4 /dev/vda rw\n";

DoctorOptions paths(std::vector<std::string> list) {
  DoctorOptions options;
  options.paths = std::move(list);
  return options;
}

// Every problem says why it matters and how to fix it, and names what it read.
void expect_problem_explained(const Finding& f) {
  EXPECT_FALSE(f.evidence.empty()) << f.check;
  if (f.severity == Severity::kWarn || f.severity == Severity::kFail) {
    EXPECT_FALSE(f.why.empty()) << f.check;
    EXPECT_FALSE(f.fix.empty()) << f.check;
  }
}

TEST(DoctorStorage, FindsTheLongestMountOnAComponentBoundaryWithEscapedNames) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo",
          std::string(kRootMount) +
              "40 22 0:53 / /data rw,noatime - nfs4 filer:/export rw,vers=4.2\n"
              "41 22 259:1 / /database rw,noatime - xfs /dev/nvme0n1p1 rw\n"
              "42 22 259:2 / /my\\040data rw,noatime - ext4 /dev/nvme1n1 rw\n");
  const auto report = fx.run(paths({"/data/train", "/database/x", "/my data/y", "/home"}));
  const auto mounts = findings_of(report, "storage.mount");
  ASSERT_EQ(mounts.size(), 4u);
  EXPECT_EQ(mounts[0].subject, "/data/train");
  EXPECT_EQ(mounts[0].summary, "nfs4 from filer:/export mounted at /data");
  EXPECT_EQ(mounts[1].summary, "xfs from /dev/nvme0n1p1 mounted at /database");
  EXPECT_EQ(mounts[2].summary, "ext4 from /dev/nvme1n1 mounted at /my data");
  EXPECT_EQ(mounts[3].summary, "ext4 from /dev/vda mounted at /");
  for (const Finding& f : mounts) EXPECT_EQ(f.severity, Severity::kInfo);
}

TEST(DoctorStorage, AMissingMountIsReportedNotGuessed) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo", "40 22 0:53 / /data rw,noatime - nfs4 filer:/export rw\n");
  const auto report = fx.run(paths({"/scratch"}));
  const Finding mount = only_finding(report, "storage.mount");
  EXPECT_EQ(mount.severity, Severity::kInfo);
  EXPECT_EQ(mount.summary, "not found in /proc/self/mountinfo");
  EXPECT_TRUE(findings_of(report, "storage.atime").empty());
  EXPECT_EQ(only_finding(report, "storage.small_files").summary, "path does not exist");
}

TEST(DoctorStorage, StrictAtimeWarnsAndRelatimeIsFine) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo", std::string(kRootMount) +
                                      "41 22 259:1 / /data rw - xfs /dev/nvme0n1 rw\n");
  const auto report = fx.run(paths({"/data", "/"}));
  const auto atime = findings_of(report, "storage.atime");
  ASSERT_EQ(atime.size(), 2u);
  EXPECT_EQ(atime[0].severity, Severity::kWarn);
  EXPECT_TRUE(contains(atime[0].evidence, "/data mounted rw"));
  EXPECT_TRUE(contains(atime[0].fix, "mount -o remount,noatime /data"));
  expect_problem_explained(atime[0]);
  EXPECT_EQ(atime[1].severity, Severity::kOk);
  EXPECT_TRUE(contains(atime[1].summary, "relatime"));
}

TEST(DoctorStorage, NfsMountOptionsThatStallTrainingAreFlagged) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo",
          std::string(kRootMount) +
              "40 22 0:53 / /data rw,relatime - nfs filer:/export rw,vers=3,rsize=65536,"
              "wsize=1048576,soft,noac,proto=udp,timeo=11,addr=10.0.0.5\n");
  const auto report = fx.run(paths({"/data"}));
  const char* checks[] = {"storage.nfs_version",         "storage.nfs_rsize_wsize",
                          "storage.nfs_soft",            "storage.nfs_attribute_cache",
                          "storage.nfs_transport",       "storage.nfs_nconnect"};
  for (const char* check : checks) {
    const Finding f = only_finding(report, check);
    EXPECT_EQ(f.severity, Severity::kWarn) << check;
    EXPECT_EQ(f.subject, "/data");
    EXPECT_TRUE(contains(f.evidence, "vers=3,rsize=65536")) << check;
    expect_problem_explained(f);
    EXPECT_TRUE(contains(f.fix, "filer:/export /data")) << check;
  }
  EXPECT_EQ(only_finding(report, "storage.nfs_version").summary, "NFS mounted vers=3");
  EXPECT_TRUE(contains(only_finding(report, "storage.nfs_version").fix, "vers=4.2"));
  EXPECT_TRUE(contains(only_finding(report, "storage.nfs_rsize_wsize").summary, "rsize=65536"));
  EXPECT_TRUE(contains(only_finding(report, "storage.nfs_transport").summary, "udp"));
  EXPECT_TRUE(contains(only_finding(report, "storage.nfs_nconnect").fix, "nconnect=8"));
}

TEST(DoctorStorage, WellMountedNfsPassesEveryNfsCheck) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo",
          std::string(kRootMount) +
              "40 22 0:53 / /data rw,relatime - nfs4 filer:/export rw,vers=4.1,rsize=1048576,"
              "wsize=1048576,hard,proto=tcp,nconnect=8,timeo=600\n"
              "41 22 0:54 / /old rw,relatime - nfs4 filer:/old rw,vers=4.0,rsize=1048576,"
              "wsize=1048576,hard,proto=tcp,nconnect=8,actimeo=0\n");
  const auto report = fx.run(paths({"/data", "/old"}));
  for (const char* check :
       {"storage.nfs_version", "storage.nfs_rsize_wsize", "storage.nfs_soft",
        "storage.nfs_attribute_cache", "storage.nfs_transport", "storage.nfs_nconnect"}) {
    const auto found = findings_of(report, check);
    ASSERT_EQ(found.size(), 2u) << check;
    EXPECT_EQ(found[0].severity, Severity::kOk) << check << ": " << found[0].summary;
  }
  // vers=4.0 is below 4.1; actimeo=0 turns the attribute cache off.
  EXPECT_EQ(findings_of(report, "storage.nfs_version")[1].severity, Severity::kWarn);
  EXPECT_EQ(findings_of(report, "storage.nfs_attribute_cache")[1].severity, Severity::kWarn);
}

TEST(DoctorStorage, ReadAheadIsJudgedByFilesystemKind) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo",
          std::string(kRootMount) +
              "40 22 0:53 / /nfs rw,relatime - nfs4 filer:/a rw,vers=4.2\n"
              "41 22 0:54 / /fast rw,relatime - nfs4 filer:/b rw,vers=4.2\n"
              "42 22 8:1 / /disk rw,relatime - ext4 /dev/sda1 rw\n"
              "43 22 0:60 / /tmp rw,relatime - tmpfs tmpfs rw\n");
  fx.file("/sys/class/bdi/0:53/read_ahead_kb", "128\n");
  fx.file("/sys/class/bdi/0:54/read_ahead_kb", "15360\n");
  fx.file("/sys/class/bdi/254:0/read_ahead_kb", "128\n");
  // A partition: sysfs's 8:1 links to .../sda/sda1, and the queue is its disk's.
  const std::string disk = "/sys/devices/pci0000:00/0000:00:1f.2/ata1/block/sda";
  fx.file(disk + "/queue/read_ahead_kb", "64\n");
  fx.file(disk + "/queue/scheduler", "[mq-deadline] none\n");
  fx.dir(disk + "/sda1");
  fx.link("/sys/dev/block/8:1", "../../devices/pci0000:00/0000:00:1f.2/ata1/block/sda/sda1");
  const auto report = fx.run(paths({"/nfs", "/fast", "/", "/disk", "/tmp"}));
  const auto read_ahead = findings_of(report, "storage.read_ahead");
  ASSERT_EQ(read_ahead.size(), 5u);
  // 128 KiB starves NFS but is enough for a local disk.
  EXPECT_EQ(read_ahead[0].severity, Severity::kWarn);
  EXPECT_EQ(read_ahead[0].evidence, "/sys/class/bdi/0:53/read_ahead_kb: 128");
  EXPECT_TRUE(contains(read_ahead[0].fix, "echo 4096 > /sys/class/bdi/0:53/read_ahead_kb"));
  expect_problem_explained(read_ahead[0]);
  EXPECT_EQ(read_ahead[1].severity, Severity::kOk);
  EXPECT_EQ(read_ahead[2].severity, Severity::kOk);
  EXPECT_EQ(read_ahead[3].severity, Severity::kWarn);
  EXPECT_EQ(read_ahead[3].evidence, "/sys/dev/block/8:1/../queue/read_ahead_kb: 64");
  EXPECT_EQ(read_ahead[4].severity, Severity::kInfo);
}

TEST(DoctorStorage, BfqOnAnSsdWarnsAndOtherSchedulersPass) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo",
          std::string(kRootMount) + "42 22 259:1 / /ssd rw,noatime - ext4 /dev/nvme0n1p1 rw\n" +
              "43 22 8:0 / /hdd rw,noatime - ext4 /dev/sdb rw\n" +
              "40 22 0:53 / /nfs rw,relatime - nfs4 filer:/a rw,vers=4.2\n");
  const std::string nvme = "/sys/devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1";
  fx.file(nvme + "/queue/scheduler", "mq-deadline kyber [bfq] none\n");
  fx.file(nvme + "/queue/rotational", "0\n");
  fx.dir(nvme + "/nvme0n1p1");
  fx.link("/sys/dev/block/259:1",
          "../../devices/pci0000:00/0000:00:04.0/nvme/nvme0/nvme0n1/nvme0n1p1");
  fx.file("/sys/dev/block/8:0/queue/scheduler", "mq-deadline kyber [bfq] none\n");
  fx.file("/sys/dev/block/8:0/queue/rotational", "1\n");
  const auto report = fx.run(paths({"/ssd", "/hdd", "/nfs"}));
  const auto scheduler = findings_of(report, "storage.scheduler");
  ASSERT_EQ(scheduler.size(), 3u);
  EXPECT_EQ(scheduler[0].severity, Severity::kWarn);
  EXPECT_TRUE(contains(scheduler[0].evidence, "[bfq]"));
  EXPECT_TRUE(contains(scheduler[0].fix, "echo none > /sys/dev/block/259:1/../queue/scheduler"));
  expect_problem_explained(scheduler[0]);
  EXPECT_EQ(scheduler[1].severity, Severity::kOk);
  EXPECT_EQ(scheduler[1].summary, "bfq on a rotational device");
  EXPECT_EQ(scheduler[2].severity, Severity::kInfo);
  EXPECT_EQ(scheduler[2].summary, "no block device queue (nfs4)");
}

TEST(DoctorStorage, FreeSpaceAndInodesAreJudgedAgainstTheirTotals) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo",
          std::string(kRootMount) + "41 22 259:1 / /full rw,noatime - xfs /dev/nvme0n1 rw\n" +
              "42 22 259:2 / /low rw,noatime - xfs /dev/nvme1n1 rw\n");
  fx.facts()["space"]["/full"] = {{"bytes_total", 1000 * kGiB},
                                  {"bytes_available", 15 * kGiB},
                                  {"inodes_total", 1000000},
                                  {"inodes_available", 5000}};
  fx.facts()["space"]["/low"] = {{"bytes_total", 1000 * kGiB},
                                 {"bytes_available", 50 * kGiB},
                                 {"inodes_total", 1000000},
                                 {"inodes_available", 30000}};
  fx.facts()["space"]["/"] = {{"bytes_total", 100 * kGiB},
                              {"bytes_available", 60 * kGiB},
                              {"inodes_total", 0}};
  const auto report = fx.run(paths({"/full", "/low", "/"}));
  const auto space = findings_of(report, "storage.free_space");
  ASSERT_EQ(space.size(), 3u);
  EXPECT_EQ(space[0].severity, Severity::kFail);  // 1.5 %
  EXPECT_EQ(space[0].summary, "15.0 GiB free of 1000 GiB (1.5 %)");
  EXPECT_TRUE(contains(space[0].fix, "df -h /full"));
  expect_problem_explained(space[0]);
  EXPECT_EQ(space[1].severity, Severity::kWarn);  // 5 %
  EXPECT_EQ(space[2].severity, Severity::kOk);
  const auto inodes = findings_of(report, "storage.free_inodes");
  ASSERT_EQ(inodes.size(), 2u);  // "/" reports no inode count
  EXPECT_EQ(inodes[0].severity, Severity::kFail);  // 0.5 %
  EXPECT_TRUE(contains(inodes[0].summary, "5,000 inodes free of 1,000,000"));
  EXPECT_TRUE(contains(inodes[0].fix, "find /full -xdev -type f | cut -d/ -f1-4"));
  expect_problem_explained(inodes[0]);
  EXPECT_EQ(inodes[1].severity, Severity::kWarn);  // 3 %
}

TEST(DoctorStorage, ODirectProbeResultIsReported) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo", kRootMount);
  fx.dir("/shm");
  fx.dir("/disk");
  fx.dir("/unknown");
  fx.facts()["o_direct"]["/shm"] = "EINVAL: open(/shm, O_TMPFILE | O_DIRECT): Invalid argument";
  fx.facts()["o_direct"]["/disk"] = true;
  const auto report = fx.run(paths({"/shm", "/disk", "/unknown"}));
  const auto probes = findings_of(report, "storage.o_direct");
  ASSERT_EQ(probes.size(), 3u);
  EXPECT_EQ(probes[0].severity, Severity::kWarn);
  EXPECT_TRUE(contains(probes[0].evidence, "EINVAL"));
  EXPECT_TRUE(contains(probes[0].fix, "io=\"pread\""));
  expect_problem_explained(probes[0]);
  EXPECT_EQ(probes[1].severity, Severity::kOk);
  EXPECT_EQ(probes[2].severity, Severity::kInfo);
}

TEST(DoctorStorage, ATreeOfSmallFilesWarnsWithTheMeasuredGainFromPacking) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo", kRootMount);
  for (int i = 0; i < 1100; ++i) {
    fx.file("/data/train/class" + std::to_string(i % 10) + "/" + std::to_string(i) + ".jpg",
            std::string(2000 + i, 'x'));
  }
  const auto report = fx.run(paths({"/data/train"}));
  const Finding f = only_finding(report, "storage.small_files");
  EXPECT_EQ(f.severity, Severity::kWarn);
  // Known by construction: 1,100 files of 2,000 to 3,099 bytes, whose median is 2,550 bytes.
  EXPECT_TRUE(contains(f.summary, "1,100 files with a median of 2.49 KiB")) << f.summary;
  EXPECT_TRUE(contains(f.evidence, "in 11 directories"));
  EXPECT_TRUE(contains(f.evidence, "100 % under 1 MiB"));
  EXPECT_TRUE(contains(f.evidence, "x from packing (per-file overhead"));
  EXPECT_TRUE(contains(f.evidence, "measured on 200 files"));
  EXPECT_TRUE(contains(f.fix, "zerowait pack /data/train -o /data/train.zw"));
  EXPECT_TRUE(contains(f.fix, "zerowait bench files /data/train --dataset /data/train.zw"));
  expect_problem_explained(f);
}

TEST(DoctorStorage, TheSampleStopsAtItsBoundAndSaysSo) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo", kRootMount);
  for (int i = 0; i < 150; ++i) fx.file("/data/" + std::to_string(i), "tiny");
  DoctorOptions options = paths({"/data"});
  options.sample_files = 100;
  const Finding f = only_finding(fx.run(options), "storage.small_files");
  EXPECT_EQ(f.severity, Severity::kWarn);
  EXPECT_EQ(f.subject, "/data");
  EXPECT_TRUE(contains(f.summary, "100+ files"));
  EXPECT_TRUE(contains(f.evidence, "stopped at the bound of 100 files"));
  EXPECT_TRUE(contains(f.fix, "zerowait pack /data -o /data.zw"));
}

TEST(DoctorStorage, LargeFilesFewFilesAndSymlinkedTreesDoNotWarn) {
  DoctorFixture fx;
  fx.file("/proc/self/mountinfo", kRootMount);
  for (int i = 0; i < 3; ++i) {
    fx.file("/shards/part-" + std::to_string(i) + ".zws", std::string(2 << 20, 's'));
  }
  // A link into a large tree of small files is not followed.
  for (int i = 0; i < 1200; ++i) fx.file("/elsewhere/" + std::to_string(i), "tiny");
  fx.file("/few/a.txt", "a");
  fx.link("/few/linked", "../elsewhere");
  const auto report = fx.run(paths({"/shards", "/few", "/shards/part-0.zws"}));
  const auto small = findings_of(report, "storage.small_files");
  ASSERT_EQ(small.size(), 3u);
  EXPECT_EQ(small[0].severity, Severity::kOk);
  EXPECT_EQ(small[0].summary, "3 files, median 2.00 MiB");
  EXPECT_EQ(small[1].severity, Severity::kOk);
  EXPECT_EQ(small[1].summary, "1 file, median 1 B");
  // A file: its file system is checked, its directory is not sampled (nor packing it advised).
  EXPECT_EQ(small[2].severity, Severity::kInfo);
  EXPECT_EQ(small[2].summary, "not checked: a file, not a directory of samples");
  EXPECT_TRUE(small[2].fix.empty());
}

}  // namespace
}  // namespace zerowait
