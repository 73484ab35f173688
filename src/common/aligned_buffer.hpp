// A page-aligned, pre-faulted buffer that only grows: the memory under batch arenas, checkpoint
// staging pools and O_DIRECT bounce buffers. Memory the process has never touched costs ~0.3 GB/s
// on first touch here, so buffers are faulted in once and reused.
#pragma once

#include <cstddef>

#include "zerowait/common/status.hpp"

namespace zerowait {

namespace internal {

// A page-aligned buffer that only grows. Contents are not kept when it grows.
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  // Makes capacity() >= bytes, with some room to spare up to `max_capacity`; new memory is
  // pre-faulted (and pinned when `pin`). kResourceExhausted when the allocation fails.
  Status reserve(size_t bytes, size_t max_capacity, bool pin);
  std::byte* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }

 private:
  void release();
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  bool pinned_ = false;
};

}  // namespace internal

}  // namespace zerowait
