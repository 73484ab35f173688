// A page-aligned buffer that only grows: the memory under batch arenas, checkpoint staging pools,
// O_DIRECT bounce buffers and the loader's block window. Memory the process has never touched
// costs ~0.3 GB/s on first touch here, so buffers are faulted in once and reused.
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

  // How new memory is faulted in.
  enum class Touch {
    kNow,           // by reserve(), so that filling it later costs no page faults
    kByFirstWrite,  // by the read that fills it, which faults in the pages it writes anyway
                    // (O_DIRECT: while the device serves the previous request); touching them
                    // first would only add a pass, measured to double a cold block epoch's time
  };

  // Makes capacity() >= bytes, with some room to spare up to `max_capacity`; new memory is
  // faulted in as `touch` says (and pinned when `pin`). kResourceExhausted when the allocation
  // fails.
  Status reserve(size_t bytes, size_t max_capacity, bool pin, Touch touch = Touch::kNow);
  std::byte* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  bool pinned() const { return pinned_; }

  // Binds the buffer's memory to NUMA node `node` (numa.hpp, bind_memory_to_node): what it
  // holds now is moved there, what reserve() allocates later is bound before it is touched.
  // Errors: bind_memory_to_node's, for memory held now (later ones come from reserve()).
  Status bind_to_node(int node);
  int node() const { return node_; }  // -1: the process's memory policy

 private:
  void release();
  std::byte* data_ = nullptr;
  size_t capacity_ = 0;
  bool pinned_ = false;
  int node_ = -1;
};

}  // namespace internal

}  // namespace zerowait
