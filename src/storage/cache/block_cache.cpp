// The node-local cache's policy: finding, filling and keeping blocks, and what to evict. The
// files and the protocol between processes are block_store's; the background downloads are
// block_downloads.cpp's, the ByteSource over the cache cached_source.cpp's.
#include "zerowait/storage/block_cache.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/align.hpp"
#include "common/log.hpp"
#include "storage/cache/block_cache_impl.hpp"
#include "storage/cache/block_store.hpp"
#include "storage/cache/cache_trace.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {

using internal::BlockStore;
using internal::ByteLock;
using internal::File;
using internal::OpenBlock;

BlockCache::Impl::Impl(BlockCacheOptions options, std::unique_ptr<BlockStore> store)
    : options_(std::move(options)), store_(std::move(store)) {
  // One range request in flight per downloader: as many as prefetch_bytes holds in blocks.
  const uint64_t by_bytes = std::max<uint64_t>(1, options_.prefetch_bytes / options_.block_bytes);
  const unsigned downloaders =
      static_cast<unsigned>(std::min<uint64_t>(options_.prefetch_threads, by_bytes));
  for (unsigned i = 0; i < downloaders; ++i) {
    prefetchers_.emplace_back([this] { prefetch_loop(); });
  }
}

BlockCache::Impl::~Impl() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  prefetch_wake_.notify_all();
  for (std::thread& t : prefetchers_) t.join();
}

class BlockCache::Impl::FillClaim {
 public:
  FillClaim(Impl* impl, std::string name) : impl_(impl), name_(std::move(name)) {}
  ~FillClaim() {
    {
      std::lock_guard<std::mutex> lock(impl_->mutex_);
      impl_->filling_.erase(name_);
    }
    impl_->filled_.notify_all();
  }
  FillClaim(const FillClaim&) = delete;
  FillClaim& operator=(const FillClaim&) = delete;

 private:
  Impl* impl_;
  std::string name_;
};

Result<std::shared_ptr<const OpenBlock>> BlockCache::Impl::acquire(ByteSource& origin,
                                                                   const std::string& object,
                                                                   uint64_t block,
                                                                   Deadline deadline,
                                                                   bool announced) {
  Result<std::shared_ptr<const OpenBlock>> held =
      acquire_block(origin, object, block, deadline, announced);
  if (held.is_ok() && range_objects_.load() != 0) drop_ranges_held(object, block);
  return held;
}

Result<std::shared_ptr<const OpenBlock>> BlockCache::Impl::acquire_block(ByteSource& origin,
                                                                         const std::string& object,
                                                                         uint64_t block,
                                                                         Deadline deadline,
                                                                         bool announced) {
  const std::string name = BlockStore::block_name(object, block);
  const uint64_t length = block_length(origin.size(), block);
  if (!announced) forget_announcement(name);
  if (std::shared_ptr<const OpenBlock> open = find_open(name)) {
    if (!announced) count_hit(length);
    return open;
  }
  ZW_ASSIGN_OR_RETURN(std::shared_ptr<const OpenBlock> found,
                      open_checked(object, block, length, /*locked=*/false));
  if (found) {
    if (!announced) count_hit(length);
    return remember(name, std::move(found));
  }

  const uint64_t first_byte = block * options_.block_bytes;
  const std::string what = "block " + std::to_string(block) + " (bytes=" +
                           std::to_string(first_byte) + "-" +
                           std::to_string(first_byte + length - 1) + ") of '" + origin.name() +
                           "', which another thread or process is downloading";
  // A background fill leaves a block another thread is filling to it.
  ZW_ASSIGN_OR_RETURN(found, claim_fill(name, announced ? Deadline::after({}) : deadline, what));
  if (found) {
    if (!announced) counters_.waits.fetch_add(1);
    if (auto* trace = internal::CacheTrace::get()) trace->event("waited", origin.name(), block);
    return found;
  }
  FillClaim claim(this, name);
  ZW_ASSIGN_OR_RETURN(ByteLock lock, store_->lock_block(object, block, deadline, what));
  ZW_ASSIGN_OR_RETURN(found, open_checked(object, block, length, /*locked=*/true));
  if (found) {
    if (!announced) counters_.waits.fetch_add(1);
    return remember(name, std::move(found));
  }

  // Downloaded into this thread's buffer, kept from block to block: a fresh one per block
  // would cost its zero-fill and page faults every time, on the CPU a cold epoch is short of.
  thread_local std::vector<std::byte> download;
  if (download.size() < length) download.resize(length);
  const std::span<std::byte> bytes(download.data(), length);
  internal::CacheTrace* trace = internal::CacheTrace::get();
  if (trace) trace->event("get", origin.name(), block, announced ? "background" : "read");
  ZW_RETURN_IF_ERROR(origin.read_at(block * options_.block_bytes, bytes, deadline));
  if (trace) trace->event("got", origin.name(), block, announced ? "background" : "read");
  (announced ? counters_.prefetched : counters_.misses).fetch_add(1);
  counters_.bytes_downloaded.fetch_add(length);

  // What the file will take on disk, counted the way scans count it (allocated blocks of the
  // usual 4 KiB), so the ledger and a scan agree.
  const uint64_t disk_bytes = internal::align_up(length + internal::kBlockTrailerBytes, 4096);
  auto fresh = std::make_shared<OpenBlock>();
  Status stored = reserve(disk_bytes, deadline);
  if (stored.is_ok()) {
    Result<File> published = store_->publish_block(object, block, bytes);
    if (published.is_ok()) {
      fresh->file = std::move(published).value();
      remember_checked(checked_key(fresh->file));
    } else {
      stored = published.status();
      (void)store_->ledger_add(-static_cast<int64_t>(disk_bytes));
    }
  }
  if (!stored.is_ok()) {
    internal::note_fallback("cache_unwritable",
                            "the cache cannot store a block, so reads use the downloaded bytes "
                            "without keeping them: " +
                                stored.message());
    fresh->memory.assign(bytes.begin(), bytes.end());
  }
  return remember(name, std::move(fresh));
}

Result<bool> BlockCache::Impl::read_from_range(const std::string& object, uint64_t position,
                                               std::span<std::byte> dst, Deadline deadline) {
  if (range_objects_.load() == 0) return false;
  std::shared_ptr<internal::RangeDownload> range;
  {
    std::unique_lock<std::mutex> lock(mutex_);
    auto it = ranges_.find(object);
    if (it == ranges_.end()) return false;
    for (const auto& r : it->second) {
      if (r->covers(position, dst.size())) range = r;
    }
    if (range == nullptr) return false;
    const auto finished = [&] { return range->done; };
    if (deadline.at == Clock::time_point::max()) {
      range_done_.wait(lock, finished);
    } else if (!range_done_.wait_until(lock, deadline.at, finished)) {
      return Status(ErrorCode::kDeadlineExceeded,
                    "deadline passed while waiting for the download of bytes " +
                        std::to_string(range->offset) + "-" +
                        std::to_string(range->offset + range->bytes.size() - 1) + " of '" +
                        object + "'");
    }
    if (range->failed) return false;
  }
  // Filled before `done` was set, and never written again: read without the lock.
  std::memcpy(dst.data(), range->bytes.data() + (position - range->offset), dst.size());
  counters_.range_reads.fetch_add(1);
  return true;
}

void BlockCache::Impl::drop_ranges_held(const std::string& object, uint64_t block) {
  std::lock_guard<std::mutex> lock(mutex_);
  erase_ranges(object, [block](const std::shared_ptr<internal::RangeDownload>& r) {
    if (block < r->first_block || block - r->first_block >= 2) return false;
    r->blocks_missing &= ~(1u << (block - r->first_block));
    // One under way stays: a reader may be about to wait for it.
    return r->blocks_missing == 0 && r->done;
  });
}

bool BlockCache::Impl::holds(const std::string& object, uint64_t block) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (open_.count(BlockStore::block_name(object, block)) != 0) return true;
  }
  return ::access(store_->block_path(object, block).c_str(), F_OK) == 0;
}

Status BlockCache::Impl::trim(uint64_t headroom, uint64_t pending, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(ByteLock lock, store_->lock_eviction(deadline));
  ZW_ASSIGN_OR_RETURN(internal::BlockStoreScan scan, store_->scan());
  counters_.stale_temps_removed.fetch_add(scan.stale_temps_removed);
  ZW_ASSIGN_OR_RETURN(uint64_t free, store_->free_bytes());
  uint64_t usage = scan.bytes;
  const uint64_t usage_goal =
      options_.capacity_bytes > headroom ? options_.capacity_bytes - headroom : 0;
  const uint64_t free_goal = options_.min_free_bytes + headroom;
  if (usage > usage_goal || free < free_goal) {
    for (const internal::BlockFileEntry* victim : eviction_order(scan.blocks)) {
      if (usage <= usage_goal && free >= free_goal) break;
      if (!store_->remove(victim->path).is_ok()) continue;
      usage -= std::min(usage, victim->disk_bytes);
      free += victim->disk_bytes;
      counters_.evictions.fetch_add(1);
      counters_.bytes_evicted.fetch_add(victim->disk_bytes);
      std::lock_guard<std::mutex> guard(mutex_);
      close_open(victim->name);
    }
  }
  ZW_RETURN_IF_ERROR(store_->ledger_set(usage + pending));
  if (free < options_.min_free_bytes + pending) {
    return Status(ErrorCode::kResourceExhausted,
                  "the filesystem of cache '" + store_->directory() + "' has " +
                      std::to_string(free) + " bytes free, below the minimum of " +
                      std::to_string(options_.min_free_bytes) +
                      " even with nothing cached: free space there or lower min_free_bytes");
  }
  return Status::ok();
}

BlockCacheStats BlockCache::Impl::stats() const {
  BlockCacheStats s;
  s.hits = counters_.hits;
  s.misses = counters_.misses;
  s.waits = counters_.waits;
  s.evictions = counters_.evictions;
  s.damaged = counters_.damaged;
  s.stale_temps_removed = counters_.stale_temps_removed;
  s.prefetched = counters_.prefetched;
  s.ranges_downloaded = counters_.ranges_downloaded;
  s.bytes_ranges = counters_.bytes_ranges;
  s.range_reads = counters_.range_reads;
  s.bytes_hit = counters_.bytes_hit;
  s.bytes_downloaded = counters_.bytes_downloaded;
  s.bytes_evicted = counters_.bytes_evicted;
  Result<uint64_t> usage = store_->ledger();
  s.usage_bytes = usage.is_ok() ? usage.value() : 0;
  s.capacity_bytes = options_.capacity_bytes;
  return s;
}

Result<std::shared_ptr<const OpenBlock>> BlockCache::Impl::claim_fill(const std::string& name,
                                                                      Deadline deadline,
                                                                      const std::string& what) {
  std::unique_lock<std::mutex> lock(mutex_);
  bool waited = false;
  while (filling_.count(name) != 0) {
    waited = true;
    if (deadline.at == Clock::time_point::max()) {
      filled_.wait(lock);
    } else if (filled_.wait_until(lock, deadline.at) == std::cv_status::timeout &&
               filling_.count(name) != 0) {
      return Status(ErrorCode::kDeadlineExceeded, "deadline passed while waiting for " + what);
    }
  }
  if (waited) {
    auto it = open_.find(name);
    if (it != open_.end()) return it->second.block;
  }
  filling_.insert(name);
  return std::shared_ptr<const OpenBlock>();
}

Result<std::shared_ptr<const OpenBlock>> BlockCache::Impl::open_checked(const std::string& object,
                                                                        uint64_t block,
                                                                        uint64_t length,
                                                                        bool locked) {
  Result<File> file = store_->open_block(object, block);
  if (!file.is_ok()) {
    if (file.status().code() == ErrorCode::kNotFound) return std::shared_ptr<const OpenBlock>();
    return file.status();
  }
  const std::string key = checked_key(file.value());
  if (!is_checked(key)) {
    Status intact = BlockStore::check_block(file.value(), length);
    if (intact.code() == ErrorCode::kCorrupt) {
      if (!locked) return std::shared_ptr<const OpenBlock>();
      counters_.damaged.fetch_add(1);
      internal::note_fallback("cache_damaged_block", intact.message() + "; downloading it again");
      ZW_RETURN_IF_ERROR(store_->remove(file.value().path()));
      return std::shared_ptr<const OpenBlock>();
    }
    ZW_RETURN_IF_ERROR(intact);
    remember_checked(key);
  }
  // Its time of last use, which orders eviction for every process.
  ::futimens(file.value().fd(), nullptr);
  auto open = std::make_shared<OpenBlock>();
  open->file = std::move(file).value();
  return std::shared_ptr<const OpenBlock>(std::move(open));
}

std::string BlockCache::Impl::checked_key(const File& file) {
  struct stat st{};
  ::fstat(file.fd(), &st);
  return file.path() + "#" + std::to_string(st.st_ino);
}

bool BlockCache::Impl::is_checked(const std::string& key) {
  std::lock_guard<std::mutex> lock(mutex_);
  return checked_.count(key) != 0;
}

void BlockCache::Impl::remember_checked(std::string key) {
  std::lock_guard<std::mutex> lock(mutex_);
  checked_.insert(std::move(key));
}

std::shared_ptr<const OpenBlock> BlockCache::Impl::find_open(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(name);
  if (it == open_.end()) return nullptr;
  recently_opened_.splice(recently_opened_.begin(), recently_opened_, it->second.place);
  return it->second.block;
}

std::shared_ptr<const OpenBlock> BlockCache::Impl::remember(
    const std::string& name, std::shared_ptr<const OpenBlock> block) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = open_.find(name);
  if (it != open_.end()) return it->second.block;  // another thread was first
  recently_opened_.push_front(name);
  open_.emplace(name, OpenEntry{block, recently_opened_.begin()});
  while (open_.size() > std::max<size_t>(options_.open_blocks, 1)) {
    close_open(recently_opened_.back());
  }
  return block;
}

void BlockCache::Impl::close_open(const std::string& name) {
  auto it = open_.find(name);
  if (it == open_.end()) return;
  recently_opened_.erase(it->second.place);
  open_.erase(it);
}

void BlockCache::Impl::forget_announcement(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  announced_.erase(name);
}

std::vector<const internal::BlockFileEntry*> BlockCache::Impl::eviction_order(
    const std::vector<internal::BlockFileEntry>& blocks) {
  std::vector<std::pair<uint64_t, const internal::BlockFileEntry*>> announced;
  std::vector<const internal::BlockFileEntry*> order;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const internal::BlockFileEntry& e : blocks) {
      auto it = announced_.find(e.name);
      if (it == announced_.end()) {
        order.push_back(&e);
      } else {
        announced.emplace_back(it->second, &e);
      }
    }
  }
  // Files used within one tick of the filesystem's clock tie; their names break the tie, which
  // within an object is block order.
  std::sort(order.begin(), order.end(), [](const auto* a, const auto* b) {
    return std::tie(a->mtime_ns, a->name) < std::tie(b->mtime_ns, b->name);
  });
  std::sort(announced.begin(), announced.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [sequence, entry] : announced) order.push_back(entry);
  return order;
}

Status BlockCache::Impl::reserve(uint64_t bytes, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(uint64_t usage, store_->ledger_add(static_cast<int64_t>(bytes)));
  ZW_ASSIGN_OR_RETURN(uint64_t free, store_->free_bytes());
  if (usage <= options_.capacity_bytes && free >= options_.min_free_bytes + bytes) {
    return Status::ok();
  }
  const uint64_t headroom = std::max(bytes, options_.capacity_bytes / 10);
  Status trimmed = trim(headroom, bytes, deadline);
  if (!trimmed.is_ok()) (void)store_->ledger_add(-static_cast<int64_t>(bytes));
  return trimmed;
}

Result<std::shared_ptr<BlockCache>> BlockCache::open(BlockCacheOptions options) {
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<BlockStore> store,
                      BlockStore::open(options.directory, options.block_bytes));
  if (options.capacity_bytes == 0) {
    ZW_ASSIGN_OR_RETURN(uint64_t free, store->free_bytes());
    options.capacity_bytes = free / 2;
  }
  auto impl = std::make_shared<Impl>(std::move(options), std::move(store));
  // Measure what a previous process left (its ledger may be off if it died) and fit the cap.
  // A filesystem already below min_free_bytes is not an error here: fills then keep their
  // blocks in memory only, and say so.
  Status measured = impl->trim(0, 0, Deadline::after(std::chrono::seconds(60)));
  if (!measured.is_ok() && measured.code() != ErrorCode::kResourceExhausted) return measured;
  return std::shared_ptr<BlockCache>(new BlockCache(std::move(impl)));
}

BlockCache::BlockCache(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}
BlockCache::~BlockCache() = default;

BlockCacheStats BlockCache::stats() const { return impl_->stats(); }
const BlockCacheOptions& BlockCache::options() const { return impl_->options(); }

Status BlockCache::trim(uint64_t headroom_bytes, Deadline deadline) {
  return impl_->trim(headroom_bytes, 0, deadline);
}

}  // namespace zerowait
