#include "host/memory_headroom.hpp"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>

#include "host/meminfo.hpp"

namespace zerowait {
namespace {

// The first line of `path` as a number; nullopt for "max", a missing file or anything else.
std::optional<uint64_t> read_number(const std::string& path) {
  std::ifstream in(path);
  std::string text;
  if (!(in >> text) || text.empty() || text.find_first_not_of("0123456789") != std::string::npos) {
    return std::nullopt;
  }
  return std::strtoull(text.c_str(), nullptr, 10);
}

// This process's cgroup v2 path, from the "0::/path" line of /proc/self/cgroup; nullopt without
// one (cgroup v1 only, or unreadable).
std::optional<std::string> own_cgroup(const std::string& proc_root) {
  std::ifstream in(proc_root + "/self/cgroup");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  }
  return std::nullopt;
}

// The `key` line of a cgroup's memory.stat ("inactive_file 123"); 0 when missing.
uint64_t memory_stat(const std::string& dir, const std::string& key) {
  std::ifstream in(dir + "/memory.stat");
  std::string name;
  uint64_t value = 0;
  while (in >> name >> value) {
    if (name == key) return value;
  }
  return 0;
}

}  // namespace

uint64_t available_memory_bytes(const std::string& proc_root) {
  std::ifstream meminfo(proc_root + "/meminfo");
  std::stringstream text;
  text << meminfo.rdbuf();
  return host::mem_available_bytes(text.str()).value_or(0);
}

uint64_t memory_headroom_bytes(const std::string& proc_root, const std::string& cgroup_root) {
  std::optional<uint64_t> headroom;
  if (const uint64_t available = available_memory_bytes(proc_root); available > 0) {
    headroom = available;
  }
  std::optional<std::string> path = own_cgroup(proc_root);
  // Limits nest: the room under every memory.max from this cgroup up to the root counts.
  while (path) {
    const std::string dir = cgroup_root + (*path == "/" ? "" : *path);
    if (const std::optional<uint64_t> limit = read_number(dir + "/memory.max")) {  // not "max"
      // In use as the kernel's OOM killer sees it, as kubelet's working set does: page cache
      // that is inactive would be reclaimed first.
      const uint64_t current = read_number(dir + "/memory.current").value_or(0);
      const uint64_t reclaimable = std::min(current, memory_stat(dir, "inactive_file"));
      const uint64_t used = current - reclaimable;
      const uint64_t room = *limit > used ? *limit - used : 0;
      headroom = std::min(headroom.value_or(room), room);
    }
    if (*path == "/" || path->empty()) break;
    const size_t slash = path->find_last_of('/');
    *path = slash == 0 || slash == std::string::npos ? "/" : path->substr(0, slash);
  }
  return headroom.value_or(0);
}

}  // namespace zerowait
