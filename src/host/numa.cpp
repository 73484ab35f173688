#include "host/numa.hpp"

#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <memory>

namespace zerowait::internal {

namespace {

// Far above any machine's CPU and node numbers; keeps a malformed list from sizing a huge set.
constexpr unsigned kMaxCpu = 1u << 16;
constexpr int kMaxNode = 1 << 12;

// A kernel CPU set large enough for every CPU in `cpus` (CPU_ALLOC: more than CPU_SETSIZE CPUs
// exist on large machines).
struct CpuSet {
  explicit CpuSet(unsigned max_cpu)
      : count(max_cpu + 1), bytes(CPU_ALLOC_SIZE(count)), set(CPU_ALLOC(count), &free_set) {
    CPU_ZERO_S(bytes, set.get());
  }
  static void free_set(cpu_set_t* set) { CPU_FREE(set); }
  unsigned count;
  size_t bytes;
  std::unique_ptr<cpu_set_t, void (*)(cpu_set_t*)> set;
};

}  // namespace

Result<std::vector<unsigned>> parse_cpu_list(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::vector<unsigned> cpus;
  const auto malformed = [&] {
    return invalid_argument("malformed CPU list '" + std::string(text) +
                            "' (expected ranges like \"0-15,32-47\")");
  };
  const auto number = [&](std::string_view digits, unsigned* value) {
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), *value);
    return error == std::errc() && end == digits.data() + digits.size() && !digits.empty() &&
           *value < kMaxCpu;
  };
  size_t start = 0;
  while (start < text.size()) {
    size_t comma = text.find(',', start);
    if (comma == std::string_view::npos) comma = text.size();
    const std::string_view range = text.substr(start, comma - start);
    const size_t dash = range.find('-');
    unsigned first = 0, last = 0;
    if (dash == std::string_view::npos) {
      if (!number(range, &first)) return malformed();
      last = first;
    } else if (!number(range.substr(0, dash), &first) || !number(range.substr(dash + 1), &last) ||
               last < first) {
      return malformed();
    }
    for (unsigned cpu = first; cpu <= last; ++cpu) cpus.push_back(cpu);
    start = comma + 1;
    if (comma + 1 == text.size()) return malformed();  // a trailing comma
  }
  std::sort(cpus.begin(), cpus.end());
  cpus.erase(std::unique(cpus.begin(), cpus.end()), cpus.end());
  return cpus;
}

std::string format_cpu_list(const std::vector<unsigned>& cpus) {
  std::string text;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!text.empty()) text += ',';
    text += std::to_string(cpus[i]);
    if (j > i) text += '-' + std::to_string(cpus[j]);
    i = j + 1;
  }
  return text;
}

std::vector<unsigned> allowed_cpus() {
  // Grows the set until the kernel's mask fits (EINVAL: the set is smaller than the kernel's).
  for (unsigned max_cpu = 1023; max_cpu < kMaxCpu; max_cpu = max_cpu * 2 + 1) {
    CpuSet set(max_cpu);
    if (sched_getaffinity(0, set.bytes, set.set.get()) != 0) {
      if (errno == EINVAL) continue;
      break;
    }
    std::vector<unsigned> cpus;
    for (unsigned cpu = 0; cpu < set.count; ++cpu) {
      if (CPU_ISSET_S(cpu, set.bytes, set.set.get())) cpus.push_back(cpu);
    }
    return cpus;
  }
  return {};
}

Status set_thread_cpus(const std::vector<unsigned>& cpus) {
  if (cpus.empty()) return invalid_argument("no CPUs to run the thread on");
  CpuSet set(*std::max_element(cpus.begin(), cpus.end()));
  for (unsigned cpu : cpus) CPU_SET_S(cpu, set.bytes, set.set.get());
  const int err = pthread_setaffinity_np(pthread_self(), set.bytes, set.set.get());
  if (err == 0) return Status::ok();
  if (err == EINVAL) {
    return invalid_argument("cannot run a thread on CPUs " + format_cpu_list(cpus) +
                            ": none of them is online and allowed to this process (now " +
                            format_cpu_list(allowed_cpus()) + ")");
  }
  return errno_status(err, "cannot set the CPUs of a thread (pthread_setaffinity_np) to",
                      format_cpu_list(cpus));
}

Status bind_memory_to_node(void* address, size_t bytes, int node) {
  if (node < 0 || node >= kMaxNode) {
    return invalid_argument("NUMA node " + std::to_string(node) + " is out of range");
  }
  constexpr size_t kBitsPerWord = 8 * sizeof(unsigned long);
  const auto bit = static_cast<size_t>(node);
  std::vector<unsigned long> mask(bit / kBitsPerWord + 1, 0);
  mask[bit / kBitsPerWord] = 1ul << (bit % kBitsPerWord);
  // The kernel reads one bit fewer than `maxnode` says (as libnuma also allows for).
  const unsigned long max_node = mask.size() * kBitsPerWord + 1;
  if (syscall(SYS_mbind, address, bytes, MPOL_BIND, mask.data(), max_node, MPOL_MF_MOVE) == 0) {
    return Status::ok();
  }
  char range[64];
  std::snprintf(range, sizeof range, "%p + %zu bytes", address, bytes);
  return errno_status(errno, "cannot bind memory to NUMA node " + std::to_string(node) +
                                 " (mbind)", range);
}

Status reset_memory_policy(void* address, size_t bytes) {
  if (syscall(SYS_mbind, address, bytes, MPOL_DEFAULT, nullptr, 0, 0) == 0) return Status::ok();
  char range[64];
  std::snprintf(range, sizeof range, "%p + %zu bytes", address, bytes);
  return errno_status(errno, "cannot reset the memory policy (mbind) of", range);
}

Status check_memory_binding(int node) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* probe = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (probe == MAP_FAILED) return errno_status(errno, "cannot map", "a page to probe mbind");
  Status status = bind_memory_to_node(probe, page, node);
  munmap(probe, page);
  return status;
}

namespace {

// A sysfs file's text through `system`; kNotFound when absent, kIo when there but unreadable.
Result<std::string> read_sysfs(const host::System& system, const std::string& path) {
  if (std::optional<std::string> text = system.read(path)) return std::move(*text);
  if (!system.exists(path)) return not_found(system.host_path(path) + " does not exist");
  return Status(ErrorCode::kIo, "cannot read " + system.host_path(path) +
                                    (system.denied(path) ? ": permission denied" : ""));
}

}  // namespace

std::vector<int> numa_nodes(const host::System& system) {
  std::vector<int> nodes;
  for (const std::string& name : system.list(kNumaNodeDir)) {
    int node = 0;
    const char* digits = name.data() + 4;
    const char* end = name.data() + name.size();
    if (name.size() > 4 && name.starts_with("node") &&
        std::from_chars(digits, end, node).ptr == end) {
      nodes.push_back(node);
    }
  }
  std::sort(nodes.begin(), nodes.end());
  return nodes;
}

Result<std::optional<std::vector<unsigned>>> numa_node_cpus(const host::System& system,
                                                            int node) {
  const std::string dir = std::string(kNumaNodeDir) + "/node" + std::to_string(node);
  if (!system.exists(dir)) return std::optional<std::vector<unsigned>>();
  Result<std::string> text = read_sysfs(system, dir + "/cpulist");
  if (!text && text.status().code() == ErrorCode::kNotFound) {
    return std::optional<std::vector<unsigned>>(std::vector<unsigned>());
  }
  ZW_RETURN_IF_ERROR(text.status());
  Result<std::vector<unsigned>> cpus = parse_cpu_list(*text);
  if (!cpus) {
    return Status(ErrorCode::kCorrupt,
                  system.host_path(dir) + "/cpulist: " + cpus.status().message());
  }
  return std::optional<std::vector<unsigned>>(std::move(*cpus));
}

Result<std::optional<int>> pci_numa_node(const host::System& system,
                                         const std::string& device_dir) {
  const std::string path = device_dir + "/numa_node";
  ZW_ASSIGN_OR_RETURN(const std::string text, read_sysfs(system, path));
  std::string_view value = text;
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) {
    value.remove_suffix(1);
  }
  int node = 0;
  const auto [end, error] = std::from_chars(value.data(), value.data() + value.size(), node);
  if (error != std::errc() || end != value.data() + value.size() || node < -1) {
    return Status(ErrorCode::kCorrupt, system.host_path(path) + " holds '" + std::string(value) +
                                           "', not a NUMA node number");
  }
  if (node == -1) return std::optional<int>();
  return std::optional<int>(node);
}

}  // namespace zerowait::internal
