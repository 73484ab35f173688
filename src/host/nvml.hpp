// NVML (libnvidia-ml.so.1), loaded at run time with dlopen: CUDA is never a build dependency.
// NVML's C signatures (nvml.h) are declared in nvml.cpp, as cuda_runtime.cpp does for libcudart.
// One session: loaded and initialised by the constructor, shut down and unloaded by the
// destructor. The doctor opens one for its GPU inventory, the system sampler keeps one open and
// asks for utilisation ten times a second.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zerowait::internal {

// A GPU's PCIe link as NVML reports it: the generation and width it runs at now, the most the
// GPU and its slot together allow, and the most the GPU itself can do. An idle GPU lowers its
// generation to save power, so `generation` below `max_generation` is normal at rest.
struct NvmlPcieLink {
  unsigned generation = 0, max_generation = 0, gpu_max_generation = 0;
  unsigned width = 0, max_width = 0;
  std::string address;  // "0000:18:00.0", sysfs's spelling of the GPU's PCI address
};

class Nvml {
 public:
  Nvml();
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  bool available() const { return initialised_; }
  // Why NVML is not available ("libnvidia-ml.so.1 not loaded: ..."); empty when it is.
  const std::string& error() const { return error_; }

  // Without NVML: 0, nullopt, "".
  unsigned device_count() const;
  std::optional<std::string> device_name(unsigned index) const;
  std::string driver_version() const;
  // Mean of nvmlDeviceGetUtilizationRates().gpu over every device that answers, 0-1.
  std::optional<double> utilization() const;
  // nvmlDeviceGetMemoryInfo's used bytes, summed over every device that answers.
  std::optional<uint64_t> memory_used() const;
  // Device `index`'s PCI address and link; nullopt when NVML cannot say.
  std::optional<NvmlPcieLink> pcie_link(unsigned index) const;

 private:
  void* library_ = nullptr;
  bool initialised_ = false;
  std::string error_;
  int (*shutdown_)() = nullptr;
  int (*count_)(unsigned*) = nullptr;
  int (*handle_)(unsigned, void**) = nullptr;
  int (*name_)(void*, char*, unsigned) = nullptr;
  int (*driver_)(char*, unsigned) = nullptr;
  int (*rates_)(void*, unsigned*) = nullptr;  // nvmlUtilization_t: {unsigned gpu, memory}
  int (*memory_)(void*, unsigned long long*) = nullptr;  // nvmlMemory_t: {total, free, used}
  int (*pci_info_)(void*, void*) = nullptr;               // nvmlPciInfo_t (nvml.cpp)
  int (*link_generation_)(void*, unsigned*) = nullptr;
  int (*max_link_generation_)(void*, unsigned*) = nullptr;
  int (*gpu_max_link_generation_)(void*, unsigned*) = nullptr;
  int (*link_width_)(void*, unsigned*) = nullptr;
  int (*max_link_width_)(void*, unsigned*) = nullptr;
};

}  // namespace zerowait::internal
