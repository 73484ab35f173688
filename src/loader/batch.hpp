// What a Batch holds: its arena from the loader's pool, the columns laid out in it, and the
// count of live views per column that the "every arena is held" error reports. Filled by one
// worker thread (BatchBuilder), then handed to the consumer and never changed again.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loader/arena_pool.hpp"
#include "zerowait/loader/loader.hpp"

namespace zerowait {

struct Batch::Impl {
  // Takes `arena` (from pool->take_locked()); gives it back when destroyed.
  Impl(std::shared_ptr<ArenaPool> pool, Arena* arena);
  ~Impl();
  Impl(const Impl&) = delete;
  Impl& operator=(const Impl&) = delete;

  std::shared_ptr<ArenaPool> pool;
  Arena* arena;
  uint64_t epoch = 0;
  uint64_t number = 0;
  uint64_t samples = 0;
  std::vector<BatchColumn> columns;
  std::vector<std::string> keys;
  std::vector<uint32_t> views;  // per column: live Batch::view()s; guarded by pool->mutex()
};

// Copies every column that kOwnedColumnMaxBytes says to keep out of the arena into memory of
// its own (`always`: the columns copied whatever their size). Called once the batch is complete.
void copy_small_columns(const std::vector<bool>& always, Batch::Impl* batch);

// With the pool's mutex held: the batches the consumer holds and, for each, the columns it holds
// views of, for the "every arena is held" error.
std::string held_batches_locked(const ArenaPool& pool);

}  // namespace zerowait
