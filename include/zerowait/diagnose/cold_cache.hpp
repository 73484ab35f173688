// How a benchmark keeps the page cache out of its "cold" numbers, in words printed beside them.
#pragma once

namespace zerowait {

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
