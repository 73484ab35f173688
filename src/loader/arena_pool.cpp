#include "loader/arena_pool.hpp"

#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/cuda_host.hpp"

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
  std::free(data_);
  data_ = nullptr;
  capacity_ = 0;
  pinned_ = false;
}

Status AlignedBuffer::reserve(size_t bytes, size_t max_capacity, bool pin) {
  if (bytes <= capacity_) return Status::ok();
  release();
  // A quarter more than asked: batches vary in size, and regrowing costs page faults.
  size_t capacity = bytes + bytes / 4;
  capacity = (capacity + kGrowthGranule - 1) / kGrowthGranule * kGrowthGranule;
  capacity = std::max(bytes, std::min(capacity, max_capacity));
  capacity = (capacity + kPage - 1) / kPage * kPage;  // aligned_alloc wants a multiple
  void* memory = std::aligned_alloc(kPage, capacity);
  if (memory == nullptr) {
    return Status(ErrorCode::kResourceExhausted,
                  "cannot allocate a batch arena of " + std::to_string(capacity) + " bytes");
  }
  madvise(memory, capacity, MADV_HUGEPAGE);  // fewer TLB misses on large arenas; only a hint
  std::memset(memory, 0, capacity);          // pre-fault now, not while a batch is filled
  data_ = static_cast<std::byte*>(memory);
  capacity_ = capacity;
  pinned_ = pin && pin_host_memory(data_, capacity_);
  return Status::ok();
}

}  // namespace internal

ArenaPool::ArenaPool(unsigned arenas, uint64_t arena_limit, bool pin)
    : arena_limit_(arena_limit), pin_(pin) {
  for (unsigned i = 0; i < arenas; ++i) {
    arenas_.push_back(std::make_unique<Arena>());
    free_.push_back(arenas_.back().get());
  }
}

Arena* ArenaPool::take_locked() {
  if (free_.empty()) return nullptr;
  Arena* arena = free_.back();
  free_.pop_back();
  return arena;
}

void ArenaPool::release(Arena* arena) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(arena);
  }
  changed_.notify_all();
}

Status ArenaPool::prefault(uint64_t read_bytes, uint64_t out_bytes) {
  // The estimate already has room for larger batches: no growth slack on top of it here.
  for (const std::unique_ptr<Arena>& arena : arenas_) {
    ZW_RETURN_IF_ERROR(reserve(arena.get(), read_bytes, out_bytes, /*slack=*/false));
  }
  return Status::ok();
}

Status ArenaPool::reserve(Arena* arena, uint64_t read_bytes, uint64_t out_bytes, bool slack) {
  if (read_bytes + out_bytes > arena_limit_) {
    return Status(ErrorCode::kResourceExhausted,
                  "a batch needs " + std::to_string((read_bytes + out_bytes) >> 20) +
                      " MiB but each of the " + std::to_string(arenas_.size()) +
                      " batch arenas may hold " + std::to_string(arena_limit_ >> 20) +
                      " MiB under memory_budget: raise memory_budget or lower batch_size");
  }
  const uint64_t before = arena->bytes();
  // Never hold more than the limit at once: a buffer that must grow is freed before it regrows.
  const uint64_t read_max = slack ? arena_limit_ - out_bytes : read_bytes;
  Status status = arena->read.reserve(read_bytes, read_max, false);
  if (status.is_ok()) {
    const uint64_t out_max = slack ? arena_limit_ - arena->read.capacity() : out_bytes;
    status = arena->out.reserve(out_bytes, out_max, pin_);
  }
  const uint64_t after = arena->bytes();
  if (after >= before) {
    bytes_.fetch_add(after - before, std::memory_order_relaxed);
  } else {
    bytes_.fetch_sub(before - after, std::memory_order_relaxed);
  }
  return status;
}

}  // namespace zerowait
