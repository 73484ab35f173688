// How much of a set of files the kernel's page cache holds, and reading the rest in ahead of
// training: `zerowait cache status|warm` (what vmtouch does, for a dataset's shards).
//
// Residency is mincore() over read-only mappings of each file, a window at a time, so address
// space stays bounded whatever the file size. Warming reads only the chunks that are not already
// resident, synchronously (the time it reports is what the warm-up cost), and stops at a byte
// budget: a warm-up larger than the memory it lands in only evicts what it read first.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

// Residency is known only to some users: since Linux 5.0 (CVE-2019-5489) mincore() on a file's
// mapping answers truthfully only to the file's owner, a process that may write it, or one with
// CAP_FOWNER; to anyone else every page looks resident. Such a file is "not measured": its
// resident_bytes are 0 (unknown), and a warm-up reads it whole.
struct FileResidency {
  std::string path;
  uint64_t bytes = 0;
  uint64_t resident_bytes = 0;  // whole pages, the last one counted as the file's tail
  bool measured = true;         // false: this user cannot learn it (above)
  // The share resident; NaN when not measured (null in JSON).
  double share() const;
};

struct Residency {
  std::vector<FileResidency> files;
  uint64_t bytes = 0;
  uint64_t resident_bytes = 0;
  uint64_t unmeasured_bytes = 0;  // of files this user cannot measure
  // The share of the measured bytes resident; NaN when nothing could be measured.
  double share() const;
};

// Why a file's residency was not measured, for output beside the numbers.
inline constexpr const char* kUnmeasuredResidency =
    "not measurable as this user: mincore() reports only the files a user owns or may write "
    "(Linux >= 5.0); to anyone else every page looks resident";

// kNotFound / kIo naming the path. An empty file is resident.
Result<FileResidency> file_residency(const std::string& path);
Result<Residency> residency(const std::vector<std::string>& paths);

struct WarmOptions {
  // At most this many bytes read, in whole chunks (0: no cap); files warmed in the order given.
  uint64_t max_bytes = 0;
  // Called after each chunk with the bytes read so far and the bytes the warm-up will read.
  std::function<void(uint64_t done, uint64_t total)> progress;
};

struct WarmReport {
  Residency before;
  Residency after;
  uint64_t bytes_read = 0;
  double seconds = 0;  // reading only
  bool capped = false;  // stopped at max_bytes with non-resident bytes left
};

Result<WarmReport> warm_page_cache(const std::vector<std::string>& paths,
                                   const WarmOptions& options);

// How a benchmark keeps the page cache out of its "cold" numbers, printed with them (text and
// --json) so that a reader knows what "cold" means there. Neither way needs root: zerowait never
// writes /proc/sys/vm/drop_caches, which would need it and would empty the cache of every job on
// the machine.
struct ColdCacheMethod {
  const char* method;      // "posix_fadvise(POSIX_FADV_DONTNEED)", "O_DIRECT"
  const char* what;        // what it does, in one clause
  const char* stays_warm;  // what it does not evict, and so what "cold" still benefits from
};

// bench files: each file's pages dropped before the cold pass (evict_from_page_cache).
inline constexpr ColdCacheMethod kColdByFadvise{
    "posix_fadvise(POSIX_FADV_DONTNEED)",
    "drops each file's cached pages before the cold pass (after fdatasync: dirty pages cannot "
    "be dropped); it works as any user who can read the files, and drops them for every "
    "process on the machine",
    "the kernel's dentry and inode caches (open and stat stay warm, which flatters the per-file "
    "side), pages another process keeps mapped, and the storage's own caches (a virtual disk's "
    "host, the drive, an NFS server)"};

// bench storage: the test file written and read past the page cache on both sides.
inline constexpr ColdCacheMethod kColdByDirectIo{
    "O_DIRECT",
    "the test file is written and read with O_DIRECT by zerowait and by fio (--direct=1): the "
    "page cache is bypassed, so nothing needs evicting and no root is needed",
    "the storage's own caches (a virtual disk's host, the drive's DRAM, an NFS server)"};

}  // namespace zerowait
