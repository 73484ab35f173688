// NUMA placement of a loader: which node's CPUs its threads run on and whose memory its batch
// arenas use. On a machine with several sockets a GPU hangs off one of them; batches built and
// held on that socket's node reach the GPU without crossing the inter-socket link, and the
// loader's threads stay off the other socket's cores.
//
// The node comes from sysfs: /sys/bus/pci/devices/<bus id>/numa_node for a GPU ("auto"),
// /sys/devices/system/node/node<N>/cpulist for a node's CPUs.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "zerowait/common/status.hpp"

namespace zerowait {

struct NumaRequest {
  enum class Kind {
    kNone,  // leave threads and memory as they are
    kAuto,  // the node the GPU `gpu_pci_bus_id` is attached to, when sysfs knows one
    kNode,  // node `node`, which must exist and have CPUs
  };
  Kind kind = Kind::kNone;
  int node = -1;  // kNode
  // kAuto: the PCI address of the GPU the batches go to, "0000:18:00.0" (domain included; any
  // case). Empty: there is no CUDA device, so nothing is bound.
  std::string gpu_pci_bus_id;
  // Prefix of the sysfs paths read: "" is the live /sys; tests point it at a fixture tree.
  std::string sysfs_root;
};

// What to do: a node and the CPUs to run on, or nothing, and why in words.
struct NumaPlacement {
  std::optional<int> node;     // none: threads and memory are left as they were
  std::vector<unsigned> cpus;  // the node's CPUs that this process may use; empty without a node
  std::string reason;          // what was chosen and from what, or why nothing was
};

// Chooses the placement for `request`; `allowed_cpus` are the CPUs the caller may run on
// (sched_getaffinity; the loader passes its creating thread's). Reads only sysfs; binds nothing.
//
// kAuto asks sysfs for the GPU's node: no CUDA device, a GPU that sysfs does not list, a
// numa_node of -1 (one node, or firmware that does not say) and a node whose CPUs are all outside
// `allowed_cpus` give no node, with the reason: "auto" places when it can and says when it
// cannot. kNode is an explicit request, so one that cannot be honoured is an error
// (kInvalidArgument): a node that does not exist (the message names those that do), a node
// without CPUs, or none of its CPUs in `allowed_cpus`. Malformed sysfs files are kCorrupt.
Result<NumaPlacement> choose_numa_placement(const NumaRequest& request,
                                            const std::vector<unsigned>& allowed_cpus);

}  // namespace zerowait
