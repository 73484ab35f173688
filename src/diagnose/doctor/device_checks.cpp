// The devices checks: NVIDIA GPUs and their driver, GPUDirect Storage, where GPUs sit against the
// NVMe drives and NICs that feed them (NUMA), and PCIe links running below what they can.
#include <dlfcn.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

#include "host/numa.hpp"
#include "host/nvml.hpp"
#include "diagnose/doctor/pci.hpp"
#include "diagnose/doctor/checks.hpp"

namespace zerowait::doctor {
namespace {

constexpr const char* kDevicesArea = "devices";
constexpr const char* kNvidiaVersion = "/proc/driver/nvidia/version";
constexpr const char* kNvidiaGpus = "/proc/driver/nvidia/gpus";
constexpr const char* kNvidiaFsVersion = "/proc/driver/nvidia-fs/version";
constexpr const char* kNodes = internal::kNumaNodeDir;

// "a", "a and b", "a, b and c".
std::string join_and(const std::vector<std::string>& items) {
  std::string text;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i != 0) text += i + 1 == items.size() ? " and " : ", ";
    text += items[i];
  }
  return text;
}

std::string format_gts(double value) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g", value);
  return text;
}

// "GPU 0000:18:00.0", "nvme0 (0000:5e:00.0)", "eth1 (0000:19:00.0)".
std::string describe(const PciAttached& device) {
  if (device.kind == DeviceKind::kGpu) return "GPU " + device.name;
  return device.name + " (" + device.pci.address + ")";
}

// The driver version in /proc/driver/nvidia/version's first line: the first token after
// "Module" that starts with a digit ("... Kernel Module  550.54.15  Tue Mar ..." and "... Open
// Kernel Module for x86_64  550.54.15 ..."); the whole line when there is none.
std::string driver_version(const std::string& line) {
  const size_t module = line.find("Module");
  if (module == std::string::npos) return line;
  std::istringstream tokens(line.substr(module + 6));
  for (std::string token; tokens >> token;) {
    if (std::isdigit(static_cast<unsigned char>(token[0])) && token.find('.') != token.npos) {
      return token;
    }
  }
  return line;
}

// The value of "Field:  value" in an /proc/driver/nvidia/gpus/*/information file.
std::optional<std::string> information_field(const std::string& text, const std::string& field) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(field + ":", 0) != 0) continue;
    const size_t start = line.find_first_not_of(" \t", field.size() + 1);
    return start == std::string::npos ? "" : line.substr(start);
  }
  return std::nullopt;
}

// The information file of the GPU at `address`: the directory of that name, or the one whose
// "Bus Location" names it (older drivers spell the address in capitals).
std::optional<std::string> information_path(const System& system, const std::string& address) {
  const std::string direct = std::string(kNvidiaGpus) + "/" + address + "/information";
  if (system.exists(direct)) return direct;
  for (const std::string& dir : system.list(kNvidiaGpus)) {
    const std::string path = std::string(kNvidiaGpus) + "/" + dir + "/information";
    const std::optional<std::string> text = system.read(path);
    if (!text) continue;
    std::string location = information_field(*text, "Bus Location").value_or("");
    std::transform(location.begin(), location.end(), location.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    if (location == address) return path;
  }
  return std::nullopt;
}

// What NVML reports, live only: "NVML sees 8 GPU(s): NVIDIA H100 80GB HBM3 (x8), driver
// 550.54.15", or why it could not say.
std::string nvml_inventory(const internal::Nvml& nvml) {
  if (!nvml.available()) return nvml.error();
  const unsigned count = nvml.device_count();
  std::map<std::string, unsigned> models;  // name -> how many
  for (unsigned i = 0; i < count; ++i) ++models[nvml.device_name(i).value_or("?")];
  std::vector<std::string> names;
  for (const auto& [name, n] : models) names.push_back(name + " (x" + std::to_string(n) + ")");
  const std::string driver = nvml.driver_version();
  return "NVML sees " + std::to_string(count) + " GPU(s)" +
         (names.empty() ? "" : ": " + join_and(names)) + ", driver " +
         (driver.empty() ? "?" : driver);
}

// "half the bandwidth", "a quarter of the bandwidth", "38% of the bandwidth".
std::string bandwidth_share(double have, double can) {
  if (can <= 0) return "less bandwidth";
  const double ratio = have / can;
  if (ratio == 0.5) return "half the bandwidth";
  if (ratio == 0.25) return "a quarter of the bandwidth";
  return std::to_string(int(ratio * 100 + 0.5)) + "% of the bandwidth";
}

// Each GPU's PCIe link as NVML reports it (a virtual machine's sysfs often has none for a GPU
// passed through), against the most the GPU and its slot allow, and its NUMA node: "GPU 0
// (0000:18:00.0) NVIDIA H200: PCIe Gen5 x16, the most it can (Gen1 now: idle), NUMA node 0".
void check_gpu_links(const System& system, const internal::Nvml& nvml, FindingList& list) {
  for (unsigned i = 0; i < nvml.device_count(); ++i) {
    const std::optional<internal::NvmlPcieLink> link = nvml.pcie_link(i);
    if (!link) continue;
    const bool narrow = link->width < link->max_width;
    const bool slot_slower = link->max_generation < link->gpu_max_generation;
    std::string summary = "GPU " + std::to_string(i) + " (" + link->address + ") " +
                          nvml.device_name(i).value_or("?") + ": PCIe Gen" +
                          std::to_string(link->max_generation) + " x" +
                          std::to_string(link->max_width);
    if (narrow) {
      summary += ", running x" + std::to_string(link->width) + ": " +
                 bandwidth_share(double(link->width), double(link->max_width));
    } else if (slot_slower) {
      summary += ", below the GPU's Gen" + std::to_string(link->gpu_max_generation);
    } else {
      summary += ", the most it can";
    }
    if (link->generation < link->max_generation) {
      summary += " (Gen" + std::to_string(link->generation) + " now: an idle GPU lowers it)";
    }
    const std::string numa_path = std::string(kPciDevices) + "/" + link->address + "/numa_node";
    const Result<std::optional<int>> node =
        internal::pci_numa_node(system, std::string(kPciDevices) + "/" + link->address);
    const std::string numa = !node ? "unknown" : *node ? std::to_string(**node) : "-1";
    summary += ", NUMA node " + (numa == "-1" ? std::string("unknown (-1)") : numa);
    Finding& f = list.add("gpu_link", narrow || slot_slower ? Severity::kWarn : Severity::kInfo,
                          summary);
    f.subject = link->address;
    f.evidence = "NVML: CurrPcieLinkGeneration " + std::to_string(link->generation) +
                 ", MaxPcieLinkGeneration " + std::to_string(link->max_generation) +
                 ", GpuMaxPcieLinkGeneration " + std::to_string(link->gpu_max_generation) +
                 ", CurrPcieLinkWidth " + std::to_string(link->width) + ", MaxPcieLinkWidth " +
                 std::to_string(link->max_width) + "; " + numa_path + ": " + numa;
    if (narrow || slot_slower) {
      f.why = "host-to-GPU copies (batches, checkpoints) are capped by the link: a slower or "
              "narrower link than the GPU's own stretches every one of them";
      f.fix = narrow ? "reseat the card or move it to a full-width slot"
                     : "move the GPU to a slot of its PCIe generation, or check the BIOS link speed";
    }
  }
}

void check_gpus(const System& system, const std::vector<PciAttached>& gpus, FindingList& list) {
  if (gpus.empty()) {
    Finding& f = list.add("gpus", Severity::kInfo, "no NVIDIA GPU");
    f.evidence = std::string(kPciDevices) + ": " +
                 std::to_string(system.list(kPciDevices).size()) +
                 " PCI functions, none with vendor 0x10de and class 0x0300xx or 0x0302xx";
    if (system.denied(kPciDevices)) {
      not_readable(f, "NVIDIA GPUs", kPciDevices);
      return;
    }
    // A function whose vendor or class cannot be read may be a GPU.
    for (const std::string& address : system.list(kPciDevices)) {
      const std::optional<std::string> dir =
          resolve_path(system, std::string(kPciDevices) + "/" + address);
      for (const char* name : {"/vendor", "/class"}) {
        const std::string file = dir.value_or(std::string(kPciDevices) + "/" + address) + name;
        if (system.denied(file)) {
          not_readable(f, "NVIDIA GPUs", file);
          return;
        }
      }
    }
    return;
  }
  const std::optional<std::string> version_line = system.read_line(kNvidiaVersion);
  // An unreadable version file is not a missing driver.
  if (!version_line && system.denied(kNvidiaVersion)) {
    not_readable(list.add("gpus", Severity::kInfo, ""), "NVIDIA driver", kNvidiaVersion);
    return;
  }
  if (!version_line) {
    std::vector<std::string> addresses;
    std::string drivers;
    for (const PciAttached& gpu : gpus) {
      addresses.push_back(gpu.name);
      drivers += "; " + gpu.name + " driver: " +
                 system.link_name(gpu.pci.dir + "/driver").value_or("none");
    }
    Finding& f = list.add("gpus", Severity::kFail,
                          "NVIDIA driver not loaded: " + std::to_string(gpus.size()) +
                              " GPU(s) unusable (" + join_and(addresses) + ")");
    f.evidence = std::string(kNvidiaVersion) + ": absent" + drivers;
    f.why = "without the nvidia kernel module CUDA finds no device: training falls back to the "
            "CPU or stops at torch.cuda init";
    f.fix = "modprobe nvidia (install the driver first if that fails: the distribution's "
            "nvidia-driver package or NVIDIA's cuda-drivers)";
    return;
  }
  const std::string version = driver_version(*version_line);
  for (const PciAttached& gpu : gpus) {
    std::string model;
    std::string evidence;
    const std::optional<std::string> info_path = information_path(system, gpu.name);
    const std::optional<std::string> info = info_path ? system.read(*info_path) : std::nullopt;
    const std::optional<std::string> info_model =
        info ? information_field(*info, "Model") : std::nullopt;
    if (info_model) {
      model = *info_model;
      evidence = *info_path + ": Model: " + model;
    } else {
      const std::string device_id = system.read_line(gpu.pci.dir + "/device").value_or("?");
      model = "device " + device_id;
      const std::string information = std::string(kNvidiaGpus) + "/" + gpu.name + "/information";
      evidence = std::string(kPciDevices) + "/" + gpu.name + "/device: " + device_id + " (" +
                 information + ": " +
                 (system.denied(info_path.value_or(information)) ? kNotReadable : "absent") + ")";
    }
    Finding& f = list.add("gpus", Severity::kInfo,
                          "GPU " + gpu.name + ": " + model + ", driver " + version);
    f.subject = gpu.name;
    f.evidence = evidence + "; " + kNvidiaVersion + ": " + version;
  }
  if (system.live()) {
    const internal::Nvml nvml;
    Finding& f = list.add("gpus", Severity::kInfo, nvml_inventory(nvml));
    f.subject = "NVML";
    f.evidence = "libnvidia-ml.so.1: nvmlDeviceGetCount_v2, nvmlDeviceGetName";
    check_gpu_links(system, nvml, list);
  }
}

void check_gds(const System& system, const std::vector<PciAttached>& gpus, FindingList& list) {
  std::string library;
  if (system.live()) {
    void* cufile = dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    library = cufile != nullptr ? "; libcufile.so.0 loads"
                                : std::string("; libcufile.so.0 not loaded: ") + dlerror();
    if (cufile != nullptr) dlclose(cufile);
  }
  const std::optional<std::string> version = system.read_line(kNvidiaFsVersion);
  if (gpus.empty()) {
    Finding& f = list.add("gds", Severity::kInfo, "GPUDirect Storage: not applicable (no GPU)");
    f.evidence = std::string(kNvidiaFsVersion) + ": " + version.value_or("absent") + library;
    return;
  }
  if (!version && system.denied(kNvidiaFsVersion)) {
    not_readable(list.add("gds", Severity::kInfo, ""), "GPUDirect Storage", kNvidiaFsVersion);
    return;
  }
  if (version) {
    Finding& f = list.add("gds", Severity::kOk,
                          "GPUDirect Storage available: nvidia_fs loaded (" + *version + ")");
    f.evidence = std::string(kNvidiaFsVersion) + ": " + *version + library;
    return;
  }
  Finding& f = list.add("gds", Severity::kInfo,
                        "GPUDirect Storage not available: cuFile runs in compatibility mode "
                        "(through host memory)");
  f.evidence = std::string(kNvidiaFsVersion) + ": absent (nvidia_fs module not loaded)" + library;
  f.why = "without nvidia_fs, reads meant to go storage -> GPU memory are staged in host memory "
          "and copied, costing CPU time and memory bandwidth";
  f.fix = "modprobe nvidia_fs (from NVIDIA's GDS package: nvidia-gds)";
}

void check_numa(const System& system, const std::vector<PciAttached>& gpus,
                const std::vector<PciAttached>& nvmes, const std::vector<PciAttached>& nics,
                FindingList& list) {
  const std::vector<int> nodes = internal::numa_nodes(system);
  std::string node_list;
  for (int node : nodes) node_list += " node" + std::to_string(node);
  const std::string nodes_evidence =
      std::string(kNodes) + ":" + (nodes.empty() ? " no node directories" : node_list);

  // Every device's node, as evidence and for the comparison.
  std::string evidence = nodes_evidence + "; " + kPciDevices + "/*/numa_node:";
  std::vector<std::pair<const PciAttached*, std::optional<int64_t>>> placed;
  std::vector<std::string> unreadable_nodes;  // numa_node files this user may not read
  for (const auto* group : {&gpus, &nvmes, &nics}) {
    for (const PciAttached& device : *group) {
      const std::optional<int64_t> node = numa_node_of(system, device.pci);
      placed.emplace_back(&device, node);
      const bool unread = !node && system.denied(device.pci.dir + "/numa_node");
      if (unread) unreadable_nodes.push_back(device.pci.dir + "/numa_node");
      evidence += " " + describe(device) + " " +
                  (node     ? std::to_string(*node)
                   : unread ? kNotReadable
                            : "-1") +
                  ",";
    }
  }
  if (evidence.back() == ',') evidence.pop_back();

  if (nodes.empty() && system.denied(kNodes)) {
    not_readable(list.add("numa", Severity::kInfo, ""), "NUMA placement", kNodes);
    return;
  }
  if (nodes.size() <= 1) {
    Finding& f =
        list.add("numa", Severity::kInfo, "one NUMA node: every device is local to every CPU");
    f.evidence = nodes_evidence;
    return;
  }
  if (gpus.empty()) {
    Finding& f = list.add("numa", Severity::kInfo,
                          std::to_string(nodes.size()) + " NUMA nodes, no GPU: placement not "
                                                         "checked");
    f.evidence = evidence;
    return;
  }
  for (const auto& [gpu, gpu_node] : placed) {
    if (gpu->kind != DeviceKind::kGpu) continue;
    if (!gpu_node) {
      Finding& f = list.add("numa", Severity::kInfo,
                            "GPU " + gpu->name + ": NUMA node unknown (numa_node -1)");
      f.subject = gpu->name;
      f.evidence = evidence;
      const std::string file = gpu->pci.dir + "/numa_node";
      if (system.denied(file)) {
        not_readable(f, "GPU " + gpu->name + " NUMA node", file);
        f.evidence = evidence;
      }
      continue;
    }
    // NVMe and NICs apart: of those with a known node, does one share the GPU's?
    std::vector<std::string> local;
    std::map<int64_t, std::vector<std::string>> remote_by_node;
    std::set<DeviceKind> remote_kinds;
    for (DeviceKind kind : {DeviceKind::kNvme, DeviceKind::kNic}) {
      std::vector<std::pair<std::string, int64_t>> known;
      for (const auto& [device, node] : placed) {
        if (device->kind == kind && node) known.emplace_back(device->name, *node);
      }
      // A copy: clang 14 cannot capture a structured binding in a lambda.
      const int64_t gpu_numa_node = *gpu_node;
      const bool shares = std::any_of(known.begin(), known.end(), [gpu_numa_node](const auto& d) {
        return d.second == gpu_numa_node;
      });
      for (const auto& [name, node] : known) {
        if (node == *gpu_node) local.push_back(name);
        if (!shares) remote_by_node[node].push_back(name);
      }
      if (!known.empty() && !shares) remote_kinds.insert(kind);
    }
    const std::string node = std::to_string(*gpu_node);
    const std::string where = "GPU " + gpu->name + " is on node " + node;
    if (remote_kinds.empty()) {
      // A device whose node could not be read may be the remote one: no "ok" then.
      Finding& f = list.add(
          "numa", unreadable_nodes.empty() ? Severity::kOk : Severity::kInfo,
          where +
              (local.empty() ? " (no NVMe or NIC with a known node)" : " with " + join_and(local)) +
              (unreadable_nodes.empty() ? ""
                                        : "; " + std::to_string(unreadable_nodes.size()) +
                                              " devices' numa_node " + kNotReadable));
      f.subject = gpu->name;
      f.evidence = evidence;
      continue;
    }
    std::vector<std::string> remote;
    for (const auto& [remote_node, names] : remote_by_node) {
      remote.push_back(join_and(names) + (names.size() == 1 ? " is" : " are") + " on node " +
                       std::to_string(remote_node));
    }
    Finding& f = list.add("numa", Severity::kWarn,
                          where + "; " + join_and(remote) +
                              ": every batch crosses the socket link");
    f.subject = gpu->name;
    f.evidence = evidence;
    f.why = "data read or received on another socket lands in that socket's memory and crosses "
            "the inter-socket link to reach the GPU (seen: 842 -> 1,127 samples/s once pinned)";
    f.fix = "zerowait.Loader(numa=\"auto\") pins the loader to the GPU's node (or run the rank "
            "under numactl --cpunodebind=" + node + " --membind=" + node + ")";
    if (remote_kinds.count(DeviceKind::kNvme)) {
      f.fix += "; keep the data on an NVMe of node " + node;
    }
    if (remote_kinds.count(DeviceKind::kNic)) {
      f.fix += "; give this rank a NIC of node " + node + " (NCCL_SOCKET_IFNAME, NCCL_IB_HCA)";
    }
  }
}

void check_pcie_links(const System& system, const std::vector<PciAttached>& devices,
                      FindingList& list) {
  if (devices.empty()) {
    Finding& f = list.add("pcie_link", Severity::kInfo, "no GPU, NVMe controller or NIC on PCI");
    f.evidence = std::string(kPciDevices) + ", /sys/class/nvme/*/device, /sys/class/net/*/device";
    return;
  }
  // One finding per PCI function, naming every device on it (two ports of one NIC).
  std::vector<std::string> order;
  std::map<std::string, std::vector<const PciAttached*>> by_address;
  for (const PciAttached& device : devices) {
    if (by_address[device.pci.address].empty()) order.push_back(device.pci.address);
    by_address[device.pci.address].push_back(&device);
  }
  for (const std::string& address : order) {
    const PciAttached& first = *by_address[address].front();
    std::vector<std::string> names;
    for (const PciAttached* device : by_address[address]) names.push_back(device->name);
    const std::string who = first.kind == DeviceKind::kGpu
                                ? "GPU " + address
                                : join_and(names) + " (" + address + ")";
    const std::optional<PcieLink> link = pcie_link_of(system, first.pci);
    if (!link) {
      Finding& f = list.add("pcie_link", Severity::kInfo,
                            who + ": no PCIe link attributes (emulated or virtual function)");
      f.subject = first.name;
      f.evidence = first.pci.dir + ": no current_link_width / max_link_width";
      for (const char* name : {"/current_link_width", "/max_link_width"}) {
        if (system.denied(first.pci.dir + name)) {
          not_readable(f, who + " PCIe link", first.pci.dir + name);
          break;
        }
      }
      continue;
    }
    const std::string evidence = std::string(kPciDevices) + "/" + address +
                                 "/current_link_width: " + std::to_string(link->width) +
                                 ", max_link_width: " + std::to_string(link->max_width) +
                                 ", current_link_speed: " + link->speed +
                                 ", max_link_speed: " + link->max_speed;
    const bool narrow = link->width < link->max_width;
    const bool slow = link->speed_gts > 0 && link->speed_gts < link->max_speed_gts;
    // Widths read but a speed this user may not read: the width is judged, the speed is not.
    const bool speed_denied = (link->speed.empty() || link->max_speed.empty()) &&
                              (system.denied(first.pci.dir + "/current_link_speed") ||
                               system.denied(first.pci.dir + "/max_link_speed"));
    if (!narrow && !slow) {
      Finding& f = list.add("pcie_link", speed_denied ? Severity::kInfo : Severity::kOk,
                            who + ": x" + std::to_string(link->width) + " at " + link->speed +
                                (speed_denied ? std::string(", link speed ") + kNotReadable
                                              : std::string(", the most it can")));
      f.subject = first.name;
      f.evidence = evidence;
      continue;
    }
    const bool gpu = first.kind == DeviceKind::kGpu;
    // A GPU lowers its link speed when idle to save power; only a narrow link is a fault then.
    const Severity severity = narrow || !gpu ? Severity::kWarn : Severity::kInfo;
    std::vector<std::string> parts;
    std::vector<std::string> whys;
    if (narrow) {
      parts.push_back("runs x" + std::to_string(link->width) + " of x" +
                      std::to_string(link->max_width) + ": " +
                      bandwidth_share(double(link->width), double(link->max_width)));
      whys.push_back("a link with fewer lanes than the device has caps every transfer to and "
                     "from it (batches, checkpoints, collectives)");
    }
    if (slow) {
      parts.push_back("at " + format_gts(link->speed_gts) + " of " +
                      format_gts(link->max_speed_gts) + " GT/s" +
                      (gpu ? " (GPUs lower the link speed when idle; check under load)"
                           : ": " + bandwidth_share(link->speed_gts, link->max_speed_gts) +
                                 " per lane"));
      whys.push_back(gpu ? "an idle GPU's slower link is normal; one that stays slow under load "
                           "cuts host-to-GPU copies"
                         : "the link trained at a lower PCIe generation than both ends support");
    }
    Finding& f = list.add("pcie_link", severity, who + " " + join_and(parts));
    f.subject = first.name;
    f.evidence = evidence;
    f.why = join_and(whys);
    if (narrow) {
      f.fix = "reseat the card or move it to a full-width slot; check the BIOS lane bifurcation "
              "setting for the slot";
    } else if (gpu) {
      f.fix = "watch nvidia-smi -q -d PCIE under load: Link Gen Current should reach Max";
    } else {
      f.fix = "check the slot's PCIe generation and the BIOS link speed setting; reseat the card";
    }
  }
}

}  // namespace

void check_devices(const System& system, std::vector<Finding>& out) {
  FindingList list(out, kDevicesArea);
  const std::vector<PciAttached> gpus = find_gpus(system);
  const std::vector<PciAttached> nvmes = find_nvme_controllers(system);
  const std::vector<PciAttached> nics = find_pci_nics(system);
  check_gpus(system, gpus, list);
  check_gds(system, gpus, list);
  // NUMA placement counts only NICs that can carry traffic; a port that is down feeds nothing.
  std::vector<PciAttached> active_nics;
  for (const PciAttached& nic : nics) {
    const std::string operstate = std::string(kNetClass) + "/" + nic.name + "/operstate";
    const std::string state = system.read_line(operstate).value_or("unknown");
    if (state != "down" && state != "lowerlayerdown" && state != "notpresent") {
      active_nics.push_back(nic);
    }
  }
  check_numa(system, gpus, nvmes, active_nics, list);
  std::vector<PciAttached> linked = gpus;
  linked.insert(linked.end(), nvmes.begin(), nvmes.end());
  linked.insert(linked.end(), nics.begin(), nics.end());
  check_pcie_links(system, linked, list);
}

}  // namespace zerowait::doctor
