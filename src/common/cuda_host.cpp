#include "common/cuda_host.hpp"

#include <dlfcn.h>

#include <mutex>

#include "common/log.hpp"

namespace zerowait::internal {

namespace {

// The few CUDA runtime entry points used, with their C signatures (cuda_runtime_api.h);
// cudaError_t is an int-sized enum where 0 is success.
using GetDeviceCountFn = int (*)(int*);
using HostRegisterFn = int (*)(void*, size_t, unsigned);
using HostUnregisterFn = int (*)(void*);
constexpr unsigned kCudaHostRegisterPortable = 1;

struct CudaRuntime {
  bool ok = false;
  std::string reason;
  HostRegisterFn host_register = nullptr;
  HostUnregisterFn host_unregister = nullptr;
};

const CudaRuntime& runtime() {
  static const CudaRuntime loaded = [] {
    CudaRuntime rt;
    // A process that already loaded libcudart (e.g. a CUDA build of torch) gets that copy.
    void* lib = nullptr;
    for (const char* name :
         {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"}) {
      lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (lib != nullptr) break;
    }
    if (lib == nullptr) {
      rt.reason = "the CUDA runtime (libcudart.so) was not found";
      return rt;
    }
    auto count_fn = reinterpret_cast<GetDeviceCountFn>(dlsym(lib, "cudaGetDeviceCount"));
    rt.host_register = reinterpret_cast<HostRegisterFn>(dlsym(lib, "cudaHostRegister"));
    rt.host_unregister = reinterpret_cast<HostUnregisterFn>(dlsym(lib, "cudaHostUnregister"));
    if (count_fn == nullptr || rt.host_register == nullptr || rt.host_unregister == nullptr) {
      rt.reason = "libcudart.so lacks cudaGetDeviceCount/cudaHostRegister";
      return rt;
    }
    int devices = 0;
    if (count_fn(&devices) != 0 || devices == 0) {
      rt.reason = "libcudart.so loaded but reports no CUDA device";
      return rt;
    }
    rt.ok = true;
    return rt;
  }();
  return loaded;
}

}  // namespace

bool host_memory_pinning_available() {
  const CudaRuntime& rt = runtime();
  if (!rt.ok) note_fallback("cuda", rt.reason + ": batch arenas and checkpoint staging use plain host memory");
  return rt.ok;
}

bool pin_host_memory(void* data, size_t bytes) {
  if (!host_memory_pinning_available()) return false;
  const CudaRuntime& rt = runtime();
  if (rt.host_register(data, bytes, kCudaHostRegisterPortable) != 0) {
    note_fallback("cuda_pin", "cudaHostRegister failed: batch arenas and checkpoint staging use plain host memory");
    return false;
  }
  return true;
}

void unpin_host_memory(void* data) {
  const CudaRuntime& rt = runtime();
  if (rt.ok) rt.host_unregister(data);
}

}  // namespace zerowait::internal
