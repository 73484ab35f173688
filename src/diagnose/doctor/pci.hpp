// The PCI side of the machine as sysfs shows it, for the device and network checks: which GPUs,
// NVMe controllers and NICs there are, the PCI function each sits on, its NUMA node and its link.
// Everything is read through System, so fixture trees that mirror sysfs work the same.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "diagnose/doctor/checks.hpp"

namespace zerowait::doctor {

// Where sysfs lists PCI functions (links into /sys/devices) and network interfaces.
inline constexpr const char* kPciDevices = "/sys/bus/pci/devices";
inline constexpr const char* kNetClass = "/sys/class/net";

// A PCI function: its address and its directory under /sys/devices (links resolved).
struct PciFunction {
  std::string address;  // "0000:18:00.0"
  std::string dir;      // "/sys/devices/pci0000:17/0000:17:00.0/0000:18:00.0"
};

enum class DeviceKind { kGpu, kNvme, kNic };

// A GPU, NVMe controller or network interface, and the PCI function it sits on.
struct PciAttached {
  DeviceKind kind = DeviceKind::kGpu;
  std::string name;  // the PCI address for a GPU, "nvme0", "eth1"
  PciFunction pci;
};

// "GPU", "NVMe", "NIC".
const char* device_kind_name(DeviceKind kind);

// A machine path with every symbolic link followed inside the system's root, like realpath();
// nullopt on a link loop. Components need not exist.
std::optional<std::string> resolve_path(const System& system, const std::string& path);

// The PCI function a class device's `device` link leads to ("/sys/class/net/eth0/device"): the
// nearest directory named like a PCI address on the resolved path, so a virtio NIC
// (.../0000:00:03.0/virtio2) gives its PCI function. nullopt when the link is absent or leads to
// no PCI function (NVMe over fabrics, a platform device).
std::optional<PciFunction> pci_function_of(const System& system, const std::string& device_link);

// NVIDIA GPUs: /sys/bus/pci/devices/* with vendor 0x10de and class 0x0300xx (VGA) or 0x0302xx
// (3D controller), in address order.
std::vector<PciAttached> find_gpus(const System& system);
// NVMe controllers of /sys/class/nvme that sit on a PCI function.
std::vector<PciAttached> find_nvme_controllers(const System& system);
// Network interfaces of /sys/class/net with a `device` link to a PCI function (physical NICs;
// lo, bridges, veth and docker0 have no `device`).
std::vector<PciAttached> find_pci_nics(const System& system);

// The function's NUMA node from its numa_node file; nullopt when unreadable or -1 (firmware
// did not say, or a machine with one node).
std::optional<int64_t> numa_node_of(const System& system, const PciFunction& pci);

// A PCIe link's width and speed, current and maximum, as sysfs gives them.
struct PcieLink {
  int64_t width = 0;       // lanes, current_link_width
  int64_t max_width = 0;   // max_link_width
  std::string speed;       // current_link_speed: "16.0 GT/s PCIe"
  std::string max_speed;   // max_link_speed
  double speed_gts = 0;    // the speed's number of GT/s; 0 when sysfs says "Unknown"
  double max_speed_gts = 0;
};

// nullopt when the function has no link attributes (virtual functions, emulated devices).
std::optional<PcieLink> pcie_link_of(const System& system, const PciFunction& pci);

}  // namespace zerowait::doctor
