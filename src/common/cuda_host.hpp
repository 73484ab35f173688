// Page-locked host memory through the CUDA runtime, loaded at run time with dlopen: CUDA is never
// a build dependency. Without libcudart (or without a device) every call here is a no-op that
// says so once, and arenas stay plain host memory.
#pragma once

#include <cstddef>
#include <string>

namespace zerowait::internal {

// True when libcudart loaded and reports at least one device (probed once, thread-safe); when
// false, notes once that batch arenas and checkpoint staging use plain host memory, and why.
bool host_memory_pinning_available();

// Page-locks [data, data + bytes) for fast, asynchronous host-to-device copies. Returns false
// (and notes the fallback once) when CUDA is unavailable or registration fails.
bool pin_host_memory(void* data, size_t bytes);
// Undoes pin_host_memory(); call before freeing the memory.
void unpin_host_memory(void* data);

}  // namespace zerowait::internal
