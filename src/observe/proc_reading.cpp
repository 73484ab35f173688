#include "observe/proc_reading.hpp"

#include <unistd.h>

#include <cstdlib>
#include <deque>
#include <sstream>
#include <vector>

#include "host/meminfo.hpp"

namespace zerowait::observe {
namespace {

std::vector<std::string> split_words(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> words;
  for (std::string word; in >> word;) words.push_back(word);
  return words;
}

uint64_t to_u64(const std::string& text) { return std::strtoull(text.c_str(), nullptr, 10); }

bool is_pid(const std::string& name) {
  return !name.empty() && name.find_first_not_of("0123456789") == std::string::npos;
}

// "cpu  user nice system idle iowait irq softirq steal guest guest_nice"
std::optional<CpuTimes> read_cpu(const host::System& system) {
  const std::optional<std::string> line = system.read_line("/proc/stat");
  if (!line || !line->starts_with("cpu ")) return std::nullopt;
  const std::vector<std::string> words = split_words(*line);
  if (words.size() < 5) return std::nullopt;
  CpuTimes times;
  for (size_t i = 1; i < words.size() && i <= 8; ++i) {
    const uint64_t v = to_u64(words[i]);
    times.total += v;
    if (i != 4 && i != 5) times.busy += v;  // idle, iowait
  }
  return times;
}

bool is_virtual_disk(const std::string& name) {
  return name.starts_with("loop") || name.starts_with("ram") || name.starts_with("zram");
}

struct ProcessStat {
  pid_t ppid = 0;
  uint64_t cpu_ticks = 0;
  uint64_t rss_pages = 0;
};

// /proc/PID/stat: the fields after "(comm)" (whose name may hold spaces and ')').
std::optional<ProcessStat> parse_stat(const std::string& stat) {
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return std::nullopt;
  const std::vector<std::string> f = split_words(stat.substr(close + 1));
  // f[0] is field 3 (state): ppid is field 4, utime 14, stime 15, rss 24.
  if (f.size() < 22) return std::nullopt;
  return ProcessStat{static_cast<pid_t>(std::atol(f[1].c_str())), to_u64(f[11]) + to_u64(f[12]),
                     to_u64(f[21])};
}

}  // namespace

char stat_state(const std::string& stat) {
  const size_t close = stat.rfind(')');
  return close == std::string::npos || close + 2 >= stat.size() ? '?' : stat[close + 2];
}

std::map<std::string, DiskCounters> read_disks(const host::System& system) {
  std::map<std::string, DiskCounters> disks;
  const std::optional<std::string> text = system.read("/proc/diskstats");
  if (!text) return disks;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    // major minor name reads merged sectors ms writes merged sectors ms in_flight io_ms weighted
    const std::vector<std::string> w = split_words(line);
    if (w.size() < 14) continue;
    const std::string& name = w[2];
    std::string sys_name = name;  // "cciss/c0d0" is /sys/block/cciss!c0d0
    for (char& c : sys_name) c = c == '/' ? '!' : c;
    if (!system.exists("/sys/block/" + sys_name)) continue;  // a partition
    DiskCounters d;
    d.ios = to_u64(w[3]) + to_u64(w[7]);
    if (d.ios == 0 && is_virtual_disk(name)) continue;
    d.sectors_read = to_u64(w[5]);
    d.sectors_written = to_u64(w[9]);
    d.rw_ms = to_u64(w[6]) + to_u64(w[10]);
    d.io_ms = to_u64(w[12]);
    d.weighted_ms = to_u64(w[13]);
    disks[name] = d;
  }
  return disks;
}

ProcReading read_proc(const host::System& system, pid_t pid, double t) {
  ProcReading r;
  r.t = t;
  r.cpu = read_cpu(system);
  if (const auto meminfo = system.read("/proc/meminfo")) {
    r.mem_available = host::mem_available_bytes(*meminfo).value_or(0);
  }
  if (const auto vmstat = system.read("/proc/vmstat")) {
    r.pswpin = host::counter_value(*vmstat, "pswpin");
    r.pswpout = host::counter_value(*vmstat, "pswpout");
  }
  r.disks = read_disks(system);

  // The tree: every process's parent from its stat, then the descendants of `pid`.
  std::map<pid_t, ProcessStat> stats;
  std::multimap<pid_t, pid_t> children;
  for (const std::string& name : system.list("/proc")) {
    if (!is_pid(name)) continue;
    const std::optional<std::string> text = system.read("/proc/" + name + "/stat");
    if (!text) continue;  // exited between the listing and the read
    const std::optional<ProcessStat> stat = parse_stat(*text);
    if (!stat) continue;
    const pid_t p = static_cast<pid_t>(std::atol(name.c_str()));
    stats[p] = *stat;
    children.emplace(stat->ppid, p);
  }
  if (stats.find(pid) == stats.end()) {
    // Gone (reaped between the read of its main thread and this one): no tree, and what that
    // thread was doing was not the job's work.
    r.exiting = true;
    return r;
  }
  r.has_children = children.count(pid) != 0;
  r.root = pid;
  r.children = static_cast<int>(children.count(pid));
  r.exiting = stats[pid].rss_pages == 0;
  static const uint64_t page_size = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  std::deque<pid_t> queue = {pid};
  while (!queue.empty()) {
    const pid_t p = queue.front();
    queue.pop_front();
    if (r.tree.count(p) != 0) continue;  // a fixture's ppid loop
    const auto range = children.equal_range(p);
    for (auto it = range.first; it != range.second; ++it) queue.push_back(it->second);
    const ProcessStat& stat = stats[p];
    ProcessCounters counters;
    counters.cpu_ticks = stat.cpu_ticks;
    r.rss += stat.rss_pages * page_size;
    const std::string dir = "/proc/" + std::to_string(p);
    if (const auto io = system.read(dir + "/io")) {
      counters.read_bytes = host::counter_value(*io, "read_bytes").value_or(0);
      counters.write_bytes = host::counter_value(*io, "write_bytes").value_or(0);
    }
    r.tree[p] = counters;
    for (const std::string& tid : system.list(dir + "/task")) {
      const std::optional<std::string> task = system.read(dir + "/task/" + tid + "/stat");
      if (!task) continue;
      const char state = stat_state(*task);
      if (state == 'R') {
        ++r.threads.running;
      } else if (state == 'D') {
        ++r.threads.io;
      } else {
        ++r.threads.sleeping;
      }
    }
  }
  return r;
}

}  // namespace zerowait::observe
