// Machine-wide memory checks: free memory, swap, transparent huge pages, dirty page limits,
// /dev/shm, locked memory.
#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <sstream>
#include <utility>
#include <vector>

#include "diagnose/doctor/mounts.hpp"
#include "diagnose/doctor/checks.hpp"
#include "host/meminfo.hpp"

namespace zerowait::doctor {
namespace {

using host::parse_counters;

constexpr const char* kMeminfo = "/proc/meminfo";

void check_available(const System& system, FindingList& findings,
                     const std::map<std::string, uint64_t>& meminfo) {
  const auto total = meminfo.find("MemTotal"), available = meminfo.find("MemAvailable");
  if (total == meminfo.end() || available == meminfo.end() || total->second == 0) {
    Finding& f = findings.add("available", Severity::kInfo, "could not read MemTotal/MemAvailable");
    f.evidence = "/proc/meminfo: absent or without those lines";
    if (system.denied(kMeminfo)) not_readable(f, "available memory", kMeminfo);
    return;
  }
  const double share = double(available->second) / double(total->second);
  Finding& f = findings.add("available", share < 0.10 ? Severity::kWarn : Severity::kOk,
                            format_bytes(available->second) + " available of " +
                                format_bytes(total->second) + " (" + format_percent(share) + " %)");
  f.evidence = "/proc/meminfo: MemAvailable " + std::to_string(available->second / 1024) +
               " kB, MemTotal " + std::to_string(total->second / 1024) + " kB";
  if (f.severity == Severity::kOk) return;
  f.why = "the page cache that keeps shards warm is squeezed out, and the next allocation of a "
          "batch arena or checkpoint staging pool may swap or meet the OOM killer";
  f.fix = "find what holds memory: ps aux --sort=-rss | head; lower Loader(memory_budget=...)";
}

void check_swap(const System& system, FindingList& findings,
                const std::map<std::string, uint64_t>& meminfo) {
  const auto total = meminfo.find("SwapTotal"), free = meminfo.find("SwapFree");
  if (total == meminfo.end() || free == meminfo.end()) {
    Finding& f = findings.add("swap", Severity::kInfo, "could not read SwapTotal/SwapFree");
    f.evidence = "/proc/meminfo: absent or without those lines";
    if (system.denied(kMeminfo)) not_readable(f, "swap", kMeminfo);
    return;
  }
  const std::optional<std::string> vmstat_text = system.read("/proc/vmstat");
  const uint64_t used = total->second - std::min(free->second, total->second);
  const std::map<std::string, uint64_t> vmstat = parse_counters(vmstat_text.value_or(""));
  const auto swapped_out = vmstat.find("pswpout");
  const uint64_t pages_out = swapped_out == vmstat.end() ? 0 : swapped_out->second;
  const std::string evidence = "/proc/meminfo: SwapTotal " + std::to_string(total->second / 1024) +
                               " kB, SwapFree " + std::to_string(free->second / 1024) +
                               " kB; /proc/vmstat: pswpout " +
                               (swapped_out != vmstat.end()     ? std::to_string(pages_out)
                                : system.denied("/proc/vmstat") ? std::string(kNotReadable)
                                                                : std::string("absent"));
  if (total->second == 0 || used == 0) {
    findings.add("swap", Severity::kOk, total->second == 0 ? "no swap" : "swap unused").evidence =
        evidence;
    return;
  }
  const std::string summary = "swap in use: " + format_bytes(used) + ", " +
                              format_number(pages_out) + " pages swapped out since boot";
  if (pages_out == 0) {
    findings.add("swap", Severity::kInfo, summary).evidence = evidence;
    return;
  }
  Finding& f = findings.add("swap", Severity::kWarn, summary);
  f.evidence = evidence;
  f.why = "pages of the training process or its loader that were swapped out stall a step when "
          "touched again";
  f.fix = "sysctl -w vm.swappiness=1; find what uses memory: ps aux --sort=-rss | head";
}

void check_transparent_huge_pages(const System& system, FindingList& findings) {
  struct Knob {
    const char* check;
    const char* label;
    const char* file;
    const char* why;
    const char* fix;
  };
  static constexpr Knob kKnobs[] = {
      {"thp_enabled", "transparent huge pages", "/sys/kernel/mm/transparent_hugepage/enabled",
       "THP for every mapping has been seen to break GPU DMA mappings and to stall page faults "
       "in compaction",
       "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled"},
      {"thp_defrag", "transparent huge page defrag", "/sys/kernel/mm/transparent_hugepage/defrag",
       "allocations stall in direct compaction until a huge page is assembled",
       "echo defer+madvise > /sys/kernel/mm/transparent_hugepage/defrag"},
  };
  for (const Knob& knob : kKnobs) {
    const std::optional<std::string> line = system.read_line(knob.file);
    if (!line) {
      Finding& f = findings.add(knob.check, Severity::kInfo, "no transparent huge page setting");
      f.evidence = std::string(knob.file) + ": absent";
      if (system.denied(knob.file)) not_readable(f, knob.label, knob.file);
      continue;
    }
    const std::string active = bracketed_choice(*line);
    Finding& f = findings.add(knob.check, active == "always" ? Severity::kWarn : Severity::kOk,
                              std::string(knob.label) + ": " + active);
    f.evidence = std::string(knob.file) + ": " + *line;
    if (f.severity == Severity::kOk) continue;
    f.why = knob.why;
    f.fix = knob.fix;
  }
}

// The dirty page limit in bytes: *_bytes when set, else *_ratio % of MemTotal (the kernel takes
// the ratio of reclaimable memory, a little less). The text says which file gave it; `denied`
// is set to a file this user may not read (then the limit is not known).
std::optional<uint64_t> dirty_limit(const System& system, const std::string& prefix,
                                    uint64_t mem_total, std::string& text, std::string& denied) {
  const std::string bytes_file = "/proc/sys/vm/" + prefix + "_bytes";
  const std::string ratio_file = "/proc/sys/vm/" + prefix + "_ratio";
  const std::optional<int64_t> bytes = system.read_int(bytes_file);
  if (bytes && *bytes > 0) {
    text = bytes_file + ": " + std::to_string(*bytes);
    return uint64_t(*bytes);
  }
  // An unreadable *_bytes may hold the limit that overrides the ratio.
  if (!bytes && system.denied(bytes_file)) {
    denied = bytes_file;
    return std::nullopt;
  }
  const std::optional<int64_t> ratio = system.read_int(ratio_file);
  if (!ratio && system.denied(ratio_file)) denied = ratio_file;
  if (!ratio || mem_total == 0) return std::nullopt;
  text = ratio_file + ": " + std::to_string(*ratio) + " (" + prefix + "_bytes 0)";
  return mem_total / 100 * uint64_t(std::max<int64_t>(*ratio, 0));
}

void check_dirty(const System& system, FindingList& findings,
                 const std::map<std::string, uint64_t>& meminfo) {
  const auto total_it = meminfo.find("MemTotal");
  const uint64_t mem_total = total_it == meminfo.end() ? 0 : total_it->second;
  std::string limit_source, background_source, denied, background_denied;
  const std::optional<uint64_t> limit =
      dirty_limit(system, "dirty", mem_total, limit_source, denied);
  const std::optional<uint64_t> background =
      dirty_limit(system, "dirty_background", mem_total, background_source, background_denied);
  if (!limit) {
    Finding& f = findings.add("dirty", Severity::kInfo, "dirty page limit not known");
    f.evidence = "/proc/sys/vm/dirty_bytes, dirty_ratio or /proc/meminfo MemTotal: absent";
    if (!denied.empty()) not_readable(f, "dirty page limit", denied);
    if (denied.empty() && mem_total == 0 && system.denied(kMeminfo)) {
      not_readable(f, "dirty page limit", kMeminfo);
    }
    return;
  }
  const double share = mem_total == 0 ? 0 : double(*limit) / double(mem_total);
  // Bytes, not the share, decide how long an fsync waits for writeback: the default 20 % of a
  // 256 GiB machine is 51 GiB of dirty pages.
  const bool too_large = *limit > 16 * kGiB;
  Finding& f = findings.add("dirty", too_large ? Severity::kWarn : Severity::kOk,
                            "dirty page limit " + format_bytes(*limit) +
                                (mem_total ? " (" + format_percent(share) + " % of RAM)" : ""));
  f.evidence = limit_source + " -> " + format_bytes(*limit) + "; " +
               (background ? background_source + " -> " + format_bytes(*background)
                : !background_denied.empty() ? background_denied + ": " + kNotReadable
                                             : "background limit not known") +
               "; /proc/meminfo MemTotal " + std::to_string(mem_total / 1024) + " kB";
  if (!too_large) return;
  f.why = "a checkpoint fills gigabytes of dirty pages before writeback starts; then its fsync "
          "and every other writer stall until they drain";
  f.fix = "sysctl -w vm.dirty_bytes=4294967296 vm.dirty_background_bytes=1073741824";
}

void check_dev_shm(const System& system, FindingList& findings) {
  const std::optional<SpaceInfo> shm = system.space("/dev/shm");
  if (!shm) {
    Finding& f = findings.add("dev_shm", Severity::kInfo, "/dev/shm not measured");
    f.evidence = "statvfs(/dev/shm): not available";
    if (system.denied("/dev/shm")) not_readable(f, "shared memory", "/dev/shm");
    return;
  }
  const Severity severity = shm->bytes_available < 256 * kMiB ? Severity::kFail
                            : shm->bytes_available < kGiB     ? Severity::kWarn
                                                              : Severity::kOk;
  Finding& f = findings.add("dev_shm", severity,
                            "/dev/shm: " + format_bytes(shm->bytes_available) + " free of " +
                                format_bytes(shm->bytes_total));
  f.evidence = "statvfs(/dev/shm): " + std::to_string(shm->bytes_available) + " of " +
               std::to_string(shm->bytes_total) + " bytes available";
  if (severity == Severity::kOk) return;
  f.why = "DataLoader workers and zerowait's map stage pass batches through /dev/shm; when it "
          "fills they die with \"Bus error\" (Docker's default is 64 MiB)";
  f.fix = "mount -o remount,size=16G /dev/shm, or docker run --shm-size=16g";
}

void check_locked_memory(const System& system, FindingList& findings) {
  const std::optional<Limit> limit = system.locked_memory_limit();
  if (!limit) {
    findings.add("locked_memory", Severity::kInfo, "locked memory limit not measured").evidence =
        "getrlimit(RLIMIT_MEMLOCK): not available";
    return;
  }
  const bool low = limit->soft != UINT64_MAX && limit->soft < 64 * kMiB;
  const std::string soft =
      limit->soft == UINT64_MAX ? "unlimited" : format_bytes(limit->soft);
  Finding& f = findings.add("locked_memory", low ? Severity::kWarn : Severity::kInfo,
                            "locked memory limit " + soft);
  f.evidence = "getrlimit(RLIMIT_MEMLOCK): soft " + limit_text(limit->soft) + ", hard " +
               limit_text(limit->hard);
  if (!low) return;
  f.why = "io_uring registered buffers, pinned host memory and RDMA pin pages against this "
          "limit: past it registration fails and transfers fall back to slower paths";
  f.fix = "ulimit -l unlimited, and \"* - memlock unlimited\" in /etc/security/limits.conf "
          "(docker run --ulimit memlock=-1)";
}

}  // namespace

void check_memory(const System& system, std::vector<Finding>& out) {
  FindingList findings(out, "memory");
  const std::map<std::string, uint64_t> meminfo =
      parse_counters(system.read(kMeminfo).value_or(""));
  check_available(system, findings, meminfo);
  check_swap(system, findings, meminfo);
  check_transparent_huge_pages(system, findings);
  check_dirty(system, findings, meminfo);
  check_dev_shm(system, findings);
  check_locked_memory(system, findings);
}

}  // namespace zerowait::doctor
