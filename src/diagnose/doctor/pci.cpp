#include "diagnose/doctor/pci.hpp"

#include <cctype>
#include <cstdlib>
#include <deque>

#include "host/numa.hpp"

namespace zerowait::doctor {
namespace {

constexpr const char* kNvmeClass = "/sys/class/nvme";
constexpr const char* kNvidiaVendor = "0x10de";
// Symbolic links followed while resolving one path before it counts as a loop (Linux's limit).
constexpr int kMaxLinks = 40;

std::deque<std::string> split_path(const std::string& path) {
  std::deque<std::string> parts;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t slash = path.find('/', start);
    const size_t end = slash == std::string::npos ? path.size() : slash;
    if (end > start) parts.push_back(path.substr(start, end - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  return parts;
}

std::string join_path(const std::vector<std::string>& parts) {
  std::string path;
  for (const std::string& part : parts) path += "/" + part;
  return path.empty() ? "/" : path;
}

bool hex_digits(const std::string& text, size_t from, size_t count) {
  if (from + count > text.size()) return false;
  for (size_t i = from; i < from + count; ++i) {
    if (!std::isxdigit(static_cast<unsigned char>(text[i]))) return false;
  }
  return true;
}

// "0000:18:00.0": domain (4 hex digits, 5 under Intel VMD), bus, device, function.
bool is_pci_address(const std::string& name) {
  const size_t colon = name.find(':');
  if (colon < 4 || colon > 5 || !hex_digits(name, 0, colon)) return false;
  const std::string rest = name.substr(colon);  // ":18:00.0"
  return rest.size() == 8 && rest[0] == ':' && hex_digits(rest, 1, 2) && rest[3] == ':' &&
         hex_digits(rest, 4, 2) && rest[6] == '.' && rest[7] >= '0' && rest[7] <= '7';
}

// "16.0 GT/s PCIe" -> 16; "Unknown" or "" -> 0.
double gts_of(const std::string& speed) {
  char* end = nullptr;
  const double value = std::strtod(speed.c_str(), &end);
  return end == speed.c_str() ? 0 : value;
}

std::vector<PciAttached> attached_through_device_links(const System& system,
                                                       const std::string& class_dir,
                                                       DeviceKind kind) {
  std::vector<PciAttached> found;
  for (const std::string& name : system.list(class_dir)) {
    const std::optional<PciFunction> pci =
        pci_function_of(system, class_dir + "/" + name + "/device");
    if (pci) found.push_back({kind, name, *pci});
  }
  return found;
}

}  // namespace

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::kGpu:
      return "GPU";
    case DeviceKind::kNvme:
      return "NVMe";
    case DeviceKind::kNic:
      return "NIC";
  }
  return "?";
}

std::optional<std::string> resolve_path(const System& system, const std::string& path) {
  // Written by hand rather than realpath(): links must be followed inside the root, and an
  // absolute target ("/sys/devices/...") means the root's /sys, not the host's.
  std::deque<std::string> pending = split_path(path);
  std::vector<std::string> resolved;
  int links = 0;
  while (!pending.empty()) {
    std::string part = std::move(pending.front());
    pending.pop_front();
    if (part == ".") continue;
    if (part == "..") {
      if (!resolved.empty()) resolved.pop_back();
      continue;
    }
    resolved.push_back(std::move(part));
    const std::optional<std::string> target = system.link_target(join_path(resolved));
    if (!target) continue;
    if (++links > kMaxLinks) return std::nullopt;
    resolved.pop_back();
    if (!target->empty() && target->front() == '/') resolved.clear();
    std::deque<std::string> target_parts = split_path(*target);
    pending.insert(pending.begin(), target_parts.begin(), target_parts.end());
  }
  return join_path(resolved);
}

std::optional<PciFunction> pci_function_of(const System& system, const std::string& device_link) {
  const std::optional<std::string> resolved = resolve_path(system, device_link);
  if (!resolved || !system.exists(*resolved)) return std::nullopt;
  std::string dir = *resolved;
  while (dir.size() > 1) {
    const size_t slash = dir.rfind('/');
    const std::string name = dir.substr(slash + 1);
    if (is_pci_address(name)) return PciFunction{name, dir};
    dir.resize(slash);
  }
  return std::nullopt;
}

std::vector<PciAttached> find_gpus(const System& system) {
  std::vector<PciAttached> gpus;
  for (const std::string& address : system.list(kPciDevices)) {
    const std::optional<std::string> dir =
        resolve_path(system, std::string(kPciDevices) + "/" + address);
    if (!dir) continue;
    const std::optional<std::string> vendor = system.read_line(*dir + "/vendor");
    const std::optional<std::string> device_class = system.read_line(*dir + "/class");
    if (!vendor || *vendor != kNvidiaVendor || !device_class) continue;
    if (device_class->rfind("0x0300", 0) != 0 && device_class->rfind("0x0302", 0) != 0) continue;
    gpus.push_back({DeviceKind::kGpu, address, PciFunction{address, *dir}});
  }
  return gpus;
}

std::vector<PciAttached> find_nvme_controllers(const System& system) {
  return attached_through_device_links(system, kNvmeClass, DeviceKind::kNvme);
}

std::vector<PciAttached> find_pci_nics(const System& system) {
  return attached_through_device_links(system, kNetClass, DeviceKind::kNic);
}

std::optional<int64_t> numa_node_of(const System& system, const PciFunction& pci) {
  const Result<std::optional<int>> node = internal::pci_numa_node(system, pci.dir);
  if (!node || !*node) return std::nullopt;
  return int64_t(**node);
}

std::optional<PcieLink> pcie_link_of(const System& system, const PciFunction& pci) {
  const std::optional<int64_t> width = system.read_int(pci.dir + "/current_link_width");
  const std::optional<int64_t> max_width = system.read_int(pci.dir + "/max_link_width");
  if (!width || !max_width) return std::nullopt;
  PcieLink link;
  link.width = *width;
  link.max_width = *max_width;
  link.speed = system.read_line(pci.dir + "/current_link_speed").value_or("");
  link.max_speed = system.read_line(pci.dir + "/max_link_speed").value_or("");
  link.speed_gts = gts_of(link.speed);
  link.max_speed_gts = gts_of(link.max_speed);
  return link;
}

}  // namespace zerowait::doctor
