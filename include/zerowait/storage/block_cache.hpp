// The node-local cache: remote objects (or any ByteSource) kept on local disk in fixed-size
// blocks, shared by every process of the node that opens the same directory. docs/cache.md
// describes the layout on disk and the protocol between processes.
//
// What it promises:
// - One download per block, across threads and processes: the filler holds a lock on the block
//   (an open-file-description lock, released by the kernel if the process dies), and everyone
//   else waits for it, within their read's deadline, then reads the published file.
// - No reader sees a partial or damaged block: a block is written to a temporary file, checked
//   and renamed into place; every process checks a block's checksum the first time it opens it,
//   so a file left by a crash, a torn write or a damaged disk is downloaded again, never trusted.
//   A block removed while a process reads it stays readable to that process (it holds it open).
// - The cache stays within `capacity_bytes` and leaves `min_free_bytes` free on its filesystem,
//   give or take the blocks being filled at that moment (each at most one block).
// - Eviction removes blocks nobody announced first, least recently used first; blocks a reader
//   announced with ByteSource::prefetch() and has not read yet go last, the furthest-ahead
//   first (the loader announces its next batches, so what it needs next stays).
// - Nothing outlives a crash but the blocks themselves: no shared memory, no daemon; a process
//   that dies mid-fill leaves a temporary file the next process removes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait {

struct BlockCacheOptions {
  // A directory on local disk (created if missing). Processes that name the same directory
  // share one cache.
  std::string directory;
  // The most bytes the cache may hold. 0: half of the filesystem's free space when opened.
  uint64_t capacity_bytes = 0;
  // Blocks are evicted to keep at least this much free on the cache's filesystem.
  uint64_t min_free_bytes = 1ull << 30;
  // Objects are cached in blocks of this many bytes (the last block of an object is shorter).
  // Every process sharing a directory must use the same block size: blocks are named by it.
  uint64_t block_bytes = 4ull << 20;
  // Blocks one process keeps open (file descriptors). A block evicted while open keeps its disk
  // space until it is closed, so this also bounds how far past the cap the disk use can go.
  size_t open_blocks = 64;
  // Blocks announced by prefetch() are downloaded in the background, about this many bytes of
  // them at once: prefetch_bytes / block_bytes range requests in flight (at least one), each into
  // a buffer of its own, so this also bounds the memory the downloads hold. A link with tens of
  // milliseconds per request needs many requests in flight to be full (docs/remote.md, "Cold
  // reads: where the time goes"); sized in bytes, the read-ahead stays the same whatever the
  // block size.
  uint64_t prefetch_bytes = 128ull << 20;
  // The most downloader threads prefetch_bytes may ask for (0: none; announcements then only
  // order eviction).
  unsigned prefetch_threads = 64;
  // A range announced by prefetch() while none of its blocks is cached yet (a cold cache's first
  // batches) is also downloaded alone, into memory, ahead of the blocks, and the reads inside it
  // take it from there: the first batch waits for its own bytes, not for every whole block they
  // lie in (docs/remote.md, "The first batch"). Up to this many bytes per process, so those bytes
  // are downloaded twice only at the start; ranges over half a block are left to the blocks.
  // Needs downloaders (prefetch_threads > 0). 0: reads always wait for whole blocks.
  uint64_t range_download_bytes = 64ull << 20;
  // ...and only once the origin is seen to be far: the quickest of its shard opens' requests
  // (header, footer, index) took at least this long. Near it, the blocks come about as soon
  // and the bytes downloaded twice cost more than they save (docs/remote.md). 0: not asked.
  uint32_t range_download_after_ms = 10;
};

// Counters of this process's use of the cache (other processes count their own), plus the
// cache's size on disk.
struct BlockCacheStats {
  uint64_t hits = 0;       // block reads served by a block already on disk
  uint64_t misses = 0;     // blocks this process downloaded
  uint64_t waits = 0;      // blocks another thread or process was downloading; read when done
  uint64_t evictions = 0;  // blocks this process removed to stay within the cap
  uint64_t damaged = 0;    // blocks found damaged on disk (size, checksum) and downloaded again
  uint64_t stale_temps_removed = 0;  // temporary files of dead processes removed
  uint64_t prefetched = 0;           // blocks downloaded in the background after an announcement
  uint64_t ranges_downloaded = 0;    // announced ranges downloaded alone (range_download_bytes)
  uint64_t bytes_ranges = 0;         // their bytes (counted apart from bytes_downloaded)
  uint64_t range_reads = 0;          // reads served from those ranges
  uint64_t bytes_hit = 0;            // bytes read from blocks on disk
  uint64_t bytes_downloaded = 0;
  uint64_t bytes_evicted = 0;
  uint64_t usage_bytes = 0;  // the cache's size on disk, as last recorded by any process
  uint64_t capacity_bytes = 0;
};

// Thread-safe. The sources wrap() returns keep the cache's internals alive: they stay valid
// after the BlockCache handle is gone.
class BlockCache {
 public:
  // Creates the directory's layout if missing, removes temporary files of dead processes and
  // measures what the cache holds. Errors name the directory: not writable, a layout of another
  // block size, an unsupported filesystem (no open-file-description locks).
  static Result<std::shared_ptr<BlockCache>> open(BlockCacheOptions options);
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A source that reads `origin` through the cache. Its blocks are named by the origin's
  // name(), size() and version(): an object that changes on the server under the same name is
  // a different object once its size or version (an ETag) differs. Errors of the origin pass
  // through, naming it; the cache's own errors name the block's file.
  std::shared_ptr<ByteSource> wrap(std::shared_ptr<ByteSource> origin);

  BlockCacheStats stats() const;
  const BlockCacheOptions& options() const;

  // Evicts until the cache holds at most `capacity_bytes - headroom_bytes` (and leaves the free
  // space asked for). Fills call this themselves when the cache is full; callers need it only
  // to make room ahead of time.
  Status trim(uint64_t headroom_bytes, Deadline deadline = Deadline::none());

  class Impl;

 private:
  explicit BlockCache(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace zerowait
