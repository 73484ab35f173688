#include "loader/arena_pool.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "host/thread_placement.hpp"

namespace zerowait {

ArenaPool::ArenaPool(unsigned arenas, uint64_t arena_limit, bool pin, bool poison)
    : arena_limit_(arena_limit), pin_(pin), poison_(poison) {
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
  if (poison_) {
    // Before the arena is free again: nothing can take it while it is being overwritten.
    for (internal::AlignedBuffer* buffer : {&arena->read, &arena->out}) {
      if (buffer->capacity() > 0) {
        std::memset(buffer->data(), std::to_integer<int>(kPoisonByte), buffer->capacity());
      }
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    arena->holder = nullptr;
    free_.push_back(arena);
  }
  changed_.notify_all();
}

ArenaPool::~ArenaPool() {
  stopping_.store(true);
  if (prefaulter_.joinable()) prefaulter_.join();
}

Status ArenaPool::start_prefault(uint64_t read_bytes, uint64_t out_bytes,
                                 std::vector<unsigned> cpus) {
  if (prefaulter_.joinable()) return Status::ok();
  auto touch_free_arenas = [this, read_bytes, out_bytes] {
    for (const std::unique_ptr<Arena>& arena : arenas_) {
      if (stopping_.load()) return;
      {
        std::lock_guard<std::mutex> lock(mutex_);
        auto free = std::find(free_.begin(), free_.end(), arena.get());
        if (free == free_.end()) continue;  // a worker has it
        free_.erase(free);
        prefaulting_ = 1;
      }
      // The estimate already has room for larger batches: no growth slack on top of it here.
      (void)reserve(arena.get(), read_bytes, out_bytes, /*slack=*/false);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        free_.push_back(arena.get());  // last: the next arena a worker takes
        prefaulting_ = 0;
      }
      changed_.notify_all();
    }
  };
  ZW_ASSIGN_OR_RETURN(prefaulter_, internal::start_thread({"zw-arena-touch", std::move(cpus)},
                                                          std::move(touch_free_arenas)));
  return Status::ok();
}

Status ArenaPool::bind_to_node(int node) {
  for (const std::unique_ptr<Arena>& arena : arenas_) {
    ZW_RETURN_IF_ERROR(arena->read.bind_to_node(node));
    ZW_RETURN_IF_ERROR(arena->out.bind_to_node(node));
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
