#include "zerowait/loader/numa.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <iterator>
#include <system_error>

#include "common/file.hpp"
#include "host/numa.hpp"

namespace zerowait {

namespace {

constexpr const char* kNodeDir = internal::kNumaNodeDir;
constexpr char kPciDir[] = "/sys/bus/pci/devices";

std::string join_nodes(const std::vector<int>& nodes) {
  std::string text;
  for (int node : nodes) text += (text.empty() ? "" : ", ") + std::to_string(node);
  return text;
}

std::vector<unsigned> intersect(const std::vector<unsigned>& a, std::vector<unsigned> b) {
  std::sort(b.begin(), b.end());
  std::vector<unsigned> both;
  std::set_intersection(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(both));
  return both;
}

// ", CPUs 2-3 of its 2-7 (those this process may use)" when the process may not use them all.
std::string narrowed(const std::vector<unsigned>& node_cpus, const std::vector<unsigned>& cpus) {
  if (cpus.size() == node_cpus.size()) return "";
  return ", CPUs " + internal::format_cpu_list(cpus) + " of its " +
         internal::format_cpu_list(node_cpus) + " (those this process may use)";
}

// "0000:18:00.0" in lower case; "18:00.0" gets domain 0. kInvalidArgument for anything that is
// not a PCI address (it becomes part of a path).
Result<std::string> normalize_bus_id(const std::string& bus_id) {
  std::string id;
  for (char c : bus_id) id += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (std::count(id.begin(), id.end(), ':') == 1) id = "0000:" + id;
  const bool shaped = id.size() == 12 && id[4] == ':' && id[7] == ':' && id[10] == '.';
  const bool hex = std::all_of(id.begin(), id.end(), [](char c) {
    return std::isxdigit(static_cast<unsigned char>(c)) || c == ':' || c == '.';
  });
  if (!shaped || !hex) {
    return invalid_argument("'" + bus_id + "' is not a PCI address (expected \"0000:18:00.0\")");
  }
  return id;
}

Result<NumaPlacement> choose_auto(const NumaRequest& request,
                                  const std::vector<unsigned>& allowed) {
  NumaPlacement placement;
  if (request.gpu_pci_bus_id.empty()) {
    placement.reason = "no CUDA device";
    return placement;
  }
  ZW_ASSIGN_OR_RETURN(const std::string id, normalize_bus_id(request.gpu_pci_bus_id));
  const std::string path = request.sysfs_root + kPciDir + "/" + id + "/numa_node";
  Result<std::optional<int>> read =
      internal::pci_numa_node(host::System(request.sysfs_root), std::string(kPciDir) + "/" + id);
  if (!read && read.status().code() == ErrorCode::kNotFound) {
    placement.reason = "the GPU at " + id + " has no " + path + ", so its node is unknown";
    return placement;
  }
  ZW_RETURN_IF_ERROR(read.status());
  if (!*read) {
    placement.reason = "the GPU at " + id + " reports no NUMA node (numa_node is -1: a machine " +
                       "with one node, or firmware that does not say)";
    return placement;
  }
  const int node = **read;
  ZW_ASSIGN_OR_RETURN(const std::optional<std::vector<unsigned>> cpus,
                      internal::numa_node_cpus(host::System(request.sysfs_root), node));
  const std::string attached = "the GPU at " + id + " is attached to node " + std::to_string(node);
  if (!cpus || cpus->empty()) {
    placement.reason = attached + ", which has no CPUs listed in " + kNodeDir;
    return placement;
  }
  const std::vector<unsigned> usable = intersect(allowed, *cpus);
  if (usable.empty()) {
    placement.reason = attached + ", whose CPUs (" + internal::format_cpu_list(*cpus) +
                       ") are all outside those this process may use (" +
                       internal::format_cpu_list(allowed) + ")";
    return placement;
  }
  placement.node = node;
  placement.cpus = usable;
  placement.reason = attached + narrowed(*cpus, usable);
  return placement;
}

Result<NumaPlacement> choose_node(const NumaRequest& request,
                                  const std::vector<unsigned>& allowed) {
  const int node = request.node;
  const std::string name = "NUMA node " + std::to_string(node);
  if (node < 0) return invalid_argument(name + " is not a node number (0 or more)");
  ZW_ASSIGN_OR_RETURN(const std::optional<std::vector<unsigned>> cpus,
                      internal::numa_node_cpus(host::System(request.sysfs_root), node));
  if (!cpus || cpus->empty()) {
    const std::vector<int> nodes = internal::numa_nodes(host::System(request.sysfs_root));
    std::vector<int> with_cpus;
    for (int other : nodes) {
      Result<std::optional<std::vector<unsigned>>> listed =
          internal::numa_node_cpus(host::System(request.sysfs_root), other);
      if (listed && *listed && !(*listed)->empty()) with_cpus.push_back(other);
    }
    if (nodes.empty()) {
      return invalid_argument(name + " does not exist: this machine lists no NUMA nodes in " +
                              request.sysfs_root + kNodeDir);
    }
    if (!cpus) {
      return invalid_argument(name + " does not exist; this machine has node" +
                              (nodes.size() > 1 ? "s " : " ") + join_nodes(nodes));
    }
    return invalid_argument(name + " has no CPUs (a memory-only node); nodes with CPUs: " +
                            (with_cpus.empty() ? "none" : join_nodes(with_cpus)));
  }
  const std::vector<unsigned> usable = intersect(allowed, *cpus);
  if (usable.empty()) {
    return invalid_argument("none of " + name + "'s CPUs (" + internal::format_cpu_list(*cpus) +
                            ") is one this process may run on (" +
                            internal::format_cpu_list(allowed) + ")");
  }
  NumaPlacement placement;
  placement.node = node;
  placement.cpus = usable;
  placement.reason = "node " + std::to_string(node) + " as requested" + narrowed(*cpus, usable);
  return placement;
}

}  // namespace

Result<NumaPlacement> choose_numa_placement(const NumaRequest& request,
                                            const std::vector<unsigned>& allowed_cpus) {
  std::vector<unsigned> allowed = allowed_cpus;
  std::sort(allowed.begin(), allowed.end());
  switch (request.kind) {
    case NumaRequest::Kind::kNone:
      return NumaPlacement{std::nullopt, {}, "not requested"};
    case NumaRequest::Kind::kAuto:
      return choose_auto(request, allowed);
    case NumaRequest::Kind::kNode:
      return choose_node(request, allowed);
  }
  return Status(ErrorCode::kInternal, "unknown NumaRequest kind");
}

}  // namespace zerowait
