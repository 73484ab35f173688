// The CUDA runtime (libcudart), loaded at run time with dlopen: CUDA is never a build dependency.
// Without libcudart, or without a device, nothing here fails: available() says why, the pinning
// calls are no-ops that say so once, and batch arenas and checkpoint staging stay plain host
// memory. The C signatures used are those of cuda_runtime_api.h (cudaError_t is an int-sized
// enum, 0 = success; streams and events are opaque pointers).
#pragma once

#include <chrono>
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
  int (*event_query)(CudaEventHandle) = nullptr;  // 0: done, kCudaErrorNotReady: not yet
  int (*event_elapsed_time)(float*, CudaEventHandle, CudaEventHandle) = nullptr;
};

// cudaMemcpyKind values.
inline constexpr int kCudaMemcpyHostToDevice = 1;
inline constexpr int kCudaMemcpyDeviceToHost = 2;
inline constexpr int kCudaMemcpyDeviceToDevice = 3;
inline constexpr unsigned kCudaStreamNonBlocking = 1;
inline constexpr unsigned kCudaEventDisableTiming = 2;
inline constexpr int kCudaErrorNotReady = 600;  // cudaEventQuery: the work is still queued

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

// An event recorded on a stream: done once the work queued on that stream before it is done.
// The way a host thread learns that asynchronous copies into host memory it owns (checkpoint
// staging) have finished, without synchronising the whole device. Move-only; destroys the event.
class CudaEvent {
 public:
  // Creates an event on `device` (timing disabled) and records it on `stream`, a cudaStream_t of
  // that device. Errors: kUnsupported without CUDA, kIo naming the CUDA call that failed.
  static Result<CudaEvent> record(int device, CudaStreamHandle stream);
  CudaEvent() = default;
  ~CudaEvent();
  CudaEvent(CudaEvent&& other) noexcept;
  CudaEvent& operator=(CudaEvent&& other) noexcept;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  // Whether the work before the event is done: true, false, or kIo (a failed copy or kernel on
  // that stream: the CUDA error, prefixed by `what`).
  Result<bool> done(const std::string& what) const;
  // Waits until done(), polling (the thread sleeps between polls, so a GPU that never gets
  // there costs no CPU). kDeadlineExceeded after `timeout`, naming `what`.
  Status wait(std::chrono::nanoseconds timeout, const std::string& what) const;
  bool valid() const { return event_ != nullptr; }

 private:
  CudaEventHandle event_ = nullptr;
};

}  // namespace zerowait::internal
