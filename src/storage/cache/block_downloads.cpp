// The node-local cache's background downloads: announced blocks queued in need order, blocks a
// read needs next put in front, and the downloader threads that fetch them ahead of the readers.
#include <algorithm>
#include <chrono>
#include <mutex>

#include "storage/cache/block_cache_impl.hpp"
#include "storage/cache/cache_trace.hpp"

namespace zerowait {

using internal::BlockStore;

namespace {

// Background downloads of announced blocks get this long each; it also bounds how long
// destroying the cache waits for one in flight.
constexpr auto kPrefetchTimeout = std::chrono::seconds(10);
// Announcements remembered at most; past it they are forgotten (they are hints).
constexpr size_t kMaxAnnounced = 1 << 20;
constexpr size_t kMaxQueuedPrefetches = 1024;

}  // namespace

void BlockCache::Impl::announce(const std::shared_ptr<ByteSource>& origin,
                                const std::string& object, uint64_t first, uint64_t last) {
  size_t queued = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (announced_.size() > kMaxAnnounced) announced_.clear();
    for (uint64_t b = first; b <= last; ++b) {
      const std::string name = BlockStore::block_name(object, b);
      if (!announced_.emplace(name, ++announce_sequence_).second) continue;
      // A block this process holds open needs no downloader (a warm epoch's, mostly).
      if (!prefetchers_.empty() && queue_.size() < kMaxQueuedPrefetches && open_.count(name) == 0) {
        queue_.push_back({origin, object, b});
        ++queued;
        if (auto* trace = internal::CacheTrace::get()) trace->event("announce", origin->name(), b);
      }
    }
  }
  wake_downloaders(queued);
}

void BlockCache::Impl::fetch_ahead(const std::shared_ptr<ByteSource>& origin,
                                   const std::string& object, uint64_t first, uint64_t last) {
  if (prefetchers_.empty()) return;
  size_t queued = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (announced_.size() > kMaxAnnounced) announced_.clear();
    for (uint64_t b = last + 1; b-- > first;) {
      std::string name = BlockStore::block_name(object, b);
      if (open_.count(name) != 0) continue;
      announced_.emplace(std::move(name), ++announce_sequence_);
      queue_.push_front({origin, object, b});
      ++queued;
      if (auto* trace = internal::CacheTrace::get()) trace->event("ahead", origin->name(), b);
    }
  }
  wake_downloaders(queued);
}

void BlockCache::Impl::prefetch_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    prefetch_wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (stopping_) return;
    PrefetchJob job = std::move(queue_.front());
    queue_.pop_front();
    if (announced_.count(BlockStore::block_name(job.object, job.block)) == 0) continue;
    lock.unlock();
    // A hint: a failed background download is retried by the read that needs the block.
    (void)acquire(*job.origin, job.object, job.block, Deadline::after(kPrefetchTimeout),
                  /*announced=*/true);
    lock.lock();
  }
}

}  // namespace zerowait
