// NVML (libnvidia-ml.so.1), loaded at run time with dlopen: CUDA is never a build dependency.
// NVML's C signatures (nvml.h) are declared in nvml.cpp, as cuda_host.cpp does for libcudart.
// One session: loaded and initialised by the constructor, shut down and unloaded by the
// destructor. The doctor opens one for its GPU inventory, the system sampler keeps one open and
// asks for utilisation ten times a second.
#pragma once

#include <optional>
#include <string>

namespace zerowait::internal {

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
};

}  // namespace zerowait::internal
