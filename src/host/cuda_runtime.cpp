#include "host/cuda_runtime.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <thread>
#include <utility>

#include "common/log.hpp"
#include "host/dynamic_library.hpp"

namespace zerowait::internal {

namespace {

// cudaPointerAttributes of CUDA 11 and later: the type comes first; CUDA 13 added reserved words
// at the end, which an older runtime does not write.
struct PointerAttributes {
  int type = 0;  // cudaMemoryType: 0 unregistered, 1 host, 2 device, 3 managed
  int device = 0;
  void* device_pointer = nullptr;
  void* host_pointer = nullptr;
  long reserved[8] = {};
};


CudaRuntime load() {
  CudaRuntime rt;
  // A copy the process already holds (torch's) first, so that both share one runtime.
  std::string opened, errors;
  void* lib = open_first_library(
      {"libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"}, &opened,
      &errors);
  if (lib == nullptr) {
    rt.reason = "the CUDA runtime (libcudart.so) was not found";
    return rt;
  }
  const bool complete =
      resolve(lib, "cudaGetDeviceCount", rt.get_device_count) &&
      resolve(lib, "cudaSetDevice", rt.set_device) &&
      resolve(lib, "cudaGetDevice", rt.get_device) &&
      resolve(lib, "cudaGetErrorString", rt.get_error_string) &&
      resolve(lib, "cudaHostRegister", rt.host_register) &&
      resolve(lib, "cudaHostUnregister", rt.host_unregister) &&
      resolve(lib, "cudaPointerGetAttributes", rt.pointer_get_attributes) &&
      resolve(lib, "cudaMalloc", rt.malloc) && resolve(lib, "cudaFree", rt.free) &&
      resolve(lib, "cudaMemcpy", rt.memcpy) && resolve(lib, "cudaMemcpyAsync", rt.memcpy_async) &&
      resolve(lib, "cudaMemset", rt.memset) &&
      resolve(lib, "cudaStreamCreateWithFlags", rt.stream_create_with_flags) &&
      resolve(lib, "cudaStreamDestroy", rt.stream_destroy) &&
      resolve(lib, "cudaStreamSynchronize", rt.stream_synchronize) &&
      resolve(lib, "cudaEventCreateWithFlags", rt.event_create_with_flags) &&
      resolve(lib, "cudaEventDestroy", rt.event_destroy) &&
      resolve(lib, "cudaEventRecord", rt.event_record) &&
      resolve(lib, "cudaEventSynchronize", rt.event_synchronize) &&
      resolve(lib, "cudaEventQuery", rt.event_query) &&
      resolve(lib, "cudaEventElapsedTime", rt.event_elapsed_time);
  if (!complete) {
    rt.reason = opened + " lacks an entry point zerowait uses: " + dl_error();
    return rt;
  }
  if (const int error = rt.get_device_count(&rt.devices); error != 0 || rt.devices == 0) {
    rt.reason = "libcudart.so loaded but reports no CUDA device (" +
                std::string(error != 0 ? rt.get_error_string(error) : "0 devices") + ")";
    rt.devices = 0;
    return rt;
  }
  rt.ok = true;
  return rt;
}

}  // namespace

const CudaRuntime& cuda_runtime() {
  static const CudaRuntime loaded = load();
  return loaded;
}

Status cuda_status(int error, const std::string& what) {
  if (error == 0) return Status::ok();
  const CudaRuntime& rt = cuda_runtime();
  const char* text = rt.get_error_string != nullptr ? rt.get_error_string(error) : nullptr;
  return Status(ErrorCode::kIo, what + ": " + (text != nullptr ? text : "CUDA error") + " (" +
                                    std::to_string(error) + ")");
}

bool host_memory_pinning_available() {
  const CudaRuntime& rt = cuda_runtime();
  if (!rt.ok) {
    note_fallback("cuda",
                  rt.reason + ": batch arenas and checkpoint staging use plain host memory");
  }
  return rt.ok;
}

bool pin_host_memory(void* data, size_t bytes) {
  if (!host_memory_pinning_available()) return false;
  constexpr unsigned kCudaHostRegisterPortable = 1;  // pinned for every device's context
  if (const int error = cuda_runtime().host_register(data, bytes, kCudaHostRegisterPortable);
      error != 0) {
    note_fallback("cuda_pin", cuda_status(error, "cudaHostRegister").message() +
                                  ": batch arenas and checkpoint staging use plain host memory");
    return false;
  }
  return true;
}

void unpin_host_memory(void* data) {
  const CudaRuntime& rt = cuda_runtime();
  if (rt.ok) rt.host_unregister(data);
}

namespace {

// cudaPointerGetAttributes' cudaMemoryType; 0 (unregistered) when the runtime does not know the
// pointer. Requires cuda_runtime().ok.
PointerAttributes pointer_attributes(const void* pointer) {
  PointerAttributes attributes;
  if (cuda_runtime().pointer_get_attributes(&attributes, pointer) != 0) attributes.type = 0;
  return attributes;
}

const char* memory_type_name(int type) {
  switch (type) {
    case 1:
      return "host";
    case 2:
      return "device";
    case 3:
      return "managed";
    default:
      return "unregistered";
  }
}

}  // namespace

std::string cuda_memory_type(const void* pointer) {
  if (!cuda_runtime().ok) return "";
  return memory_type_name(pointer_attributes(pointer).type);
}

Result<int> cuda_pointer_device(const void* pointer) {
  const CudaRuntime& rt = cuda_runtime();
  if (!rt.ok) return Status(ErrorCode::kUnsupported, "no CUDA device: " + rt.reason);
  const PointerAttributes attributes = pointer_attributes(pointer);
  if (attributes.type != 2 && attributes.type != 3) {
    return invalid_argument("not GPU memory: cudaPointerGetAttributes says the pointer is " +
                            std::string(memory_type_name(attributes.type)) + " memory");
  }
  return attributes.device;
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes) {
  const CudaRuntime& rt = cuda_runtime();
  if (!rt.ok) return Status(ErrorCode::kUnsupported, "no CUDA device: " + rt.reason);
  DeviceBuffer buffer;
  ZW_RETURN_IF_ERROR(
      cuda_status(rt.malloc(&buffer.data_, bytes), "cudaMalloc(" + std::to_string(bytes) + ")"));
  buffer.size_ = bytes;
  return buffer;
}

DeviceBuffer::~DeviceBuffer() {
  if (data_ != nullptr) cuda_runtime().free(data_);
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (data_ != nullptr) cuda_runtime().free(data_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Result<CudaEvent> CudaEvent::record(int device, CudaStreamHandle stream) {
  const CudaRuntime& rt = cuda_runtime();
  if (!rt.ok) return Status(ErrorCode::kUnsupported, "no CUDA device: " + rt.reason);
  // The event belongs to the context of the thread's current device, and must be that of the
  // stream it is recorded on. The caller's current device is put back: it may be a training
  // thread whose device torch reads from the runtime.
  int previous = 0;
  ZW_RETURN_IF_ERROR(cuda_status(rt.get_device(&previous), "cudaGetDevice"));
  if (previous != device) {
    ZW_RETURN_IF_ERROR(
        cuda_status(rt.set_device(device), "cudaSetDevice(" + std::to_string(device) + ")"));
  }
  struct RestoreDevice {
    const CudaRuntime& rt;
    int previous, device;
    ~RestoreDevice() {
      if (previous != device) rt.set_device(previous);
    }
  } restore{rt, previous, device};
  CudaEvent event;
  ZW_RETURN_IF_ERROR(cuda_status(rt.event_create_with_flags(&event.event_, kCudaEventDisableTiming),
                                 "cudaEventCreateWithFlags on device " + std::to_string(device)));
  ZW_RETURN_IF_ERROR(
      cuda_status(rt.event_record(event.event_, stream),
                  "cudaEventRecord on a stream of device " + std::to_string(device)));
  return event;
}

CudaEvent::~CudaEvent() {
  if (event_ != nullptr) cuda_runtime().event_destroy(event_);
}

CudaEvent::CudaEvent(CudaEvent&& other) noexcept : event_(std::exchange(other.event_, nullptr)) {}

CudaEvent& CudaEvent::operator=(CudaEvent&& other) noexcept {
  if (this != &other) {
    if (event_ != nullptr) cuda_runtime().event_destroy(event_);
    event_ = std::exchange(other.event_, nullptr);
  }
  return *this;
}

Result<bool> CudaEvent::done(const std::string& what) const {
  if (event_ == nullptr) return true;
  const int error = cuda_runtime().event_query(event_);
  if (error == kCudaErrorNotReady) return false;
  ZW_RETURN_IF_ERROR(cuda_status(error, what + ": cudaEventQuery"));
  return true;
}

Status CudaEvent::wait(std::chrono::nanoseconds timeout, const std::string& what) const {
  using std::chrono::microseconds;
  const auto start = std::chrono::steady_clock::now();
  // Short sleeps first (a copy of a few MB is done in microseconds), up to 1 ms between polls.
  microseconds pause{20};
  while (true) {
    ZW_ASSIGN_OR_RETURN(bool finished, done(what));
    if (finished) return Status::ok();
    if (std::chrono::steady_clock::now() - start >= timeout) {
      return Status(
          ErrorCode::kDeadlineExceeded,
          what + ": not done after " +
              std::to_string(std::chrono::duration_cast<std::chrono::seconds>(timeout).count()) +
              " s (cudaEventQuery still reports cudaErrorNotReady: the GPU never got "
              "there, or is hung)");
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, microseconds{1000});
  }
}

}  // namespace zerowait::internal
