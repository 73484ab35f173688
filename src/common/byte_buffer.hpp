// A byte vector whose resize() leaves new bytes uninitialised: buffers about to be filled by a
// read should not pay for zeroing first (measurable at pack's hundreds of MB/s).
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace zerowait::internal {

template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;  // default-init: no zeroing
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

using ByteBuffer = std::vector<std::byte, UninitializedAllocator<std::byte>>;

}  // namespace zerowait::internal
