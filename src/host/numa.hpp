// The operating-system side of NUMA placement: CPU lists as sysfs writes them, the CPUs a thread
// may run on, and binding memory to a node. Which node to use is the loader's decision
// (zerowait/loader/numa.hpp); threads get their CPUs through start_thread
// (thread_placement.hpp).
//
// Memory policy goes through the raw syscalls (mbind), not libnuma: libnuma is not installed on
// these machines and the project takes no new library for three stable system calls.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "host/system.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// The CPUs of a list as sysfs and /proc write it ("0-15,32-47", "1", "" for none), sorted and
// unique. kInvalidArgument naming the list when it is malformed.
Result<std::vector<unsigned>> parse_cpu_list(std::string_view text);
// The inverse: sorted CPUs as "0-15,32-47" ("" for none).
std::string format_cpu_list(const std::vector<unsigned>& cpus);

// The CPUs the calling thread may run on (sched_getaffinity); what threads it starts inherit.
std::vector<unsigned> allowed_cpus();
// Restricts the calling thread to `cpus` (non-empty). kInvalidArgument when none of them is one
// the kernel lets this thread use (offline, or outside its cpuset).
Status set_thread_cpus(const std::vector<unsigned>& cpus);

// Binds [address, address + bytes) to NUMA node `node` (MPOL_BIND): pages not yet touched are
// allocated there when first touched, pages already touched are moved there (MPOL_MF_MOVE).
// `address` must be page-aligned. kIo naming the node and range when the kernel refuses (a node
// that does not exist, a kernel without NUMA, a seccomp filter).
Status bind_memory_to_node(void* address, size_t bytes, int node);
// Returns [address, address + bytes) to the process's memory policy (MPOL_DEFAULT).
Status reset_memory_policy(void* address, size_t bytes);
// Whether this process may bind memory to `node`: binds one page of its own and says why not.
Status check_memory_binding(int node);

// What sysfs says about NUMA, read through `system` (a root prefix for fixture trees). The one
// reader of these facts for the loader's placement and the doctor's NUMA checks.
inline constexpr char kNumaNodeDir[] = "/sys/devices/system/node";

// The nodes sysfs lists (node<N> directories), ascending; empty without a NUMA kernel.
std::vector<int> numa_nodes(const host::System& system);
// Node `node`'s CPUs from its cpulist: nullopt when sysfs does not list the node, empty when it
// has no cpulist. kCorrupt naming the file when the list is malformed, kIo when it cannot be read.
Result<std::optional<std::vector<unsigned>>> numa_node_cpus(const host::System& system, int node);
// The node a PCI device (its sysfs directory, "/sys/bus/pci/devices/0000:18:00.0") is attached
// to, from its numa_node file: nullopt for -1 (one node, or firmware that does not say).
// kNotFound when the file is absent, kIo when it cannot be read, kCorrupt naming the file when it
// holds no node number.
Result<std::optional<int>> pci_numa_node(const host::System& system,
                                         const std::string& device_dir);

}  // namespace zerowait::internal
