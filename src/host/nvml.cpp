#include "host/nvml.hpp"

#include <dlfcn.h>

#include <cstdio>

#include "host/dynamic_library.hpp"

namespace zerowait::internal {
namespace {

// nvmlPciInfo_t (nvml.h, nvmlDeviceGetPciInfo_v3).
struct NvmlPciInfo {
  char bus_id_legacy[16];
  unsigned domain, bus, device, pci_device_id, pci_subsystem_id;
  char bus_id[32];
};


}  // namespace

Nvml::Nvml() {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) {
    const char* why = dlerror();
    error_ = std::string("libnvidia-ml.so.1 not loaded: ") + (why != nullptr ? why : "?");
    return;
  }
  int (*init)() = nullptr;
  const bool complete = resolve(library_, "nvmlInit_v2", init) &&
                        resolve(library_, "nvmlShutdown", shutdown_) &&
                        resolve(library_, "nvmlDeviceGetCount_v2", count_) &&
                        resolve(library_, "nvmlDeviceGetHandleByIndex_v2", handle_) &&
                        resolve(library_, "nvmlDeviceGetName", name_) &&
                        resolve(library_, "nvmlSystemGetDriverVersion", driver_) &&
                        resolve(library_, "nvmlDeviceGetUtilizationRates", rates_);
  // Optional: an answer of "unknown" where a driver lacks them.
  resolve(library_, "nvmlDeviceGetMemoryInfo", memory_);
  resolve(library_, "nvmlDeviceGetPciInfo_v3", pci_info_);
  resolve(library_, "nvmlDeviceGetCurrPcieLinkGeneration", link_generation_);
  resolve(library_, "nvmlDeviceGetMaxPcieLinkGeneration", max_link_generation_);
  resolve(library_, "nvmlDeviceGetGpuMaxPcieLinkGeneration", gpu_max_link_generation_);
  resolve(library_, "nvmlDeviceGetCurrPcieLinkWidth", link_width_);
  resolve(library_, "nvmlDeviceGetMaxPcieLinkWidth", max_link_width_);
  if (!complete) {
    error_ = "libnvidia-ml.so.1 lacks the NVML functions used";
  } else if (const int code = init(); code != 0) {
    error_ = "nvmlInit_v2 failed (NVML error " + std::to_string(code) + ")";
  } else {
    initialised_ = true;
  }
}

Nvml::~Nvml() {
  if (initialised_) shutdown_();
  if (library_ != nullptr) dlclose(library_);
}

unsigned Nvml::device_count() const {
  unsigned count = 0;
  if (!initialised_ || count_(&count) != 0) return 0;
  return count;
}

std::optional<std::string> Nvml::device_name(unsigned index) const {
  void* device = nullptr;
  char name[96] = "";
  if (!initialised_ || handle_(index, &device) != 0 || name_(device, name, sizeof(name)) != 0) {
    return std::nullopt;
  }
  return std::string(name);
}

std::string Nvml::driver_version() const {
  char driver[96] = "";
  if (!initialised_ || driver_(driver, sizeof(driver)) != 0) return "";
  return driver;
}

std::optional<double> Nvml::utilization() const {
  double sum = 0;
  unsigned answered = 0;
  const unsigned count = device_count();
  for (unsigned i = 0; i < count; ++i) {
    void* device = nullptr;
    unsigned rates[2] = {0, 0};  // gpu, memory (percent)
    if (handle_(i, &device) != 0 || rates_(device, rates) != 0) continue;
    sum += rates[0] / 100.0;
    ++answered;
  }
  if (answered == 0) return std::nullopt;
  return sum / answered;
}

std::optional<uint64_t> Nvml::memory_used() const {
  if (memory_ == nullptr) return std::nullopt;
  uint64_t sum = 0;
  unsigned answered = 0;
  const unsigned count = device_count();
  for (unsigned i = 0; i < count; ++i) {
    void* device = nullptr;
    unsigned long long info[3] = {0, 0, 0};  // total, free, used
    if (handle_(i, &device) != 0 || memory_(device, info) != 0) continue;
    sum += info[2];
    ++answered;
  }
  if (answered == 0) return std::nullopt;
  return sum;
}

std::optional<NvmlPcieLink> Nvml::pcie_link(unsigned index) const {
  void* device = nullptr;
  if (!initialised_ || pci_info_ == nullptr || link_generation_ == nullptr ||
      max_link_generation_ == nullptr || link_width_ == nullptr || max_link_width_ == nullptr ||
      handle_(index, &device) != 0) {
    return std::nullopt;
  }
  NvmlPciInfo pci{};
  NvmlPcieLink link;
  if (pci_info_(device, &pci) != 0 || link_generation_(device, &link.generation) != 0 ||
      max_link_generation_(device, &link.max_generation) != 0 ||
      link_width_(device, &link.width) != 0 || max_link_width_(device, &link.max_width) != 0) {
    return std::nullopt;
  }
  if (gpu_max_link_generation_ == nullptr ||
      gpu_max_link_generation_(device, &link.gpu_max_generation) != 0) {
    link.gpu_max_generation = link.max_generation;
  }
  char address[32];
  std::snprintf(address, sizeof(address), "%04x:%02x:%02x.0", pci.domain & 0xffff, pci.bus,
                pci.device);
  link.address = address;
  return link;
}

}  // namespace zerowait::internal
