// What the doctor's checks and observe's sampler read the machine through: files under a root
// prefix, and the few facts that no file holds, measured live or taken from a fixture's facts
// file. A check never calls open()/statvfs()/getrlimit() itself, so every check runs against
// fixtures.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace zerowait::host {

struct SpaceInfo {
  uint64_t bytes_total = 0;
  uint64_t bytes_available = 0;  // to an unprivileged user (f_bavail)
  uint64_t inodes_total = 0;     // 0 on filesystems without an inode count (btrfs, NFS may)
  uint64_t inodes_available = 0;
};

struct Limit {
  uint64_t soft = 0;  // UINT64_MAX: unlimited
  uint64_t hard = 0;
};

// A probe that either worked or failed with a reason ("EINVAL: open(O_DIRECT) ...").
struct ProbeResult {
  bool ok = false;
  std::string detail;
};

class System {
 public:
  // root "" is the live system.
  explicit System(std::string root = "");

  bool live() const { return root_.empty(); }
  const std::string& root() const { return root_; }

  // Files, by their absolute path on the machine ("/proc/meminfo"); read under the root.
  // nullopt when absent or unreadable (denied() tells the two apart).
  std::optional<std::string> read(const std::string& path) const;
  // The first line, without surrounding whitespace.
  std::optional<std::string> read_line(const std::string& path) const;
  // A file holding one integer ("/sys/block/vda/queue/read_ahead_kb").
  std::optional<int64_t> read_int(const std::string& path) const;
  // Entry names of a directory, sorted; empty when absent or unreadable.
  std::vector<std::string> list(const std::string& dir) const;
  // Whether `path` is there but this user may not read it (or list it, for a directory): open()
  // or read() fail with EACCES or EPERM. Under a root, also a path the facts file's
  // "unreadable" list names, or one inside a directory it names (so that tests running as root,
  // whom no mode bit stops, can plant one). A check whose evidence is denied says so
  // (not_readable below) instead of reporting "ok" or "absent".
  bool denied(const std::string& path) const;
  bool exists(const std::string& path) const;
  // The target of a symbolic link, as stored ("../../devices/pci0000:00/0000:00:04.0").
  std::optional<std::string> link_target(const std::string& path) const;
  // The last component of a link's target: /sys/class/net/eth0/device/driver -> "virtio_net".
  std::optional<std::string> link_name(const std::string& path) const;
  // The path as it is on the host filesystem: the root prefixed (for opening files in a tree).
  std::string host_path(const std::string& path) const;
  // A user's PATH made absolute on the machine: live, realpath() (the path itself when that
  // fails); under a root, PATH as given (absolute inside the root).
  std::string machine_path(const std::string& user_path) const;

  // Facts from no file. Under a root they come from <root>/zerowait-facts.json; nullopt when
  // the fixture does not give them.
  std::optional<SpaceInfo> space(const std::string& path) const;  // statvfs
  std::optional<ProbeResult> o_direct(const std::string& path) const;  // open a file O_DIRECT
  std::optional<ProbeResult> io_uring_setup() const;                    // a real ring
  std::optional<Limit> open_files_limit() const;                        // RLIMIT_NOFILE
  std::optional<Limit> locked_memory_limit() const;                     // RLIMIT_MEMLOCK
  std::optional<unsigned> usable_cpus() const;  // sched_getaffinity of this process
  // The environment (NCCL_*, CUDA_*...), live: environ; fixture: the facts file's "env".
  std::map<std::string, std::string> environment() const;

 private:
  // The facts file's "unreadable" list names `path` or a directory above it.
  bool planted_denied(const std::string& path) const;

  std::string root_;
  std::string facts_;  // the fixture's facts file, unparsed ("" live or absent)
  std::vector<std::string> unreadable_;  // the facts file's "unreadable" paths
};

}  // namespace zerowait::host
