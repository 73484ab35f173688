// The node-local cache's shared state, for its parts in block_cache.cpp (reading and filling
// blocks, eviction), block_downloads.cpp (the background downloaders) and cached_source.cpp (the
// ByteSource over the cache). Internal to the cache.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/file.hpp"
#include "storage/cache/block_store.hpp"
#include "zerowait/storage/block_cache.hpp"

namespace zerowait {
namespace internal {

// A block this process reads from: its file on disk, or, when it could not be written there (a
// full disk), the downloaded bytes themselves.
struct OpenBlock {
  File file;
  std::vector<std::byte> memory;

  Status read(uint64_t offset, std::span<std::byte> dst) const {
    if (file.is_open()) return file.pread_exact(offset, dst);
    std::memcpy(dst.data(), memory.data() + offset, dst.size());
    return Status::ok();
  }
};

// An announced range downloaded alone into memory while its blocks are not cached yet
// (BlockCacheOptions::range_download_bytes): what the reads inside it take meanwhile. It is
// dropped once each block it lies in (one or two: it is at most half a block) is held.
// Everything but `bytes`' contents is read and written under BlockCache::Impl's mutex; until a
// downloader starts it, another range announced in its block may extend it.
struct RangeDownload {
  uint64_t offset = 0;
  std::vector<std::byte> bytes;  // sized when announced, filled by a downloader before `done`
  uint64_t first_block = 0;
  unsigned blocks_missing = 0;  // bit i: block first_block + i not held yet
  bool started = false;
  bool done = false;
  bool failed = false;

  bool covers(uint64_t position, uint64_t length) const {
    return position >= offset && position + length <= offset + bytes.size();
  }
};

struct CacheCounters {
  std::atomic<uint64_t> hits{0}, misses{0}, waits{0}, evictions{0}, damaged{0},
      stale_temps_removed{0}, prefetched{0}, bytes_hit{0}, bytes_downloaded{0}, bytes_evicted{0},
      ranges_downloaded{0}, bytes_ranges{0}, range_reads{0};
};

}  // namespace internal

class BlockCache::Impl {
 public:
  Impl(BlockCacheOptions options, std::unique_ptr<internal::BlockStore> store);

  ~Impl();

  const BlockCacheOptions& options() const { return options_; }

  uint64_t block_length(uint64_t object_size, uint64_t block) const {
    return std::min(options_.block_bytes, object_size - block * options_.block_bytes);
  }

  // Block `block` of `origin` (object id `object`): from this process's open blocks, from disk,
  // or downloaded, once per block across threads and processes. `announced`: a background fill
  // of an announced block (counted as prefetched, not as a hit or miss).
  Result<std::shared_ptr<const internal::OpenBlock>> acquire(ByteSource& origin,
                                                             const std::string& object,
                                                             uint64_t block, Deadline deadline,
                                                             bool announced);

  // Queues the download of bytes [offset, offset + length) of `origin` alone, ahead of the
  // blocks, when the range is at most half a block, none of the cached blocks it lies in is
  // held and range_download_bytes has room (BlockCacheOptions::range_download_bytes).
  void announce_range(const std::shared_ptr<ByteSource>& origin, const std::string& object,
                      uint64_t offset, uint64_t length);

  // A request set of read_metadata took `elapsed`: the origin's round trip, at most.
  void note_round_trip(std::chrono::nanoseconds elapsed) {
    int64_t quickest = quickest_round_trip_ns_.load();
    while (elapsed.count() < quickest &&
           !quickest_round_trip_ns_.compare_exchange_weak(quickest, elapsed.count())) {
    }
  }

  // Fills `dst` with bytes `position`.. of `object` from a range download that covers them,
  // waiting for it within `deadline` while it is under way: false when no range download covers
  // them or it failed (the read then goes through the blocks).
  Result<bool> read_from_range(const std::string& object, uint64_t position,
                               std::span<std::byte> dst, Deadline deadline);

  // Marks blocks [first, last] of `origin` as needed soon, in this order, and queues their
  // download.
  void announce(const std::shared_ptr<ByteSource>& origin, const std::string& object,
                uint64_t first, uint64_t last);

  // Blocks [first, last] of `origin` are needed now by a read that will take them in this
  // order: those this process does not hold open go to the front of the downloaders' queue, so
  // that they are fetched in parallel while the read takes the ones before them. A no-op without
  // downloaders; a warm read (its blocks open) wakes nobody.
  void fetch_ahead(const std::shared_ptr<ByteSource>& origin, const std::string& object,
                   uint64_t first, uint64_t last);

  // Whether block `block` of `object` is open in this process or has a file on disk (not
  // checked here: a read checks it).
  bool holds(const std::string& object, uint64_t block);

  Status trim(uint64_t headroom, uint64_t pending, Deadline deadline);

  BlockCacheStats stats() const;

 private:
  // One downloader per job queued, not all of them: with tens of downloaders, waking every one
  // for a hint of a block or two costs a context switch each, on the CPUs a read needs. Most
  // hints name blocks already announced and queue nothing.
  void wake_downloaders(size_t queued) {
    for (size_t i = 0; i < std::min(queued, prefetchers_.size()); ++i) prefetch_wake_.notify_one();
  }

  struct PrefetchJob {
    std::shared_ptr<ByteSource> origin;
    std::string object;
    uint64_t block = 0;
  };
  struct RangeJob {
    std::shared_ptr<ByteSource> origin;
    std::string object;
    std::shared_ptr<internal::RangeDownload> range;
  };

  Result<std::shared_ptr<const internal::OpenBlock>> acquire_block(ByteSource& origin,
                                                                   const std::string& object,
                                                                   uint64_t block,
                                                                   Deadline deadline,
                                                                   bool announced);

  void download_range(const RangeJob& job);

  // Block `block` of `object` is held now: range downloads that needed it only meanwhile go.
  void drop_ranges_held(const std::string& object, uint64_t block);

  // Locked by the caller: removes the range downloads of `object` that `drop` picks (the object's
  // entry too, once it has none).
  template <typename Predicate>
  void erase_ranges(const std::string& object, Predicate drop) {
    auto it = ranges_.find(object);
    if (it == ranges_.end()) return;
    std::erase_if(it->second, drop);
    if (!it->second.empty()) return;
    ranges_.erase(it);
    range_objects_.store(ranges_.size());
  }

  // Waits while another thread of this process fills block `name` (woken when it is done: the
  // block's file lock could only be polled, which adds up to a poll interval to every wait).
  // Returns the block that thread opened, or nullptr when this thread is now the block's filler
  // (a FillClaim must end the claim); kDeadlineExceeded names `what` at the deadline.
  Result<std::shared_ptr<const internal::OpenBlock>> claim_fill(const std::string& name,
                                                                Deadline deadline,
                                                                const std::string& what);

  // Ends a claim of claim_fill() when destroyed, whatever the fill's outcome, and wakes the
  // threads waiting for it.
  class FillClaim;

  void count_hit(uint64_t length) {
    counters_.hits.fetch_add(1);
    counters_.bytes_hit.fetch_add(length);
  }

  // The block's file if it is on disk and intact (checked once per process and file); nullptr
  // when it is not there. A damaged file is removed when `locked` (this thread holds the
  // block's lock, so nobody is publishing it meanwhile) and otherwise left for the lock holder.
  Result<std::shared_ptr<const internal::OpenBlock>> open_checked(const std::string& object,
                                                                  uint64_t block, uint64_t length,
                                                                  bool locked);

  // A file is known intact by its path and inode: a block evicted and filled again is a new
  // inode and is checked again.
  static std::string checked_key(const internal::File& file);
  bool is_checked(const std::string& key);
  void remember_checked(std::string key);

  std::shared_ptr<const internal::OpenBlock> find_open(const std::string& name);

  std::shared_ptr<const internal::OpenBlock> remember(
      const std::string& name, std::shared_ptr<const internal::OpenBlock> block);

  // Locked by the caller.
  void close_open(const std::string& name);

  void forget_announcement(const std::string& name);

  // Blocks nobody announced, least recently used first; then announced ones, the one needed
  // furthest ahead first.
  std::vector<const internal::BlockFileEntry*> eviction_order(
      const std::vector<internal::BlockFileEntry>& blocks);

  // Records `bytes` about to be written in the shared ledger, evicting first when they would not
  // fit. The headroom evicted beyond the need (a tenth of the cap) spares an eviction per fill.
  Status reserve(uint64_t bytes, Deadline deadline);

  void prefetch_loop();

  struct OpenEntry {
    std::shared_ptr<const internal::OpenBlock> block;
    std::list<std::string>::iterator place;
  };

  const BlockCacheOptions options_;
  const std::unique_ptr<internal::BlockStore> store_;
  internal::CacheCounters counters_;

  std::mutex mutex_;  // guards everything below
  std::unordered_map<std::string, OpenEntry> open_;
  std::list<std::string> recently_opened_;  // open_'s names, most recent first
  std::unordered_set<std::string> checked_;
  std::unordered_map<std::string, uint64_t> announced_;  // block name -> announcement order
  uint64_t announce_sequence_ = 0;
  std::deque<PrefetchJob> queue_;
  std::deque<RangeJob> range_queue_;  // taken before queue_
  // Range downloads by object, until the blocks they lie in are held.
  std::unordered_map<std::string, std::vector<std::shared_ptr<internal::RangeDownload>>> ranges_;
  std::atomic<size_t> range_objects_{0};  // ranges_.size(), read without the mutex
  // Counted against range_download_bytes; written under the mutex, read without it by the
  // hints that come once it is spent (every hint of the run after its first batches).
  std::atomic<uint64_t> range_bytes_announced_{0};
  std::condition_variable range_done_;
  // Range downloads under way: blocks wait for them, which would otherwise share the link (and
  // this machine's CPUs) with the bytes a first batch waits for.
  size_t ranges_in_flight_ = 0;
  std::atomic<int64_t> quickest_round_trip_ns_{INT64_MAX};  // INT64_MAX: none seen yet
  std::condition_variable prefetch_wake_;
  std::unordered_set<std::string> filling_;  // blocks a thread of this process is filling
  std::condition_variable filled_;           // a fill of filling_ ended
  bool stopping_ = false;
  std::vector<std::thread> prefetchers_;
};

}  // namespace zerowait
