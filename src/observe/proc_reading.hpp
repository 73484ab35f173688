// One reading of the counters the system sampler turns into rates: /proc/stat, /proc/meminfo,
// /proc/vmstat, /proc/diskstats and the process tree's /proc/PID files, all read through
// host::System (a root prefix for fixture trees). A file that is missing leaves its counters
// unset or zero; reading never fails.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "host/system.hpp"
#include "zerowait/observe/system_sampler.hpp"

namespace zerowait::observe {

struct CpuTimes {
  uint64_t busy = 0;   // every jiffy but idle and iowait
  uint64_t total = 0;  // user .. steal (guest time is already inside user)
};

struct DiskCounters {
  uint64_t ios = 0;              // reads + writes completed
  uint64_t sectors_read = 0;     // 512-byte sectors, whatever the device's block size
  uint64_t sectors_written = 0;
  uint64_t rw_ms = 0;            // ms spent reading + writing (summed over requests)
  uint64_t io_ms = 0;            // ms with I/O in flight
  uint64_t weighted_ms = 0;      // ms x requests in flight
};

struct ProcessCounters {
  uint64_t cpu_ticks = 0;    // utime + stime, in clock ticks
  uint64_t read_bytes = 0;   // /proc/PID/io: bytes fetched from storage
  uint64_t write_bytes = 0;  // bytes sent to storage
};

struct ProcReading {
  double t = 0;
  std::optional<CpuTimes> cpu;
  uint64_t mem_available = 0;  // bytes
  std::optional<uint64_t> pswpin;
  std::optional<uint64_t> pswpout;
  std::map<std::string, DiskCounters> disks;      // whole devices
  std::map<pid_t, ProcessCounters> tree;          // the pid and its descendants
  uint64_t rss = 0;                               // bytes, over the tree
  ThreadStates threads;
  bool has_children = false;                      // the root pid has child processes
  pid_t root = 0;                                 // the tree's root pid
  int children = 0;                               // its direct children (DataLoader workers)
  // The root pid holds no resident page (it has released its memory in exit() and is about to
  // become a zombie) or is gone. What its main thread does now is not the job's work.
  bool exiting = false;
};

// The state letter of a /proc/PID/stat or task stat line ('R', 'S', 'D'...); '?' if malformed.
char stat_state(const std::string& stat);

// Reads everything at time `t`. `pid` is the tree's root.
ProcReading read_proc(const host::System& system, pid_t pid, double t);

// The disks of /proc/diskstats that are whole devices: /sys/block/<name> exists (partitions
// have none), and loop/ram/zram devices only when they have done I/O.
std::map<std::string, DiskCounters> read_disks(const host::System& system);

}  // namespace zerowait::observe
