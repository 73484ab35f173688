// The CUDA runtime (libcudart), loaded at run time with dlopen: CUDA is never a build dependency.
// Without libcudart, or without a device, nothing here fails: available() says why, the pinning
// calls are no-ops that say so once, and batch arenas and checkpoint staging stay plain host
// memory. The C signatures used are those of cuda_runtime_api.h (cudaError_t is an int-sized
// enum, 0 = success; streams and events are opaque pointers).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "zerowait/common/status.hpp"

namespace zerowait::internal {

using CudaStreamHandle = void*;  // cudaStream_t
using CudaEventHandle = void*;   // cudaEvent_t

// The entry points, resolved once per process (thread-safe). A process that already loaded a
// libcudart (a CUDA build of torch) gets that same copy, so pointers, streams and events are
// shared with it.
struct CudaRuntime {
  bool ok = false;     // loaded, every entry point found, and at least one device
  std::string reason;  // why not, when !ok
  int devices = 0;

  int (*get_device_count)(int*) = nullptr;
  int (*set_device)(int) = nullptr;
  int (*get_device)(int*) = nullptr;
  const char* (*get_error_string)(int) = nullptr;
  int (*host_register)(void*, size_t, unsigned) = nullptr;
  int (*host_unregister)(void*) = nullptr;
  int (*pointer_get_attributes)(void*, const void*) = nullptr;
  int (*malloc)(void**, size_t) = nullptr;
  int (*free)(void*) = nullptr;
  int (*memcpy)(void*, const void*, size_t, int) = nullptr;
  int (*memcpy_async)(void*, const void*, size_t, int, CudaStreamHandle) = nullptr;
  int (*memset)(void*, int, size_t) = nullptr;
  int (*stream_create_with_flags)(CudaStreamHandle*, unsigned) = nullptr;
  int (*stream_destroy)(CudaStreamHandle) = nullptr;
  int (*stream_synchronize)(CudaStreamHandle) = nullptr;
  int (*event_create_with_flags)(CudaEventHandle*, unsigned) = nullptr;
  int (*event_destroy)(CudaEventHandle) = nullptr;
  int (*event_record)(CudaEventHandle, CudaStreamHandle) = nullptr;
  int (*event_synchronize)(CudaEventHandle) = nullptr;
  int (*event_elapsed_time)(float*, CudaEventHandle, CudaEventHandle) = nullptr;
};

// cudaMemcpyKind values.
inline constexpr int kCudaMemcpyHostToDevice = 1;
inline constexpr int kCudaMemcpyDeviceToHost = 2;
inline constexpr int kCudaMemcpyDeviceToDevice = 3;
inline constexpr unsigned kCudaStreamNonBlocking = 1;
inline constexpr unsigned kCudaEventDisableTiming = 2;

const CudaRuntime& cuda_runtime();

// Status for a CUDA runtime call's result: ok for 0, else kIo "WHAT: <cudaGetErrorString> (N)".
Status cuda_status(int error, const std::string& what);

// True when libcudart loaded and reports at least one device; when false, notes once that batch
// arenas and checkpoint staging use plain host memory, and why.
bool host_memory_pinning_available();

// Page-locks [data, data + bytes) for fast, asynchronous host-to-device copies. Returns false
// (and notes the fallback once) when CUDA is unavailable or registration fails.
bool pin_host_memory(void* data, size_t bytes);
// Undoes pin_host_memory(); call before freeing the memory.
void unpin_host_memory(void* data);

// What cudaPointerGetAttributes says `pointer` is: "host" (page-locked: cudaHostRegister or
// cudaMallocHost), "device", "managed", "unregistered" (plain pageable memory), or "" without
// CUDA. The tests' proof that arenas are really pinned.
std::string cuda_memory_type(const void* pointer);

// The ordinal of the device whose memory `pointer` is (device or managed memory): what a copy
// into it, or a cuFile read, must make current first. kInvalidArgument naming what the pointer
// is instead ("host", "unregistered"); kUnsupported without CUDA.
Result<int> cuda_pointer_device(const void* pointer);

// Device memory for tests and benchmarks: cudaMalloc'd on the current device, freed when
// destroyed. Move-only.
class DeviceBuffer {
 public:
  static Result<DeviceBuffer> allocate(size_t bytes);
  DeviceBuffer() = default;
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace zerowait::internal
