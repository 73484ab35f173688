// The blocks a ShuffleMode::kBlock epoch reads whole: each block of a shard (a run of
// consecutive samples, about ShuffleOptions::block_bytes) is read in one request the first time
// a batch needs it and then serves every sample of it from memory, for every worker thread.
// Internal: the loader owns one per loader and its BatchBuilders share it.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "host/aligned_buffer.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {

// One block's bytes: file bytes [offset, offset + length) of its shard.
struct WindowBlock {
  internal::AlignedBuffer memory;
  uint64_t offset = 0;
  uint64_t length = 0;
  // The bytes of a sample inside the block.
  std::span<const std::byte> bytes(uint64_t file_offset, uint64_t size) const {
    return {memory.data() + (file_offset - offset), size};
  }
};

// Thread-safety: every method may be called from any number of threads at once.
class BlockWindow {
 public:
  // Keeps at most about `budget_bytes` of blocks nobody is using (least recently used go first),
  // and reuses the memory of those it drops for the blocks read next, so that an epoch faults
  // in no more than the budget once; blocks in use stay alive with their users whatever the
  // budget. With `memory_node` >= 0 the blocks' memory is bound to that NUMA node, and the
  // threads that read blocks in parallel run on `reader_cpus` (empty: the caller's CPUs).
  explicit BlockWindow(uint64_t budget_bytes, int memory_node = -1,
                       std::vector<unsigned> reader_cpus = {})
      : budget_bytes_(budget_bytes),
        memory_node_(memory_node),
        reader_cpus_(std::move(reader_cpus)) {}

  struct Want {
    size_t shard = 0;
    uint64_t block = 0;  // block number in its shard
    uint64_t offset = 0;  // file bytes the block spans
    uint64_t length = 0;
    ByteSource* source = nullptr;  // the shard's
  };

  // Every wanted block, resident: `out[i]` holds `wants[i]`. Blocks no other thread is reading
  // are read here, those of one source together in one ByteSource::read (all in flight at
  // once); blocks another thread is reading are waited for until `deadline`. Adds the bytes
  // this call read to `*bytes_read`. On an error nothing half-read is ever kept.
  Status acquire(std::span<const Want> wants, Deadline deadline,
                 std::vector<std::shared_ptr<const WindowBlock>>* out, uint64_t* bytes_read);

  struct Memory {
    uint64_t resident_bytes = 0;  // blocks held, by their length
    uint64_t spare_bytes = 0;     // buffers kept for the next reads, by the length they held
    uint64_t buffers_allocated = 0;  // ever, by this window
  };
  Memory memory() const;

 private:
  using Key = std::pair<size_t, uint64_t>;
  struct Entry {
    std::shared_ptr<WindowBlock> block;  // null while being read
    std::list<Key>::iterator place;            // in recent_, once read
  };

  // Fills read[j] with wants[j]'s bytes.
  Status read_blocks(std::span<const Want* const> wants, Deadline deadline,
                     std::span<const std::shared_ptr<WindowBlock>> read, uint64_t* bytes_read);
  // Drops least recently used blocks nobody holds until `incoming` more bytes fit the budget.
  void evict_locked(uint64_t incoming);
  // A spare buffer that holds `bytes`, or a new one.
  std::shared_ptr<WindowBlock> take_spare_locked(uint64_t bytes);

  const uint64_t budget_bytes_;
  const int memory_node_;
  const std::vector<unsigned> reader_cpus_;
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  std::map<Key, Entry> blocks_;
  std::list<Key> recent_;  // resident blocks, most recently used first
  uint64_t resident_bytes_ = 0;
  // Blocks evicted when nobody used them any more, kept for their memory (resident and spare
  // bytes together within the budget): a fresh buffer's page faults cost more than reading the
  // block from a fast disk.
  std::vector<std::shared_ptr<WindowBlock>> spare_;
  uint64_t spare_bytes_ = 0;  // the lengths they held
  uint64_t buffers_allocated_ = 0;
};

}  // namespace zerowait
