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

void BlockCache::Impl::announce_range(const std::shared_ptr<ByteSource>& origin,
                                      const std::string& object, uint64_t offset,
                                      uint64_t length) {
  if (prefetchers_.empty() || length == 0 || 2 * length > options_.block_bytes ||
      range_bytes_announced_.load() + length > options_.range_download_bytes) {
    return;
  }
  const int64_t far_ns = int64_t(options_.range_download_after_ms) * 1000000;
  const int64_t quickest = quickest_round_trip_ns_.load();
  if (far_ns > 0 && (quickest == INT64_MAX || quickest < far_ns)) return;
  auto range = std::make_shared<internal::RangeDownload>();
  range->offset = offset;
  range->first_block = offset / options_.block_bytes;
  const uint64_t last_block = (offset + length - 1) / options_.block_bytes;
  for (uint64_t b = range->first_block; b <= last_block; ++b) {
    if (!holds(object, b)) range->blocks_missing |= 1u << (b - range->first_block);
  }
  if (range->blocks_missing == 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    static const std::vector<std::shared_ptr<internal::RangeDownload>> kNone;
    auto known = ranges_.find(object);
    const auto& of_object = known == ranges_.end() ? kNone : known->second;
    for (const auto& r : of_object) {
      if (r->covers(offset, length)) return;
    }
    // A batch's samples in one block, a few hundred kilobytes apart, are one request rather
    // than one each: at tens of milliseconds a request, their number would set the pace.
    for (const auto& r : of_object) {
      if (r->started || r->first_block != range->first_block) continue;
      const uint64_t begin = std::min(r->offset, offset);
      const uint64_t end = std::max(r->offset + r->bytes.size(), offset + length);
      const uint64_t growth = (end - begin) - r->bytes.size();
      if (2 * (end - begin) > options_.block_bytes ||
          range_bytes_announced_ + growth > options_.range_download_bytes) {
        continue;
      }
      range_bytes_announced_ += growth;
      r->offset = begin;
      r->bytes.resize(end - begin);  // not started: nothing is in it yet
      r->blocks_missing |= range->blocks_missing;
      return;
    }
    if (range_bytes_announced_ + length > options_.range_download_bytes) return;
    range_bytes_announced_ += length;
    range->bytes.resize(length);
    ranges_[object].push_back(range);
    range_objects_.store(ranges_.size());
    range_queue_.push_back({origin, object, range});
  }
  if (auto* trace = internal::CacheTrace::get()) trace->event("range", origin->name(), offset);
  wake_downloaders(1);
}

void BlockCache::Impl::download_range(const RangeJob& job) {
  internal::RangeDownload& range = *job.range;
  const Status got =
      job.origin->read_at(range.offset, range.bytes, Deadline::after(kPrefetchTimeout));
  if (auto* trace = internal::CacheTrace::get()) {
    trace->event("ranged", job.origin->name(), range.offset, got.is_ok() ? "" : "failed");
  }
  if (got.is_ok()) {
    counters_.ranges_downloaded.fetch_add(1);
    counters_.bytes_ranges.fetch_add(range.bytes.size());
  }
  bool blocks_may_go = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    blocks_may_go = --ranges_in_flight_ == 0 && !queue_.empty();
    range.done = true;
    range.failed = !got.is_ok();  // a hint: its readers go through the blocks
    // Nobody needs it any more when it failed or its blocks came first.
    if (range.failed || range.blocks_missing == 0) {
      erase_ranges(job.object, [&](const auto& r) { return r == job.range; });
    }
  }
  range_done_.notify_all();
  if (blocks_may_go) prefetch_wake_.notify_all();
}

void BlockCache::Impl::prefetch_loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    prefetch_wake_.wait(lock, [&] {
      return stopping_ || !range_queue_.empty() || (!queue_.empty() && ranges_in_flight_ == 0);
    });
    if (stopping_) return;
    if (!range_queue_.empty()) {
      RangeJob job = std::move(range_queue_.front());
      range_queue_.pop_front();
      job.range->started = true;
      ++ranges_in_flight_;
      lock.unlock();
      download_range(job);
      lock.lock();
      continue;
    }
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
