// Storage checks, for each path a job reads or writes: its mount and mount options (atime, NFS
// version, transfer sizes, soft mounts, attribute cache, transport, connections), read-ahead,
// the block device's I/O scheduler, free space and inodes, O_DIRECT, and whether the tree under
// it is a small-file metadata storm, with the gain packing would bring measured on its files.
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <filesystem>
#include <vector>

#include "common/clock.hpp"
#include "diagnose/doctor/mounts.hpp"
#include "diagnose/doctor/checks.hpp"
#include "diagnose/doctor/per_file_cost.hpp"

namespace zerowait::doctor {
namespace {

constexpr const char* kMountinfo = "/proc/self/mountinfo";

// The findings about one user path: every one names the path as the user gave it.
class PathFindings {
 public:
  PathFindings(std::vector<Finding>& out, std::string subject)
      : list_(out, "storage"), subject_(std::move(subject)) {}
  Finding& add(std::string check, Severity severity, std::string summary) {
    Finding& finding = list_.add(std::move(check), severity, std::move(summary));
    finding.subject = subject_;
    return finding;
  }

 private:
  FindingList list_;
  std::string subject_;
};

bool is_nfs(const Mount& mount) { return mount.fstype == "nfs" || mount.fstype == "nfs4"; }

// Filesystems whose every read miss is a network round trip: read-ahead hides it.
bool is_network_filesystem(const Mount& mount) {
  static constexpr const char* kNetwork[] = {"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre",
                                             "ceph", "9p", "afs", "gpfs", "beegfs", "glusterfs",
                                             "virtiofs", "orangefs"};
  if (mount.fstype.rfind("fuse", 0) == 0) return true;  // fuse, fuseblk, fuse.s3fs ...
  return std::find(std::begin(kNetwork), std::end(kNetwork), mount.fstype) != std::end(kNetwork);
}

std::string mountinfo_evidence(const Mount& mount) {
  return std::string(kMountinfo) + ": " + mount.mount_point + " " + mount.fstype + " " +
         mount.source + " " + mount.mount_options + " (super: " + mount.super_options + ")";
}

// NFS options that only a fresh mount changes (vers, nconnect, proto cannot be remounted).
std::string nfs_remount(const Mount& mount, const std::string& options) {
  return "umount " + mount.mount_point + " && mount -t " + mount.fstype + " -o " + options + " " +
         mount.source + " " + mount.mount_point + " (and the same options in /etc/fstab)";
}

void check_mount_entry(PathFindings& findings, const Mount* mount, const std::string& path,
                       bool mountinfo_denied) {
  if (mount == nullptr) {
    Finding& f = findings.add("mount", Severity::kInfo, "not found in /proc/self/mountinfo");
    f.evidence = std::string(kMountinfo) + ": no mount point holds " + path;
    if (mountinfo_denied) not_readable(f, "the mount of " + path, kMountinfo);
    return;
  }
  findings
      .add("mount", Severity::kInfo,
           mount->fstype + " from " + mount->source + " mounted at " + mount->mount_point)
      .evidence = mountinfo_evidence(*mount);
}

void check_atime(PathFindings& findings, const Mount& mount) {
  const std::string evidence =
      std::string(kMountinfo) + ": " + mount.mount_point + " mounted " + mount.mount_options;
  if (mount.has_option("noatime") || mount.has_option("relatime")) {
    const char* mode = mount.has_option("noatime") ? "noatime" : "relatime";
    findings.add("atime", Severity::kOk, std::string(mode) + ": reads do not write inode times")
        .evidence = evidence;
    return;
  }
  if (mount.fstype == "tmpfs" || mount.fstype == "ramfs") {
    findings.add("atime", Severity::kOk, "access times kept in memory only (" + mount.fstype + ")")
        .evidence = evidence;
    return;
  }
  Finding& f = findings.add("atime", Severity::kWarn,
                            "strictatime: every file read updates its access time");
  f.evidence = evidence + " (neither noatime nor relatime)";
  f.why = "each sample read dirties its inode: one metadata write per file opened, competing "
          "with the reads";
  f.fix = "mount -o remount,noatime " + mount.mount_point + " (and noatime in its /etc/fstab line)";
}

// "4.2" -> 42, "3" -> 30, "4" (an old kernel's 4.0) -> 40; minorversion=N overrides the minor.
std::optional<int> nfs_version_tenths(const Mount& mount) {
  const std::optional<std::string> vers = mount.option("vers");
  if (!vers || vers->empty() || !std::isdigit(static_cast<unsigned char>((*vers)[0]))) {
    return std::nullopt;
  }
  int major = std::atoi(vers->c_str());
  const size_t dot = vers->find('.');
  int minor = dot == std::string::npos ? 0 : std::atoi(vers->c_str() + dot + 1);
  if (const std::optional<std::string> minorversion = mount.option("minorversion")) {
    minor = std::atoi(minorversion->c_str());
  }
  return major * 10 + minor;
}

void check_nfs(PathFindings& findings, const Mount& mount) {
  const std::string evidence = mountinfo_evidence(mount);
  const auto add = [&](const char* check, Severity severity, std::string summary) -> Finding& {
    Finding& f = findings.add(check, severity, std::move(summary));
    f.evidence = evidence;
    return f;
  };

  const std::optional<int> version = nfs_version_tenths(mount);
  if (!version) {
    add("nfs_version", Severity::kInfo, "NFS version not listed in the mount options");
  } else if (*version < 41) {
    Finding& f = add("nfs_version", Severity::kWarn,
                     "NFS mounted vers=" + mount.option("vers").value_or("?"));
    f.why = "before 4.1 NFS has no sessions or pNFS: a retransmit after a network hiccup can "
            "stall or repeat operations, and reads cannot spread over data servers";
    f.fix = nfs_remount(mount, "vers=4.2") + "; vers=4.1 if the server lacks 4.2";
  } else {
    add("nfs_version", Severity::kOk, "NFS vers=" + mount.option("vers").value_or("?"));
  }

  const std::optional<std::string> rsize = mount.option("rsize");
  const std::optional<std::string> wsize = mount.option("wsize");
  const std::string sizes = "rsize=" + rsize.value_or("?") + " wsize=" + wsize.value_or("?");
  if (!rsize || !wsize) {
    add("nfs_rsize_wsize", Severity::kInfo, sizes + ": not listed in the mount options");
  } else if (std::strtoull(rsize->c_str(), nullptr, 10) < kMiB ||
             std::strtoull(wsize->c_str(), nullptr, 10) < kMiB) {
    Finding& f = add("nfs_rsize_wsize", Severity::kWarn, sizes + ", below 1 MiB");
    f.why = "every NFS READ/WRITE carries at most rsize/wsize bytes: small transfers multiply the "
            "round trips of each shard read and checkpoint write";
    f.fix = nfs_remount(mount, "rsize=1048576,wsize=1048576") + "; the server may cap it lower";
  } else {
    add("nfs_rsize_wsize", Severity::kOk, sizes);
  }

  if (mount.has_option("soft") || mount.has_option("softerr")) {
    Finding& f = add("nfs_soft", Severity::kWarn, "NFS mounted soft");
    f.why = "a slow server turns into EIO mid-epoch or a torn checkpoint instead of a wait";
    f.fix = nfs_remount(mount, "hard") + "; zerowait's own deadlines bound the waits";
  } else {
    add("nfs_soft", Severity::kOk, "NFS mounted hard");
  }

  const bool no_attribute_cache = mount.has_option("noac") ||
                                  mount.option("actimeo") == std::optional<std::string>("0") ||
                                  mount.option("acregmax") == std::optional<std::string>("0");
  if (no_attribute_cache) {
    Finding& f = add("nfs_attribute_cache", Severity::kWarn, "NFS attribute cache disabled");
    f.why = "with noac or actimeo=0 every open and stat of a sample is a round trip to the server";
    f.fix = nfs_remount(mount, "actimeo=60") + " (drop noac; datasets do not change under a job)";
  } else {
    add("nfs_attribute_cache", Severity::kOk, "NFS attribute cache on");
  }

  const std::string proto = mount.option("proto").value_or("tcp");
  if (proto == "udp" || proto == "udp6") {
    Finding& f = add("nfs_transport", Severity::kWarn, "NFS over " + proto);
    f.why = "UDP loses whole RPCs to a dropped fragment and retransmits them after timeo; "
            "large rsize needs TCP";
    f.fix = nfs_remount(mount, "proto=tcp");
  } else {
    add("nfs_transport", Severity::kOk, "NFS over " + proto);
  }

  const std::string nconnect = mount.option("nconnect").value_or("1");
  if (std::atoi(nconnect.c_str()) <= 1) {
    Finding& f = add("nfs_nconnect", Severity::kWarn, "one TCP connection to the NFS server");
    f.why = "all reads share one connection: its window and one receive queue cap throughput";
    f.fix = nfs_remount(mount, "nconnect=8") + " (Linux >= 5.3)";
  } else {
    add("nfs_nconnect", Severity::kOk, "nconnect=" + nconnect);
  }
}

// "MAJ:MIN" of the block device under a mount: the mount's own device, or for filesystems that
// report an anonymous one (btrfs) the device named by the source, when sysfs knows it.
std::optional<std::string> block_device(const System& system, const Mount& mount) {
  if (mount.major != 0) return mount.device();
  if (mount.source.rfind("/dev/", 0) != 0) return std::nullopt;
  const std::string name = std::filesystem::path(mount.source).filename().string();
  return system.read_line("/sys/class/block/" + name + "/dev");
}

// The queue directory of a block device: its own, or a partition's parent disk's.
std::optional<std::string> queue_dir(const System& system, const std::string& device) {
  for (const std::string& dir :
       {"/sys/dev/block/" + device + "/queue", "/sys/dev/block/" + device + "/../queue"}) {
    if (system.exists(dir + "/scheduler")) return dir;
  }
  return std::nullopt;
}

void check_read_ahead(PathFindings& findings, const System& system, const Mount& mount) {
  const std::optional<std::string> device = block_device(system, mount);
  std::string file = "/sys/class/bdi/" + (device ? *device : mount.device()) + "/read_ahead_kb";
  if (!system.exists(file) && device) {
    if (std::optional<std::string> queue = queue_dir(system, *device)) {
      file = *queue + "/read_ahead_kb";
    }
  }
  const std::optional<int64_t> kib = system.read_int(file);
  const bool network = is_network_filesystem(mount);
  if (!kib) {
    Finding& f =
        findings.add("read_ahead", Severity::kInfo, "no read-ahead setting for " + mount.fstype);
    f.evidence = file + ": absent";
    if (system.denied(file)) not_readable(f, "read-ahead", file);
    return;
  }
  const int64_t minimum = network ? 1024 : 128;
  const std::string value = std::to_string(*kib) + " KiB";
  const std::string evidence = file + ": " + std::to_string(*kib);
  if (*kib >= minimum) {
    findings.add("read_ahead", Severity::kOk, "read-ahead " + value).evidence = evidence;
    return;
  }
  Finding& f = findings.add("read_ahead", Severity::kWarn,
                            "read-ahead " + value + " on " + mount.fstype + ", below " +
                                std::to_string(minimum) + " KiB");
  f.evidence = evidence;
  f.why = network ? "sequential shard reads wait a network round trip per small window; "
                    "128 KiB (the default) starves them"
                  : "sequential shard reads are split into small requests the device serves "
                    "one window at a time";
  f.fix = "echo 4096 > " + file +
          (is_nfs(mount) ? "; to keep it, [nfsrahead] nfs=4096 nfs4=4096 in /etc/nfs.conf "
                           "(nfs-utils >= 2.6, applied by its udev rule)"
                         : "; to keep it, a udev rule: SUBSYSTEM==\"bdi\", ACTION==\"add\", "
                           "ATTR{read_ahead_kb}=\"4096\"");
}

void check_scheduler(PathFindings& findings, const System& system, const Mount& mount) {
  const std::optional<std::string> device = block_device(system, mount);
  if (!device) {
    findings.add("scheduler", Severity::kInfo, "no block device queue (" + mount.fstype + ")")
        .evidence = std::string(kMountinfo) + ": " + mount.mount_point + " is on device " +
                    mount.device() + " from " + mount.source;
    return;
  }
  const std::optional<std::string> queue = queue_dir(system, *device);
  const std::optional<std::string> line =
      queue ? system.read_line(*queue + "/scheduler") : std::nullopt;
  if (!line) {
    Finding& f = findings.add("scheduler", Severity::kInfo, "could not read the I/O scheduler");
    f.evidence = "/sys/dev/block/" + *device + "/queue/scheduler: absent";
    if (queue && system.denied(*queue + "/scheduler")) {
      not_readable(f, "I/O scheduler", *queue + "/scheduler");
    }
    return;
  }
  const std::string active = bracketed_choice(*line);
  const std::optional<int64_t> rotational = system.read_int(*queue + "/rotational");
  const std::string kind = !rotational ? "" : *rotational ? "rotational" : "non-rotational";
  const std::string evidence = *queue + "/scheduler: " + *line + "; rotational: " +
                               (rotational ? std::to_string(*rotational) : "absent");
  if (active == "bfq" && rotational == 0) {
    Finding& f = findings.add("scheduler", Severity::kWarn, "bfq on a non-rotational device");
    f.evidence = evidence;
    f.why = "bfq spends CPU on every I/O: at SSD/NVMe request rates it caps the IOPS of "
            "shuffled reads";
    f.fix = "echo none > " + *queue + "/scheduler (mq-deadline for SATA SSDs); keep it with a "
            "udev rule setting ATTR{queue/scheduler}";
    return;
  }
  findings.add("scheduler", Severity::kOk, active + (kind.empty() ? "" : " on a " + kind +
                                                                              " device"))
      .evidence = evidence;
}

void check_space(PathFindings& findings, const System& system, const std::string& path,
                 const std::string& mount_point) {
  const std::optional<SpaceInfo> space = system.space(path);
  if (!space || space->bytes_total == 0) {
    Finding& f = findings.add("free_space", Severity::kInfo, "free space not measured");
    f.evidence = "statvfs(" + path + "): " + (space ? "no size reported" : "not available");
    if (!space && system.denied(path)) not_readable(f, "free space", path);
    return;
  }
  const double share = double(space->bytes_available) / double(space->bytes_total);
  const std::string summary = format_bytes(space->bytes_available) + " free of " +
                              format_bytes(space->bytes_total) + " (" + format_percent(share) +
                              " %)";
  const std::string evidence = "statvfs(" + path + "): " +
                               std::to_string(space->bytes_available) + " of " +
                               std::to_string(space->bytes_total) + " bytes available";
  const Severity severity = share < 0.02 || space->bytes_available < kGiB ? Severity::kFail
                            : share < 0.10                               ? Severity::kWarn
                                                                         : Severity::kOk;
  Finding& f = findings.add("free_space", severity, summary);
  f.evidence = evidence;
  if (severity != Severity::kOk) {
    f.why = "a checkpoint that meets ENOSPC fails mid-save; shards and caches need room too";
    f.fix = "df -h " + path + "; remove old checkpoints: zerowait ckpt gc DIR --keep-last N";
  }

  if (space->inodes_total == 0) return;  // btrfs, some NFS servers: no inode count
  const double inode_share = double(space->inodes_available) / double(space->inodes_total);
  const Severity inode_severity = inode_share < 0.01   ? Severity::kFail
                                  : inode_share < 0.05 ? Severity::kWarn
                                                       : Severity::kOk;
  Finding& inodes = findings.add("free_inodes", inode_severity,
                                 format_number(space->inodes_available) + " inodes free of " +
                                     format_number(space->inodes_total) + " (" +
                                     format_percent(inode_share) + " %)");
  inodes.evidence = "statvfs(" + path + "): f_favail " + std::to_string(space->inodes_available) +
                    ", f_files " + std::to_string(space->inodes_total);
  if (inode_severity == Severity::kOk) return;
  // Two path components below the mount point: where the files went.
  const size_t depth = size_t(std::count(mount_point.begin(), mount_point.end(), '/')) -
                       (mount_point == "/" ? 1 : 0);
  inodes.why = "out of inodes, no file can be created: checkpoints and caches fail with ENOSPC "
               "while space remains";
  inodes.fix = "find " + mount_point + " -xdev -type f | cut -d/ -f1-" +
               std::to_string(depth + 3) +
               " | sort | uniq -c | sort -n | tail; turn file trees into shards: zerowait pack "
               "DIR -o DIR.zw";
}

void check_o_direct(PathFindings& findings, const System& system, const std::string& path) {
  const std::optional<ProbeResult> probe = system.o_direct(path);
  if (!probe) {
    Finding& f = findings.add("o_direct", Severity::kInfo, "O_DIRECT not measured");
    f.evidence =
        "the O_DIRECT probe gave no answer for " + path + " (nothing to open, or no fixture fact)";
    if (system.denied(path)) not_readable(f, "O_DIRECT", path);
    return;
  }
  // Refused by permissions, not by the filesystem: nothing is known about O_DIRECT.
  if (!probe->ok &&
      (probe->detail.rfind("EACCES", 0) == 0 || probe->detail.rfind("EPERM", 0) == 0)) {
    Finding& f = not_readable(findings.add("o_direct", Severity::kInfo, ""), "O_DIRECT", path);
    f.evidence = probe->detail;
    return;
  }
  if (probe->ok) {
    findings.add("o_direct", Severity::kOk, "O_DIRECT reads work").evidence = probe->detail;
    return;
  }
  Finding& f = findings.add("o_direct", Severity::kWarn, "O_DIRECT refused");
  f.evidence = probe->detail;
  f.why = "reads here cannot bypass the page cache (tmpfs and overlay refuse O_DIRECT); "
          "io=\"direct\" falls back to buffered reads";
  f.fix = "read with the page cache: Loader(io=\"pread\") (or io=\"auto\")";
}

// What a bounded breadth-first walk of a tree saw.
struct TreeSample {
  std::vector<std::string> files;  // host paths
  std::vector<uint64_t> sizes;
  size_t directories = 0;
  std::vector<std::string> denied;  // directories this user may not list (EACCES/EPERM)
  bool bounded = false;      // stopped by the file or time bound with more left to see
  bool out_of_time = false;  // by the time bound
};

// Regular files under `host_dir`, breadth first, without following symbolic links or crossing
// into other mounts, until `max_files` or `max_seconds`.
TreeSample sample_tree(const std::string& host_dir, uint64_t max_files, double max_seconds) {
  TreeSample sample;
  struct stat top {};
  if (::lstat(host_dir.c_str(), &top) != 0) return sample;
  const auto start = std::chrono::steady_clock::now();
  std::deque<std::string> pending{host_dir};
  uint64_t entries = 0;  // the clock is read every 64 entries
  while (!pending.empty()) {
    const std::string dir = std::move(pending.front());
    pending.pop_front();
    DIR* stream = ::opendir(dir.c_str());
    if (stream == nullptr) {
      if (errno == EACCES || errno == EPERM) sample.denied.push_back(dir);
      continue;  // part of the tree we cannot judge, said in the finding
    }
    ++sample.directories;
    const int dir_fd = ::dirfd(stream);
    while (const dirent* entry = ::readdir(stream)) {
      const std::string name = entry->d_name;
      if (name == "." || name == "..") continue;
      sample.out_of_time = ++entries % 64 == 0 && internal::seconds_since(start) > max_seconds;
      if (sample.files.size() >= max_files || sample.out_of_time) {
        sample.bounded = true;
        break;
      }
      struct stat info {};
      if (::fstatat(dir_fd, name.c_str(), &info, AT_SYMLINK_NOFOLLOW) != 0) continue;
      if (S_ISDIR(info.st_mode) && info.st_dev == top.st_dev) {
        pending.push_back(dir + "/" + name);
      } else if (S_ISREG(info.st_mode)) {
        sample.files.push_back(dir + "/" + name);
        sample.sizes.push_back(uint64_t(info.st_size));
      }
    }
    ::closedir(stream);
    if (sample.bounded) break;
  }
  return sample;
}

std::string directories(size_t count) {
  return format_number(count) + (count == 1 ? " directory" : " directories");
}

void check_small_files(PathFindings& findings, const System& system, const std::string& path,
                       const DoctorOptions& options) {
  const std::string& dir = path;
  std::error_code error;
  if (!std::filesystem::is_directory(system.host_path(path), error)) {
    // Its directory may be one the job never reads (/tmp for /tmp/shards.zws): no advice on it.
    findings.add("small_files", Severity::kInfo, "not checked: a file, not a directory of samples")
        .evidence = "the checks above are of the file system holding " + path +
                    "; give the directory the job reads its files from to sample its files";
    return;
  }
  const std::string host = system.host_path(dir);
  if (system.denied(dir)) {
    not_readable(findings.add("small_files", Severity::kInfo, ""), "the files under " + dir, dir);
    return;
  }
  const TreeSample sample = sample_tree(host, options.sample_files, options.sample_seconds);
  const size_t count = sample.files.size();
  // Directories left out of the walk: an "ok" would judge files nobody looked at.
  const std::string unread = sample.denied.empty()
                                 ? std::string()
                                 : "; " + directories(sample.denied.size()) + " " + kNotReadable +
                                       " (" + sample.denied.front() +
                                       (sample.denied.size() > 1 ? ", ..." : "") + ")";
  const Severity fine = sample.denied.empty() ? Severity::kOk : Severity::kInfo;
  if (count == 0) {
    findings.add("small_files", fine, "no files under " + dir + unread).evidence =
        "walked " + directories(sample.directories) + " under " + host + unread;
    return;
  }
  std::vector<uint64_t> sizes = sample.sizes;
  std::nth_element(sizes.begin(), sizes.begin() + count / 2, sizes.end());
  const uint64_t median = sizes[count / 2];
  const double small_share =
      double(std::count_if(sizes.begin(), sizes.end(), [](uint64_t s) { return s < kMiB; })) /
      double(count);
  std::string evidence =
      "sampled " + format_number(count) + " files in " + directories(sample.directories) +
      " under " + host + " breadth-first" +
      (!sample.bounded      ? " (all of them)"
       : sample.out_of_time ? " (stopped at the time bound of " +
                                  format_fixed(options.sample_seconds, 2) + " s)"
                            : " (stopped at the bound of " +
                                  format_number(options.sample_files) + " files)") +
      ", median " + format_bytes(median) + ", " + format_percent(small_share) + " % under 1 MiB";
  const std::string seen =
      format_number(count) + (sample.bounded ? "+" : "") + (count == 1 ? " file" : " files");
  evidence += unread;
  if ((count < 1000 && !sample.bounded) || median >= kMiB) {
    findings.add("small_files", fine, seen + ", median " + format_bytes(median) + unread).evidence =
        evidence;
    return;
  }
  std::string summary = seen + " with a median of " + format_bytes(median);
  const PerFileCost cost =
      measure_per_file_cost(sample.files, sample.sizes, options.sample_seconds);
  if (!cost.stalled_file.empty()) {
    // Abandoned at the time bound, not waited for: a hung mount must not hang the doctor.
    const std::string stalled = "a read of " + cost.stalled_file + " had not returned after " +
                                format_fixed(cost.stalled_seconds, 2) +
                                " s and was abandoned (a stuck or very slow file system)";
    evidence += "; " + stalled;
    if (cost.files == 0) summary += ": a read stalled, no estimate";
  }
  if (cost.files > 0 && cost.total_seconds > cost.overhead_seconds) {
    const double gain = cost.total_seconds / (cost.total_seconds - cost.overhead_seconds);
    const std::string estimate = "estimated " + format_fixed(gain, 1) + " x from packing";
    summary += ": " + estimate;
    evidence += "; " + estimate + " (per-file overhead " +
                format_percent(cost.overhead_seconds / cost.total_seconds) +
                " % of read time, measured on " + format_number(cost.files) +
                " files, page cache as found)";
  }
  Finding& f = findings.add("small_files", Severity::kWarn, summary);
  f.evidence = evidence;
  f.why = "one open/stat/read/close per sample is a metadata storm: the loader waits on file "
          "system metadata, not on bytes";
  f.fix = "zerowait pack " + dir + " -o " + dir + ".zw, then zerowait bench files " + dir +
          " --dataset " + dir + ".zw to measure the gain";
}

}  // namespace

void check_storage(const System& system, const DoctorOptions& options,
                   std::vector<Finding>& out) {
  const std::vector<std::string> paths =
      options.paths.empty() ? std::vector<std::string>{"."} : options.paths;
  const std::optional<std::string> mountinfo = system.read(kMountinfo);
  const std::vector<Mount> mounts = parse_mountinfo(mountinfo.value_or(""));
  const bool mountinfo_denied = !mountinfo && system.denied(kMountinfo);
  for (const std::string& user_path : paths) {
    PathFindings findings(out, user_path);
    const std::string path = system.machine_path(user_path);
    const Mount* mount = find_mount(mounts, path);
    check_mount_entry(findings, mount, path, mountinfo_denied);
    if (mount != nullptr) {
      check_atime(findings, *mount);
      if (is_nfs(*mount)) check_nfs(findings, *mount);
      check_read_ahead(findings, system, *mount);
      check_scheduler(findings, system, *mount);
    }
    check_space(findings, system, path, mount != nullptr ? mount->mount_point : path);
    std::error_code error;
    const bool exists = std::filesystem::exists(system.host_path(path), error);
    // A path under a directory this user may not search is there, just not to this user.
    if (system.denied(path)) {
      not_readable(findings.add("o_direct", Severity::kInfo, ""), "O_DIRECT", path);
      not_readable(findings.add("small_files", Severity::kInfo, ""), "the files under " + path,
                   path);
    } else if (exists) {
      check_o_direct(findings, system, path);
      check_small_files(findings, system, path, options);
    } else {
      const std::string evidence =
          "stat(" + system.host_path(path) + "): no such file or directory";
      findings.add("o_direct", Severity::kInfo, "O_DIRECT not measured: path does not exist")
          .evidence = evidence;
      findings.add("small_files", Severity::kInfo, "path does not exist").evidence = evidence;
    }
  }
}

}  // namespace zerowait::doctor
