// What the storage and system checks share: mounts as /proc/self/mountinfo lists them (proc(5)),
// with the lookups the checks need, and quantities written the way findings print them.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/text.hpp"

namespace zerowait::doctor {

// One line of /proc/self/mountinfo:
// id parent major:minor root mount_point mount_options [optional...] - fstype source super_options
struct Mount {
  unsigned major = 0;  // 0: an anonymous device (NFS, tmpfs, overlay, FUSE), no block queue
  unsigned minor = 0;
  std::string root;         // the directory of its filesystem mounted here; escapes decoded
  std::string mount_point;  // escapes (\040 for a space) decoded
  std::string fstype;       // "ext4", "nfs4", "fuse.s3fs"
  std::string source;       // "/dev/vda1", "filer:/export"
  std::string mount_options;  // per mount, as listed: "rw,relatime"
  std::string super_options;  // per filesystem, as listed: "rw,vers=4.2,rsize=1048576,hard"

  // "MAJ:MIN", the name /sys/class/bdi and /sys/dev/block use.
  std::string device() const;
  // Whether `name` stands alone ("hard") or as a key ("vers=4.2") in either option list.
  bool has_option(std::string_view name) const;
  // The value of `name=value` in either option list (super options first); nullopt when absent.
  std::optional<std::string> option(std::string_view name) const;
};

// Every well-formed line of `mountinfo`, in file order (later mounts stack on earlier ones).
// Malformed lines are skipped.
std::vector<Mount> parse_mountinfo(std::string_view mountinfo);

// The mount holding absolute `path`: the longest mount point that is `path` or a parent of it on
// a component boundary (/data holds /data/x, not /database); of equal ones the last listed, the
// one on top. nullptr when none does.
const Mount* find_mount(const std::vector<Mount>& mounts, const std::string& path);

// The active entry of a sysfs choice list, the one in brackets ("none [mq-deadline] bfq" ->
// "mq-deadline", "always [madvise] never" -> "madvise"); the text itself when none is.
std::string bracketed_choice(const std::string& choices);

using internal::format_bytes;   // "57.0 MiB" (common/text.hpp)
using internal::format_fixed;   // "12.5"
using internal::format_number;  // "34,000"
// A share as a percentage without the sign: 0.015 -> "1.5", 0.4 -> "40" (a decimal below 10 %).
std::string format_percent(double share);

}  // namespace zerowait::doctor
