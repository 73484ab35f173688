#include "observe/nvml_utilization.hpp"

#include <dlfcn.h>

namespace zerowait::observe {

NvmlUtilization::NvmlUtilization() {
  library_ = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library_ == nullptr) return;
  const auto init = reinterpret_cast<int (*)()>(dlsym(library_, "nvmlInit_v2"));
  shutdown_ = reinterpret_cast<int (*)()>(dlsym(library_, "nvmlShutdown"));
  count_ = reinterpret_cast<int (*)(unsigned*)>(dlsym(library_, "nvmlDeviceGetCount_v2"));
  handle_ = reinterpret_cast<int (*)(unsigned, void**)>(
      dlsym(library_, "nvmlDeviceGetHandleByIndex_v2"));
  rates_ = reinterpret_cast<int (*)(void*, unsigned*)>(
      dlsym(library_, "nvmlDeviceGetUtilizationRates"));
  init_ok_ = init && shutdown_ && count_ && handle_ && rates_ && init() == 0;
}

NvmlUtilization::~NvmlUtilization() {
  if (init_ok_) shutdown_();
  if (library_ != nullptr) dlclose(library_);
}

std::optional<double> NvmlUtilization::utilization() const {
  if (!init_ok_) return std::nullopt;
  unsigned count = 0;
  if (count_(&count) != 0) return std::nullopt;
  double sum = 0;
  unsigned answered = 0;
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

}  // namespace zerowait::observe
