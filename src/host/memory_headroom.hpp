// How much memory this process can still take: the machine's MemAvailable, and the room its
// cgroup (v2) limits leave. The loader sizes its budget by it; `zerowait cache warm` its warm-up.
#pragma once

#include <cstdint>
#include <string>

namespace zerowait {

// MemAvailable from /proc/meminfo (under `proc_root`), in bytes; 0 when it cannot be read.
uint64_t available_memory_bytes(const std::string& proc_root = "/proc");

// MemAvailable, or less when a memory.max of this process's cgroup (v2), or of a cgroup above
// it, leaves less room (memory.max - memory.current, not counting inactive page cache). 0 when
// nothing can be read. Read under `proc_root` and `cgroup_root` (fixtures in tests).
uint64_t memory_headroom_bytes(const std::string& proc_root = "/proc",
                               const std::string& cgroup_root = "/sys/fs/cgroup");

}  // namespace zerowait
