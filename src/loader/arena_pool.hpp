// Batch arenas: reusable, page-aligned, pre-faulted memory for the batches in flight, from a pool
// of fixed size. Memory the process has never touched costs ~0.3 GB/s on first touch here, so a
// steady-state loader allocates nothing: arenas grow to the largest batch seen, then are reused.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "host/aligned_buffer.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/loader/loader.hpp"

namespace zerowait {

struct Arena {
  internal::AlignedBuffer read;  // coalesced shard bytes of one batch
  internal::AlignedBuffer out;   // the batch's columns
  // The batch it holds once that batch is with the consumer, for the "every arena is held"
  // error; guarded by the pool's mutex, cleared when the arena comes back.
  const Batch::Impl* holder = nullptr;
  uint64_t bytes() const { return read.capacity() + out.capacity(); }
};

// A fixed number of arenas, each allowed at most `arena_limit` bytes; with `poison`, an arena's
// bytes are overwritten with kPoisonByte when it comes back (LoaderOptions::poison_released_arenas).
// The pool's mutex and condition variable are also the loader's: an arena coming back (from any
// thread, when the consumer drops a batch) must wake the workers waiting for one, so both sides
// wait on the same condition variable under the same lock.
class ArenaPool {
 public:
  static constexpr std::byte kPoisonByte{0xA5};
  ArenaPool(unsigned arenas, uint64_t arena_limit, bool pin, bool poison = false);
  ~ArenaPool();  // stops and joins start_prefault()'s thread

  std::mutex& mutex() { return mutex_; }
  std::condition_variable& changed() { return changed_; }

  // With mutex() held: a free arena, or nullptr when none is free.
  Arena* take_locked();
  // Returns an arena (locks mutex()) and wakes every waiter.
  void release(Arena* arena);
  // With mutex() held. The arena start_prefault()'s thread holds counts as free: it comes back
  // as soon as its pages are touched.
  unsigned free_count_locked() const {
    return static_cast<unsigned>(free_.size()) + prefaulting_;
  }

  // Grows both buffers of `arena` (owned by the caller) to hold `read_bytes` and `out_bytes`,
  // with a quarter to spare when `slack` (within the per-arena limit); kResourceExhausted when
  // they would pass that limit.
  Status reserve(Arena* arena, uint64_t read_bytes, uint64_t out_bytes, bool slack = true);

  // Reserves every arena for a batch of these sizes on a thread of the pool's own, beside what
  // the loader does next (a remote dataset's first claims wait a round trip for their bytes):
  // each arena still free is taken, reserved and given back, one at a time, so a worker never
  // waits for more than one arena's faults, and one a worker took first is faulted by that
  // worker's own reserve(). A failed reservation is the worker's to meet, and to report. The
  // thread (zw-arena-touch) runs on `cpus`, as the workers do (empty: the caller's). Once
  // started, later calls do nothing. Call after bind_to_node().
  Status start_prefault(uint64_t read_bytes, uint64_t out_bytes, std::vector<unsigned> cpus);

  // Binds every arena's memory to NUMA node `node` (AlignedBuffer::bind_to_node): call before
  // start_prefault(), so that pages are bound before they are first touched. Before any arena is
  // taken.
  Status bind_to_node(int node);

  unsigned size() const { return static_cast<unsigned>(arenas_.size()); }
  const std::vector<std::unique_ptr<Arena>>& arenas() const { return arenas_; }
  uint64_t bytes() const { return bytes_.load(std::memory_order_relaxed); }
  uint64_t arena_limit() const { return arena_limit_; }
  bool pin() const { return pin_; }

 private:
  std::vector<std::unique_ptr<Arena>> arenas_;
  std::vector<Arena*> free_;
  uint64_t arena_limit_;
  bool pin_;
  bool poison_;
  std::atomic<uint64_t> bytes_{0};
  std::mutex mutex_;
  std::condition_variable changed_;
  unsigned prefaulting_ = 0;  // arenas start_prefault()'s thread holds (0 or 1); under mutex_
  std::atomic<bool> stopping_{false};
  std::thread prefaulter_;
};

}  // namespace zerowait
