#include "host/aligned_buffer.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/align.hpp"
#include "host/cuda_runtime.hpp"
#include "host/numa.hpp"

namespace zerowait {

namespace internal {

namespace {
constexpr size_t kPage = 4096;
constexpr size_t kGrowthGranule = size_t{1} << 20;  // grow in whole MiB, so small growths are rare
}  // namespace

AlignedBuffer::~AlignedBuffer() { release(); }

void AlignedBuffer::release() {
  if (data_ == nullptr) return;
  if (pinned_) unpin_host_memory(data_);
  // The heap hands these pages out again: without this their binding would follow them.
  if (node_ >= 0) (void)reset_memory_policy(data_, capacity_);
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
  pinned_ = false;
}

Status AlignedBuffer::reserve(size_t bytes, size_t max_capacity, bool pin, Touch touch) {
  if (bytes <= capacity_) return Status::ok();
  release();
  // A quarter more than asked: batches vary in size, and regrowing costs page faults.
  size_t capacity = bytes + bytes / 4;
  capacity = align_up(capacity, kGrowthGranule);
  capacity = std::max(bytes, std::min(capacity, max_capacity));
  capacity = align_up(capacity, kPage);  // aligned_alloc wants a multiple
  void* memory = std::aligned_alloc(kPage, capacity);
  if (memory == nullptr) {
    return Status(ErrorCode::kResourceExhausted,
                  "cannot allocate an aligned buffer of " + std::to_string(capacity) + " bytes");
  }
  data_ = static_cast<std::byte*>(memory);
  capacity_ = capacity;
  // Before the first touch, so that every page is allocated on the node (pages the heap reused
  // are moved there).
  if (node_ >= 0) {
    Status bound = bind_memory_to_node(memory, capacity, node_);
    if (!bound.is_ok()) {
      release();
      return bound;
    }
  }
  madvise(memory, capacity, MADV_HUGEPAGE);  // fewer TLB misses on large arenas; only a hint
  if (touch == Touch::kNow) std::memset(memory, 0, capacity);
  pinned_ = pin && pin_host_memory(data_, capacity_);
  return Status::ok();
}

Status AlignedBuffer::bind_to_node(int node) {
  if (data_ != nullptr) ZW_RETURN_IF_ERROR(bind_memory_to_node(data_, capacity_, node));
  node_ = node;
  return Status::ok();
}

}  // namespace internal

}  // namespace zerowait
