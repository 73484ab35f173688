// GPU utilisation through NVML, opened with dlopen: CUDA is never a build dependency. Kept apart
// from the doctor's NVML inventory (device_checks.cpp), which opens and closes the library once
// per run; the sampler asks ten times a second and keeps it open.
#pragma once

#include <optional>

namespace zerowait::observe {

class NvmlUtilization {
 public:
  // Loads libnvidia-ml.so.1 and initialises NVML; without it every utilization() is nullopt.
  NvmlUtilization();
  ~NvmlUtilization();  // nvmlShutdown, dlclose
  NvmlUtilization(const NvmlUtilization&) = delete;
  NvmlUtilization& operator=(const NvmlUtilization&) = delete;

  bool available() const { return init_ok_; }
  // Mean of nvmlDeviceGetUtilizationRates().gpu over every device, 0-1; nullopt without NVML
  // or when no device answers.
  std::optional<double> utilization() const;

 private:
  void* library_ = nullptr;
  bool init_ok_ = false;
  int (*shutdown_)() = nullptr;
  int (*count_)(unsigned*) = nullptr;
  int (*handle_)(unsigned, void**) = nullptr;
  int (*rates_)(void*, unsigned*) = nullptr;  // nvmlUtilization_t: {unsigned gpu, memory}
};

}  // namespace zerowait::observe
