// `zerowait doctor`'s devices and network checks against fixture machines whose /sys and /proc
// mirror real sysfs: PCI functions under a root port, /sys/bus/pci/devices and /sys/class/*
// reaching them through symbolic links, virtual interfaces without a `device` link.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "testing/doctor_fixture.hpp"

namespace zerowait {
namespace {

using doctor::DoctorReport;
using doctor::Finding;
using doctor::Severity;
using testing::contains;
using testing::DoctorFixture;
using testing::findings_of;
using testing::only_finding;

constexpr const char* kRootPort = "pci0000:17/0000:17:00.0";

struct Pci {
  std::string vendor = "0x15b3";
  std::string device_class = "0x020000";
  int numa_node = 0;
  int width = 16;  // 0: no link attributes
  int max_width = 16;
  std::string speed = "16.0 GT/s PCIe";
  std::string max_speed = "16.0 GT/s PCIe";
};

// A PCI function below the root port, linked from /sys/bus/pci/devices as sysfs does. Returns
// its directory.
std::string add_pci(DoctorFixture& fx, const std::string& address, const Pci& pci) {
  const std::string dir = std::string("/sys/devices/") + kRootPort + "/" + address;
  fx.file(dir + "/vendor", pci.vendor + "\n");
  fx.file(dir + "/class", pci.device_class + "\n");
  fx.file(dir + "/device", "0x2330\n");
  fx.file(dir + "/numa_node", std::to_string(pci.numa_node) + "\n");
  if (pci.width != 0) {
    fx.file(dir + "/current_link_width", std::to_string(pci.width) + "\n");
    fx.file(dir + "/max_link_width", std::to_string(pci.max_width) + "\n");
    fx.file(dir + "/current_link_speed", pci.speed + "\n");
    fx.file(dir + "/max_link_speed", pci.max_speed + "\n");
  }
  fx.link("/sys/bus/pci/devices/" + address, std::string("../../../devices/") + kRootPort + "/" +
                                                 address);
  return dir;
}

void add_gpu(DoctorFixture& fx, const std::string& address, Pci pci = {}) {
  pci.vendor = "0x10de";
  pci.device_class = "0x030200";
  add_pci(fx, address, pci);
}

void add_nvidia_driver(DoctorFixture& fx) {
  fx.file("/proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:12 UTC "
          "2024\nGCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n");
}

void add_nvme(DoctorFixture& fx, const std::string& name, const std::string& address, Pci pci) {
  pci.vendor = "0x144d";
  pci.device_class = "0x010802";
  const std::string dir = add_pci(fx, address, pci);
  fx.link(dir + "/nvme/" + name + "/device", "../../../" + address);
  fx.link("/sys/class/nvme/" + name,
          std::string("../../devices/") + kRootPort + "/" + address + "/nvme/" + name);
}

struct Net {
  std::string operstate = "up";
  int mtu = 1500;
  int speed = 25000;
  int type = 1;  // ARPHRD_ETHER
};

void add_net_files(DoctorFixture& fx, const std::string& dir, const Net& net) {
  fx.file(dir + "/operstate", net.operstate + "\n");
  fx.file(dir + "/mtu", std::to_string(net.mtu) + "\n");
  fx.file(dir + "/speed", std::to_string(net.speed) + "\n");
  fx.file(dir + "/type", std::to_string(net.type) + "\n");
}

// A physical NIC: its PCI function, and /sys/class/net/<name> linking into it.
void add_nic(DoctorFixture& fx, const std::string& name, const std::string& address, Pci pci,
             Net net = {}) {
  const std::string dir = add_pci(fx, address, pci) + "/net/" + name;
  add_net_files(fx, dir, net);
  fx.link(dir + "/device", "../../../" + address);
  fx.link("/sys/class/net/" + name,
          std::string("../../devices/") + kRootPort + "/" + address + "/net/" + name);
}

// lo, docker0, veth*: no `device` link, speed unreadable (-1 here).
void add_virtual_interface(DoctorFixture& fx, const std::string& name, Net net = {}) {
  net.speed = -1;
  add_net_files(fx, "/sys/devices/virtual/net/" + name, net);
  fx.link("/sys/class/net/" + name, "../../devices/virtual/net/" + name);
}

void add_numa_nodes(DoctorFixture& fx, int count) {
  for (int node = 0; node < count; ++node) {
    fx.dir("/sys/devices/system/node/node" + std::to_string(node));
  }
  fx.file("/sys/devices/system/node/online", count == 1 ? "0\n" : "0-" + std::to_string(count - 1));
}

void add_rdma_port(DoctorFixture& fx, const std::string& device, int port, const std::string& state,
                   const std::string& link_layer = "InfiniBand") {
  const std::string dir = "/sys/class/infiniband/" + device + "/ports/" + std::to_string(port);
  fx.file(dir + "/state", state + "\n");
  fx.file(dir + "/link_layer", link_layer + "\n");
  fx.file(dir + "/rate", "200 Gb/sec (4X HDR)\n");
}

std::vector<Finding> with_severity(const DoctorReport& report, const std::string& check,
                                   Severity severity) {
  std::vector<Finding> found;
  for (const Finding& f : findings_of(report, check)) {
    if (f.severity == severity) found.push_back(f);
  }
  return found;
}

// ---- devices.gpus ----

TEST(DoctorGpus, ListsEachGpuWithModelAndDriverVersion) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0");
  add_gpu(fx, "0000:3b:00.0");
  add_pci(fx, "0000:05:00.0", {.vendor = "0x10de", .device_class = "0x068000"});  // NVSwitch
  add_pci(fx, "0000:03:00.0", {.vendor = "0x1a03", .device_class = "0x030000"});  // BMC VGA
  add_nvidia_driver(fx);
  fx.file("/proc/driver/nvidia/gpus/0000:18:00.0/information",
          "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 16\nBus Location: \t 0000:18:00.0\n");
  // Older drivers: the directory's name is not the sysfs address; Bus Location says which.
  fx.file("/proc/driver/nvidia/gpus/0000:3B:00.0/information",
          "Model: \t\t NVIDIA A100-SXM4-40GB\nBus Location: \t 0000:3B:00.0\n");
  const DoctorReport report = fx.run();

  const std::vector<Finding> gpus = findings_of(report, "devices.gpus");
  ASSERT_EQ(gpus.size(), 2u);
  EXPECT_EQ(gpus[0].severity, Severity::kInfo);
  EXPECT_EQ(gpus[0].subject, "0000:18:00.0");
  EXPECT_EQ(gpus[0].summary, "GPU 0000:18:00.0: NVIDIA H100 80GB HBM3, driver 550.54.15");
  EXPECT_TRUE(contains(gpus[0].evidence, "/proc/driver/nvidia/gpus/0000:18:00.0/information"));
  EXPECT_EQ(gpus[1].summary, "GPU 0000:3b:00.0: NVIDIA A100-SXM4-40GB, driver 550.54.15");
  EXPECT_EQ(gpus[1].area, "devices");
}

TEST(DoctorGpus, OpenKernelModuleVersionAndMissingInformationFile) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0");
  fx.file("/proc/driver/nvidia/version",
          "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  560.35.03  Release Build\n");
  const Finding gpu = only_finding(fx.run(), "devices.gpus");
  EXPECT_EQ(gpu.severity, Severity::kInfo);
  EXPECT_EQ(gpu.summary, "GPU 0000:18:00.0: device 0x2330, driver 560.35.03");
}

TEST(DoctorGpus, NoGpuIsInfo) {
  DoctorFixture fx;
  add_pci(fx, "0000:03:00.0", {.vendor = "0x1a03", .device_class = "0x030000"});
  const Finding gpus = only_finding(fx.run(), "devices.gpus");
  EXPECT_EQ(gpus.severity, Severity::kInfo);
  EXPECT_EQ(gpus.summary, "no NVIDIA GPU");
  EXPECT_TRUE(contains(gpus.evidence, "1 PCI functions"));
}

TEST(DoctorGpus, GpusWithoutTheDriverFail) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0");
  add_gpu(fx, "0000:3b:00.0");
  const Finding gpus = only_finding(fx.run(), "devices.gpus");
  EXPECT_EQ(gpus.severity, Severity::kFail);
  EXPECT_TRUE(contains(gpus.summary, "NVIDIA driver not loaded")) << gpus.summary;
  EXPECT_TRUE(contains(gpus.summary, "0000:18:00.0 and 0000:3b:00.0")) << gpus.summary;
  EXPECT_TRUE(contains(gpus.evidence, "/proc/driver/nvidia/version: absent")) << gpus.evidence;
  EXPECT_FALSE(gpus.why.empty());
  EXPECT_TRUE(contains(gpus.fix, "modprobe nvidia")) << gpus.fix;
}

// ---- devices.gds ----

TEST(DoctorGds, LoadedNvidiaFsIsOk) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0");
  add_nvidia_driver(fx);
  fx.file("/proc/driver/nvidia-fs/version", "version: 2.17.5\n");
  const Finding gds = only_finding(fx.run(), "devices.gds");
  EXPECT_EQ(gds.severity, Severity::kOk);
  EXPECT_TRUE(contains(gds.summary, "2.17.5")) << gds.summary;
  EXPECT_EQ(gds.evidence, "/proc/driver/nvidia-fs/version: version: 2.17.5");
}

TEST(DoctorGds, GpusWithoutNvidiaFsRunCufileInCompatibilityMode) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0");
  add_nvidia_driver(fx);
  const Finding gds = only_finding(fx.run(), "devices.gds");
  EXPECT_EQ(gds.severity, Severity::kInfo);
  EXPECT_EQ(gds.summary,
            "GPUDirect Storage not available: cuFile runs in compatibility mode (through host "
            "memory)");
  EXPECT_TRUE(contains(gds.evidence, "/proc/driver/nvidia-fs/version: absent"));
  EXPECT_FALSE(gds.why.empty());
  EXPECT_TRUE(contains(gds.fix, "modprobe nvidia_fs")) << gds.fix;
}

TEST(DoctorGds, NotApplicableWithoutGpu) {
  DoctorFixture fx;
  const Finding gds = only_finding(fx.run(), "devices.gds");
  EXPECT_EQ(gds.severity, Severity::kInfo);
  EXPECT_TRUE(contains(gds.summary, "not applicable")) << gds.summary;
  EXPECT_TRUE(gds.fix.empty());
}

// ---- devices.numa ----

TEST(DoctorNuma, GpuSharingItsNodeWithNvmeAndNicIsOk) {
  DoctorFixture fx;
  add_numa_nodes(fx, 2);
  add_gpu(fx, "0000:18:00.0", {.numa_node = 0});
  add_nvme(fx, "nvme0", "0000:5e:00.0", {.numa_node = 0});
  add_nvme(fx, "nvme1", "0000:d8:00.0", {.numa_node = 1});
  add_nic(fx, "eth1", "0000:19:00.0", {.numa_node = 0});
  const Finding numa = only_finding(fx.run(), "devices.numa");
  EXPECT_EQ(numa.severity, Severity::kOk);
  EXPECT_EQ(numa.summary, "GPU 0000:18:00.0 is on node 0 with nvme0 and eth1");
  EXPECT_TRUE(contains(numa.evidence, "nvme1 (0000:d8:00.0) 1")) << numa.evidence;
}

TEST(DoctorNuma, GpuAwayFromEveryNvmeAndActiveNicWarns) {
  DoctorFixture fx;
  add_numa_nodes(fx, 2);
  add_gpu(fx, "0000:18:00.0", {.numa_node = 0});
  add_nvme(fx, "nvme0", "0000:d8:00.0", {.numa_node = 1});
  add_nic(fx, "eth1", "0000:af:00.0", {.numa_node = 1});
  // A NIC that is down on the GPU's node carries nothing: it does not count as local.
  add_nic(fx, "eth0", "0000:19:00.0", {.numa_node = 0}, {.operstate = "down"});
  const Finding numa = only_finding(fx.run(), "devices.numa");
  EXPECT_EQ(numa.severity, Severity::kWarn);
  EXPECT_EQ(numa.subject, "0000:18:00.0");
  EXPECT_EQ(numa.summary,
            "GPU 0000:18:00.0 is on node 0; nvme0 and eth1 are on node 1: every batch crosses "
            "the socket link");
  EXPECT_TRUE(contains(numa.why, "842 -> 1,127 samples/s")) << numa.why;
  EXPECT_TRUE(contains(numa.fix, "zerowait.Loader(numa=\"auto\")")) << numa.fix;
  EXPECT_TRUE(contains(numa.fix, "NVMe of node 0")) << numa.fix;
}

TEST(DoctorNuma, OneNodeIsInfo) {
  DoctorFixture fx;
  add_numa_nodes(fx, 1);
  add_gpu(fx, "0000:18:00.0", {.numa_node = 0});
  add_nvme(fx, "nvme0", "0000:d8:00.0", {.numa_node = 0});
  const Finding numa = only_finding(fx.run(), "devices.numa");
  EXPECT_EQ(numa.severity, Severity::kInfo);
  EXPECT_TRUE(contains(numa.summary, "one NUMA node")) << numa.summary;
  EXPECT_EQ(numa.evidence, "/sys/devices/system/node: node0");
}

TEST(DoctorNuma, UnknownGpuNodeIsInfo) {
  DoctorFixture fx;
  add_numa_nodes(fx, 2);
  add_gpu(fx, "0000:18:00.0", {.numa_node = -1});
  add_nvme(fx, "nvme0", "0000:d8:00.0", {.numa_node = 1});
  const Finding numa = only_finding(fx.run(), "devices.numa");
  EXPECT_EQ(numa.severity, Severity::kInfo);
  EXPECT_EQ(numa.summary, "GPU 0000:18:00.0: NUMA node unknown (numa_node -1)");
}

// ---- devices.pcie_link ----

TEST(DoctorPcieLink, LinksAtTheirMaximumAreOk) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0", {.speed = "32.0 GT/s PCIe", .max_speed = "32.0 GT/s PCIe"});
  add_nvme(fx, "nvme0", "0000:5e:00.0", {.width = 4, .max_width = 4});
  const std::vector<Finding> links = findings_of(fx.run(), "devices.pcie_link");
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].severity, Severity::kOk);
  EXPECT_EQ(links[0].summary, "GPU 0000:18:00.0: x16 at 32.0 GT/s PCIe, the most it can");
  EXPECT_EQ(links[1].severity, Severity::kOk);
  EXPECT_EQ(links[1].subject, "nvme0");
  EXPECT_TRUE(contains(links[1].evidence, "max_link_width: 4")) << links[1].evidence;
}

TEST(DoctorPcieLink, NarrowGpuLinkWarns) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0", {.width = 8, .max_width = 16});
  const Finding link = only_finding(fx.run(), "devices.pcie_link");
  EXPECT_EQ(link.severity, Severity::kWarn);
  EXPECT_EQ(link.summary, "GPU 0000:18:00.0 runs x8 of x16: half the bandwidth");
  EXPECT_TRUE(contains(link.evidence, "/sys/bus/pci/devices/0000:18:00.0/current_link_width: 8"))
      << link.evidence;
  EXPECT_FALSE(link.why.empty());
  EXPECT_TRUE(contains(link.fix, "reseat")) << link.fix;
}

TEST(DoctorPcieLink, SlowIdleGpuIsInfoButSlowNvmeWarns) {
  DoctorFixture fx;
  add_gpu(fx, "0000:18:00.0", {.speed = "2.5 GT/s PCIe", .max_speed = "32.0 GT/s PCIe"});
  add_nvme(fx, "nvme0", "0000:5e:00.0",
           {.width = 4, .max_width = 4, .speed = "8.0 GT/s PCIe", .max_speed = "16.0 GT/s PCIe"});
  const DoctorReport report = fx.run();
  const std::vector<Finding> links = findings_of(report, "devices.pcie_link");
  ASSERT_EQ(links.size(), 2u);
  EXPECT_EQ(links[0].severity, Severity::kInfo);
  EXPECT_TRUE(contains(links[0].summary, "at 2.5 of 32 GT/s")) << links[0].summary;
  EXPECT_TRUE(contains(links[0].summary, "check under load")) << links[0].summary;
  EXPECT_EQ(links[1].severity, Severity::kWarn);
  EXPECT_EQ(links[1].summary,
            "nvme0 (0000:5e:00.0) at 8 of 16 GT/s: half the bandwidth per lane");
}

TEST(DoctorPcieLink, VirtioNicWithoutLinkAttributesIsInfo) {
  DoctorFixture fx;
  // As on a VM: eth0's `device` is the virtio device below its PCI function.
  const std::string pci = add_pci(fx, "0000:00:03.0", {.vendor = "0x1af4", .width = 0});
  add_net_files(fx, pci + "/virtio2/net/eth0", {});
  fx.link(pci + "/virtio2/net/eth0/device", "../../../virtio2");
  fx.link("/sys/class/net/eth0",
          std::string("../../devices/") + kRootPort + "/0000:00:03.0/virtio2/net/eth0");
  const Finding link = only_finding(fx.run(), "devices.pcie_link");
  EXPECT_EQ(link.severity, Severity::kInfo);
  EXPECT_EQ(link.subject, "eth0");
  EXPECT_TRUE(contains(link.summary, "eth0 (0000:00:03.0): no PCIe link attributes"))
      << link.summary;
}

// ---- network.interfaces ----

TEST(DoctorInterfaces, ListsEveryInterfaceButLo) {
  DoctorFixture fx;
  add_virtual_interface(fx, "lo", {.operstate = "unknown", .mtu = 65536});
  add_nic(fx, "eth0", "0000:19:00.0", {}, {.mtu = 9000, .speed = 25000});
  add_virtual_interface(fx, "docker0", {.operstate = "down"});
  const std::vector<Finding> interfaces = findings_of(fx.run(), "network.interfaces");
  ASSERT_EQ(interfaces.size(), 2u);  // one physical up interface: no MTU comparison
  EXPECT_EQ(interfaces[0].subject, "docker0");
  EXPECT_EQ(interfaces[0].severity, Severity::kInfo);
  EXPECT_EQ(interfaces[0].summary, "docker0: down, mtu 1500, virtual");
  EXPECT_EQ(interfaces[1].summary,
            "eth0: up, mtu 9000, 25000 Mb/s, physical (0000:19:00.0)");
  EXPECT_TRUE(contains(interfaces[1].evidence, "/sys/class/net/eth0: operstate up, mtu 9000"))
      << interfaces[1].evidence;
}

TEST(DoctorInterfaces, DifferentMtusOnUpPhysicalInterfacesWarn) {
  DoctorFixture fx;
  add_nic(fx, "eth0", "0000:19:00.0", {}, {.mtu = 9000});
  add_nic(fx, "eth1", "0000:1a:00.0", {}, {.mtu = 1500});
  const std::vector<Finding> warns =
      with_severity(fx.run(), "network.interfaces", Severity::kWarn);
  ASSERT_EQ(warns.size(), 1u);
  EXPECT_EQ(warns[0].summary,
            "eth0 9000, eth1 1500: a job whose ranks use different ones drops large packets");
  EXPECT_FALSE(warns[0].why.empty());
  EXPECT_TRUE(contains(warns[0].fix, "ip link set dev eth1 mtu 9000")) << warns[0].fix;
}

TEST(DoctorInterfaces, SameMtuIsOkAndInfinibandIsComparedApart) {
  DoctorFixture fx;
  add_nic(fx, "eth0", "0000:19:00.0", {}, {.mtu = 9000});
  add_nic(fx, "eth1", "0000:1a:00.0", {}, {.mtu = 9000});
  add_nic(fx, "ib0", "0000:1b:00.0", {}, {.mtu = 4092, .type = 32});
  // Down or virtual interfaces are not compared either.
  add_nic(fx, "eth2", "0000:1c:00.0", {}, {.operstate = "down", .mtu = 1500});
  add_virtual_interface(fx, "docker0", {.mtu = 1500});
  const DoctorReport report = fx.run();
  EXPECT_TRUE(with_severity(report, "network.interfaces", Severity::kWarn).empty());
  const std::vector<Finding> ok = with_severity(report, "network.interfaces", Severity::kOk);
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_EQ(ok[0].summary, "eth0 and eth1 share MTU 9000");
}

// ---- network.rdma ----

TEST(DoctorRdma, ActivePortIsInfo) {
  DoctorFixture fx;
  add_rdma_port(fx, "mlx5_0", 1, "4: ACTIVE");
  const Finding rdma = only_finding(fx.run(), "network.rdma");
  EXPECT_EQ(rdma.severity, Severity::kInfo);
  EXPECT_EQ(rdma.summary, "mlx5_0 port 1: ACTIVE (InfiniBand, 200 Gb/sec (4X HDR))");
  EXPECT_EQ(rdma.evidence,
            "/sys/class/infiniband/mlx5_0/ports/1/state: 4: ACTIVE, link_layer: InfiniBand");
}

TEST(DoctorRdma, PortNotActiveWarns) {
  DoctorFixture fx;
  add_rdma_port(fx, "mlx5_0", 1, "4: ACTIVE");
  add_rdma_port(fx, "mlx5_1", 1, "1: DOWN", "Ethernet");
  const std::vector<Finding> warns = with_severity(fx.run(), "network.rdma", Severity::kWarn);
  ASSERT_EQ(warns.size(), 1u);
  EXPECT_EQ(warns[0].subject, "mlx5_1:1");
  EXPECT_TRUE(contains(warns[0].summary, "mlx5_1 port 1: DOWN (Ethernet")) << warns[0].summary;
  EXPECT_FALSE(warns[0].why.empty());
  EXPECT_TRUE(contains(warns[0].fix, "ibstat mlx5_1")) << warns[0].fix;
}

TEST(DoctorRdma, NoDevicesIsInfo) {
  DoctorFixture fx;
  const Finding rdma = only_finding(fx.run(), "network.rdma");
  EXPECT_EQ(rdma.severity, Severity::kInfo);
  EXPECT_TRUE(contains(rdma.summary, "no RDMA devices")) << rdma.summary;
}

// ---- network.nccl_socket_ifname ----

// eth0, eth1 (physical, up), docker0 (bridge, up), lo.
void add_host_interfaces(DoctorFixture& fx) {
  add_virtual_interface(fx, "lo", {.operstate = "unknown", .mtu = 65536});
  add_nic(fx, "eth0", "0000:19:00.0", {});
  add_nic(fx, "eth1", "0000:1a:00.0", {});
  add_virtual_interface(fx, "docker0");
}

Finding socket_finding(const DoctorReport& report, const std::string& variable) {
  for (const Finding& f : findings_of(report, "network.nccl_socket_ifname")) {
    if (f.subject == variable) return f;
  }
  ADD_FAILURE() << "no network.nccl_socket_ifname finding for " << variable;
  return {};
}

TEST(DoctorSocketIfname, UnsetIsInfo) {
  DoctorFixture fx;
  add_host_interfaces(fx);
  const DoctorReport report = fx.run();
  EXPECT_EQ(findings_of(report, "network.nccl_socket_ifname").size(), 2u);
  const Finding nccl = socket_finding(report, "NCCL_SOCKET_IFNAME");
  EXPECT_EQ(nccl.severity, Severity::kInfo);
  EXPECT_TRUE(contains(nccl.summary, "unset")) << nccl.summary;
}

TEST(DoctorSocketIfname, ListSelectingAPhysicalInterfaceIsOk) {
  for (const char* value : {"eth", "eth1", "^docker,lo", "=eth0,ib0"}) {
    DoctorFixture fx;
    add_host_interfaces(fx);
    fx.facts()["env"]["NCCL_SOCKET_IFNAME"] = value;
    const Finding nccl = socket_finding(fx.run(), "NCCL_SOCKET_IFNAME");
    EXPECT_EQ(nccl.severity, Severity::kOk) << value << ": " << nccl.summary;
    EXPECT_TRUE(contains(nccl.evidence, std::string("NCCL_SOCKET_IFNAME=") + value +
                                            " (environment)"))
        << nccl.evidence;
  }
}

TEST(DoctorSocketIfname, ListSelectingNoInterfaceFails) {
  DoctorFixture fx;
  add_host_interfaces(fx);
  fx.facts()["env"]["NCCL_SOCKET_IFNAME"] = "ib0";
  const Finding nccl = socket_finding(fx.run(), "NCCL_SOCKET_IFNAME");
  EXPECT_EQ(nccl.severity, Severity::kFail);
  EXPECT_EQ(nccl.summary,
            "NCCL_SOCKET_IFNAME=ib0 but no interface ib0*: NCCL fails at init or falls back");
  EXPECT_FALSE(nccl.why.empty());
  EXPECT_EQ(nccl.fix, "export NCCL_SOCKET_IFNAME=eth0,eth1");
}

TEST(DoctorSocketIfname, ExactNamesAndExclusionsCanSelectNothing) {
  for (const char* value : {"=eth", "^eth,docker,lo"}) {
    DoctorFixture fx;
    add_host_interfaces(fx);
    fx.facts()["env"]["NCCL_SOCKET_IFNAME"] = value;
    const Finding nccl = socket_finding(fx.run(), "NCCL_SOCKET_IFNAME");
    EXPECT_EQ(nccl.severity, Severity::kFail) << value << ": " << nccl.summary;
  }
}

TEST(DoctorSocketIfname, OnlyABridgeOrLoopbackWarns) {
  for (const char* value : {"docker0", "^eth", "lo"}) {
    DoctorFixture fx;
    add_host_interfaces(fx);
    fx.facts()["env"]["NCCL_SOCKET_IFNAME"] = value;
    const Finding nccl = socket_finding(fx.run(), "NCCL_SOCKET_IFNAME");
    EXPECT_EQ(nccl.severity, Severity::kWarn) << value << ": " << nccl.summary;
    EXPECT_TRUE(contains(nccl.summary, "container bridge")) << nccl.summary;
  }
}

TEST(DoctorSocketIfname, OnlyInterfacesThatAreDownWarns) {
  DoctorFixture fx;
  add_host_interfaces(fx);
  add_nic(fx, "eth2", "0000:1c:00.0", {}, {.operstate = "down"});
  add_virtual_interface(fx, "ifb0", {.operstate = "down"});
  fx.facts()["env"]["NCCL_SOCKET_IFNAME"] = "=eth2,ifb0,lo";
  const Finding nccl = socket_finding(fx.run(), "NCCL_SOCKET_IFNAME");
  EXPECT_EQ(nccl.severity, Severity::kWarn);
  EXPECT_EQ(nccl.summary,
            "NCCL_SOCKET_IFNAME==eth2,ifb0,lo selects only eth2, ifb0, lo: none is up and "
            "reaches other nodes");
  EXPECT_TRUE(contains(nccl.evidence, "eth2 down")) << nccl.evidence;
  EXPECT_EQ(nccl.fix, "export NCCL_SOCKET_IFNAME=eth0,eth1");
}

TEST(DoctorSocketIfname, GlooNeedsEveryNamedInterface) {
  DoctorFixture fx;
  add_host_interfaces(fx);
  fx.facts()["env"]["GLOO_SOCKET_IFNAME"] = "eth0,eth9";
  const DoctorReport report = fx.run();
  const Finding gloo = socket_finding(report, "GLOO_SOCKET_IFNAME");
  EXPECT_EQ(gloo.severity, Severity::kFail);
  EXPECT_EQ(gloo.summary, "GLOO_SOCKET_IFNAME=eth0,eth9 but no interface eth9: Gloo fails at init");

  DoctorFixture good;
  add_host_interfaces(good);
  good.facts()["env"]["GLOO_SOCKET_IFNAME"] = "eth0,eth1";
  EXPECT_EQ(socket_finding(good.run(), "GLOO_SOCKET_IFNAME").severity, Severity::kOk);
}

// ---- network.nccl_ib_hca ----

TEST(DoctorIbHca, SelectingAnExistingPortIsOk) {
  for (const char* value : {"mlx5_0:1", "mlx5", "=mlx5_1", "^mlx5_0"}) {
    DoctorFixture fx;
    add_rdma_port(fx, "mlx5_0", 1, "4: ACTIVE");
    add_rdma_port(fx, "mlx5_1", 1, "4: ACTIVE");
    fx.facts()["env"]["NCCL_IB_HCA"] = value;
    const Finding hca = only_finding(fx.run(), "network.nccl_ib_hca");
    EXPECT_EQ(hca.severity, Severity::kOk) << value << ": " << hca.summary;
  }
}

TEST(DoctorIbHca, SelectingNoPortFails) {
  for (const char* value : {"mlx5_9", "mlx5_0:2", "=mlx5", "^mlx5"}) {
    DoctorFixture fx;
    add_rdma_port(fx, "mlx5_0", 1, "4: ACTIVE");
    fx.facts()["env"]["NCCL_IB_HCA"] = value;
    const Finding hca = only_finding(fx.run(), "network.nccl_ib_hca");
    EXPECT_EQ(hca.severity, Severity::kFail) << value << ": " << hca.summary;
    EXPECT_TRUE(contains(hca.summary, "selects no RDMA port")) << hca.summary;
    EXPECT_TRUE(contains(hca.evidence, "/sys/class/infiniband: mlx5_0:1")) << hca.evidence;
    EXPECT_EQ(hca.fix, "export NCCL_IB_HCA=mlx5_0:1, or unset NCCL_IB_HCA");
  }
}

TEST(DoctorIbHca, UnsetIsInfo) {
  DoctorFixture fx;
  const Finding hca = only_finding(fx.run(), "network.nccl_ib_hca");
  EXPECT_EQ(hca.severity, Severity::kInfo);
  EXPECT_TRUE(hca.fix.empty());
}

// ---- network.debug_variables ----

TEST(DoctorDebugVariables, NoneSetIsOk) {
  DoctorFixture fx;
  // Values that do not slow anything.
  fx.facts()["env"]["NCCL_DEBUG"] = "WARN";
  fx.facts()["env"]["CUDA_LAUNCH_BLOCKING"] = "0";
  fx.facts()["env"]["NCCL_P2P_LEVEL"] = "NVL";
  const Finding debug = only_finding(fx.run(), "network.debug_variables");
  EXPECT_EQ(debug.severity, Severity::kOk);
}

TEST(DoctorDebugVariables, EachSlowingVariableWarns) {
  DoctorFixture fx;
  fx.facts()["env"]["NCCL_DEBUG"] = "INFO";
  fx.facts()["env"]["CUDA_LAUNCH_BLOCKING"] = "1";
  fx.facts()["env"]["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL";
  fx.facts()["env"]["NCCL_P2P_DISABLE"] = "1";
  const std::vector<Finding> warns =
      with_severity(fx.run(), "network.debug_variables", Severity::kWarn);
  ASSERT_EQ(warns.size(), 4u);
  EXPECT_EQ(warns[0].subject, "NCCL_DEBUG");
  EXPECT_EQ(warns[0].evidence, "NCCL_DEBUG=INFO (environment)");
  EXPECT_EQ(warns[0].fix, "unset NCCL_DEBUG");
  EXPECT_FALSE(warns[0].why.empty());
  EXPECT_EQ(warns[2].subject, "CUDA_LAUNCH_BLOCKING");
  EXPECT_TRUE(contains(warns[2].why, "serialises every kernel")) << warns[2].why;
}

TEST(DoctorDebugVariables, DebugFileKeepsNcclInfoOutOfTheJobsOutput) {
  DoctorFixture fx;
  fx.facts()["env"]["NCCL_DEBUG"] = "INFO";
  fx.facts()["env"]["NCCL_DEBUG_FILE"] = "/tmp/nccl.%h.%p";
  const Finding debug = only_finding(fx.run(), "network.debug_variables");
  EXPECT_EQ(debug.severity, Severity::kInfo);
  EXPECT_TRUE(contains(debug.summary, "NCCL_DEBUG_FILE=/tmp/nccl.%h.%p")) << debug.summary;
}

TEST(DoctorDebugVariables, IbDisableWarnsOnlyWithRdmaDevices) {
  DoctorFixture without;
  without.facts()["env"]["NCCL_IB_DISABLE"] = "1";
  EXPECT_EQ(only_finding(without.run(), "network.debug_variables").severity, Severity::kInfo);

  DoctorFixture with;
  add_rdma_port(with, "mlx5_0", 1, "4: ACTIVE");
  with.facts()["env"]["NCCL_IB_DISABLE"] = "1";
  const Finding debug = only_finding(with.run(), "network.debug_variables");
  EXPECT_EQ(debug.severity, Severity::kWarn);
  EXPECT_EQ(debug.fix, "unset NCCL_IB_DISABLE");
}

}  // namespace
}  // namespace zerowait
