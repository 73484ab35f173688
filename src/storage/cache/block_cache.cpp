// The node-local cache's policy: which block a read needs, when to download it, what to evict.
// The files and the protocol between processes are block_store's.
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
#include "storage/cache/block_store.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {

using internal::BlockStore;
using internal::ByteLock;
using internal::File;

namespace {

// Background downloads of announced blocks get this long each; it also bounds how long
// destroying the cache waits for one in flight.
constexpr auto kPrefetchTimeout = std::chrono::seconds(10);
// Announcements remembered at most; past it they are forgotten (they are hints).
constexpr size_t kMaxAnnounced = 1 << 20;
constexpr size_t kMaxQueuedPrefetches = 1024;

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

struct Counters {
  std::atomic<uint64_t> hits{0}, misses{0}, waits{0}, evictions{0}, damaged{0},
      stale_temps_removed{0}, prefetched{0}, bytes_hit{0}, bytes_downloaded{0}, bytes_evicted{0};
};

}  // namespace

class BlockCache::Impl {
 public:
  Impl(BlockCacheOptions options, std::unique_ptr<BlockStore> store)
      : options_(std::move(options)), store_(std::move(store)) {
    // One range request in flight per downloader: as many as prefetch_bytes holds in blocks.
    const uint64_t by_bytes = std::max<uint64_t>(1, options_.prefetch_bytes / options_.block_bytes);
    const unsigned downloaders =
        static_cast<unsigned>(std::min<uint64_t>(options_.prefetch_threads, by_bytes));
    for (unsigned i = 0; i < downloaders; ++i) {
      prefetchers_.emplace_back([this] { prefetch_loop(); });
    }
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    prefetch_wake_.notify_all();
    for (std::thread& t : prefetchers_) t.join();
  }

  const BlockCacheOptions& options() const { return options_; }

  uint64_t block_length(uint64_t object_size, uint64_t block) const {
    return std::min(options_.block_bytes, object_size - block * options_.block_bytes);
  }

  // Block `block` of `origin` (object id `object`): from this process's open blocks, from disk,
  // or downloaded, once per block across threads and processes. `announced`: a background fill
  // of an announced block (counted as prefetched, not as a hit or miss).
  Result<std::shared_ptr<const OpenBlock>> acquire(ByteSource& origin, const std::string& object,
                                                   uint64_t block, Deadline deadline,
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

    const std::string what = "block " + std::to_string(block) + " of '" + origin.name() +
                             "', which another thread or process is downloading";
    // A background fill leaves a block another thread is filling to it.
    ZW_ASSIGN_OR_RETURN(found, claim_fill(name, announced ? Deadline::after({}) : deadline, what));
    if (found) {
      if (!announced) counters_.waits.fetch_add(1);
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
    ZW_RETURN_IF_ERROR(origin.read_at(block * options_.block_bytes, bytes, deadline));
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

  // Marks blocks [first, last] of `origin` as needed soon, in this order, and queues their
  // download.
  void announce(const std::shared_ptr<ByteSource>& origin, const std::string& object,
                uint64_t first, uint64_t last) {
    size_t queued = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (announced_.size() > kMaxAnnounced) announced_.clear();
      for (uint64_t b = first; b <= last; ++b) {
        const std::string name = BlockStore::block_name(object, b);
        if (!announced_.emplace(name, ++announce_sequence_).second) continue;
        // A block this process holds open needs no downloader (a warm epoch's, mostly).
        if (!prefetchers_.empty() && queue_.size() < kMaxQueuedPrefetches &&
            open_.count(name) == 0) {
          queue_.push_back({origin, object, b});
          ++queued;
        }
      }
    }
    wake_downloaders(queued);
  }

  // Blocks [first, last] of `origin` are needed now by a read that will take them in this
  // order: those this process does not hold open go to the front of the downloaders' queue, so
  // that they are fetched in parallel while the read takes the ones before them. A no-op without
  // downloaders; a warm read (its blocks open) wakes nobody.
  void fetch_ahead(const std::shared_ptr<ByteSource>& origin, const std::string& object,
                   uint64_t first, uint64_t last) {
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
      }
    }
    wake_downloaders(queued);
  }

  // Whether block `block` of `object` is open in this process or has a file on disk (not
  // checked here: a read checks it).
  bool holds(const std::string& object, uint64_t block) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (open_.count(BlockStore::block_name(object, block)) != 0) return true;
    }
    return ::access(store_->block_path(object, block).c_str(), F_OK) == 0;
  }

  Status trim(uint64_t headroom, uint64_t pending, Deadline deadline) {
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

  BlockCacheStats stats() const {
    BlockCacheStats s;
    s.hits = counters_.hits;
    s.misses = counters_.misses;
    s.waits = counters_.waits;
    s.evictions = counters_.evictions;
    s.damaged = counters_.damaged;
    s.stale_temps_removed = counters_.stale_temps_removed;
    s.prefetched = counters_.prefetched;
    s.bytes_hit = counters_.bytes_hit;
    s.bytes_downloaded = counters_.bytes_downloaded;
    s.bytes_evicted = counters_.bytes_evicted;
    Result<uint64_t> usage = store_->ledger();
    s.usage_bytes = usage.is_ok() ? usage.value() : 0;
    s.capacity_bytes = options_.capacity_bytes;
    return s;
  }

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

  // Waits while another thread of this process fills block `name` (woken when it is done: the
  // block's file lock could only be polled, which adds up to a poll interval to every wait).
  // Returns the block that thread opened, or nullptr when this thread is now the block's filler
  // (a FillClaim must end the claim); kDeadlineExceeded names `what` at the deadline.
  Result<std::shared_ptr<const OpenBlock>> claim_fill(const std::string& name, Deadline deadline,
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

  // Ends a claim of claim_fill() when destroyed, whatever the fill's outcome, and wakes the
  // threads waiting for it.
  class FillClaim {
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

  void count_hit(uint64_t length) {
    counters_.hits.fetch_add(1);
    counters_.bytes_hit.fetch_add(length);
  }

  // The block's file if it is on disk and intact (checked once per process and file); nullptr
  // when it is not there. A damaged file is removed when `locked` (this thread holds the
  // block's lock, so nobody is publishing it meanwhile) and otherwise left for the lock holder.
  Result<std::shared_ptr<const OpenBlock>> open_checked(const std::string& object, uint64_t block,
                                                        uint64_t length, bool locked) {
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

  // A file is known intact by its path and inode: a block evicted and filled again is a new
  // inode and is checked again.
  static std::string checked_key(const File& file) {
    struct stat st {};
    ::fstat(file.fd(), &st);
    return file.path() + "#" + std::to_string(st.st_ino);
  }
  bool is_checked(const std::string& key) {
    std::lock_guard<std::mutex> lock(mutex_);
    return checked_.count(key) != 0;
  }
  void remember_checked(std::string key) {
    std::lock_guard<std::mutex> lock(mutex_);
    checked_.insert(std::move(key));
  }

  std::shared_ptr<const OpenBlock> find_open(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = open_.find(name);
    if (it == open_.end()) return nullptr;
    recently_opened_.splice(recently_opened_.begin(), recently_opened_, it->second.place);
    return it->second.block;
  }

  std::shared_ptr<const OpenBlock> remember(const std::string& name,
                                            std::shared_ptr<const OpenBlock> block) {
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

  // Locked by the caller.
  void close_open(const std::string& name) {
    auto it = open_.find(name);
    if (it == open_.end()) return;
    recently_opened_.erase(it->second.place);
    open_.erase(it);
  }

  void forget_announcement(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    announced_.erase(name);
  }

  // Blocks nobody announced, least recently used first; then announced ones, the one needed
  // furthest ahead first.
  std::vector<const internal::BlockFileEntry*> eviction_order(
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

  // Records `bytes` about to be written in the shared ledger, evicting first when they would not
  // fit. The headroom evicted beyond the need (a tenth of the cap) spares an eviction per fill.
  Status reserve(uint64_t bytes, Deadline deadline) {
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

  void prefetch_loop() {
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

  struct OpenEntry {
    std::shared_ptr<const OpenBlock> block;
    std::list<std::string>::iterator place;
  };

  const BlockCacheOptions options_;
  const std::unique_ptr<BlockStore> store_;
  Counters counters_;

  std::mutex mutex_;  // guards everything below
  std::unordered_map<std::string, OpenEntry> open_;
  std::list<std::string> recently_opened_;  // open_'s names, most recent first
  std::unordered_set<std::string> checked_;
  std::unordered_map<std::string, uint64_t> announced_;  // block name -> announcement order
  uint64_t announce_sequence_ = 0;
  std::deque<PrefetchJob> queue_;
  std::condition_variable prefetch_wake_;
  std::unordered_set<std::string> filling_;  // blocks a thread of this process is filling
  std::condition_variable filled_;           // a fill of filling_ ended
  bool stopping_ = false;
  std::vector<std::thread> prefetchers_;
};

namespace {

// Reads `origin` block by block through the cache.
class CachedSource final : public ByteSource {
 public:
  CachedSource(std::shared_ptr<BlockCache::Impl> cache, std::shared_ptr<ByteSource> origin)
      : cache_(std::move(cache)),
        origin_(std::move(origin)),
        object_(internal::cache_object_id(origin_->name(), origin_->size(), origin_->version())),
        block_bytes_(cache_->options().block_bytes) {}

  const std::string& name() const override { return origin_->name(); }
  uint64_t size() const override { return origin_->size(); }
  std::string version() const override { return origin_->version(); }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    fetch_ahead(requests);
    for (const ReadRequest& r : requests) {
      ZW_RETURN_IF_ERROR(internal::check_range(name(), size(), r));
      size_t done = 0;
      while (done < r.dst.size()) {
        const uint64_t position = r.offset + done;
        const uint64_t block = position / block_bytes_;
        const uint64_t in_block = position - block * block_bytes_;
        const size_t n = static_cast<size_t>(std::min<uint64_t>(
            r.dst.size() - done, cache_->block_length(size(), block) - in_block));
        ZW_ASSIGN_OR_RETURN(std::shared_ptr<const OpenBlock> open,
                            cache_->acquire(*origin_, object_, block, deadline, false));
        ZW_RETURN_IF_ERROR(open->read(in_block, r.dst.subspan(done, n)));
        done += n;
      }
    }
    return Status::ok();
  }

  // Through the blocks when the cache holds them all (a warm cache makes no request); else each
  // range with a request of its own, all at once, and not kept: the shard reader keeps what it
  // parsed, and the blocks stay for the data reads that need them.
  Status read_metadata(std::span<const ReadRequest> requests, Deadline deadline) override {
    bool held = true;
    for (const ReadRequest& r : requests) {
      if (r.dst.empty() || r.offset >= size() || r.dst.size() > size() - r.offset) continue;
      const uint64_t last = (r.offset + r.dst.size() - 1) / block_bytes_;
      for (uint64_t b = r.offset / block_bytes_; held && b <= last; ++b) {
        held = cache_->holds(object_, b);
      }
    }
    if (held) return read(requests, deadline);
    std::vector<Status> results(requests.size(), Status::ok());
    std::vector<std::thread> others;
    for (size_t i = 1; i < requests.size(); ++i) {
      others.emplace_back([&, i] { results[i] = origin_->read(requests.subspan(i, 1), deadline); });
    }
    if (!requests.empty()) results[0] = origin_->read(requests.first(1), deadline);
    for (std::thread& t : others) t.join();
    for (const Status& status : results) ZW_RETURN_IF_ERROR(status);
    return Status::ok();
  }

  void prefetch(uint64_t offset, uint64_t length) override {
    if (length == 0 || offset >= size()) return;
    const uint64_t last = std::min(size() - 1, offset + length - 1);
    cache_->announce(origin_, object_, offset / block_bytes_, last / block_bytes_);
  }

 private:
  // The blocks a read needs after its first one are downloaded meanwhile, in the read's order:
  // those of a request over several blocks, and those of other requests (a shard's header and
  // its footer, at both ends of the object, cost one round trip instead of two).
  void fetch_ahead(std::span<const ReadRequest> requests) {
    // Empty requests need nothing; out-of-range ones fail in read().
    auto reads_bytes = [this](const ReadRequest& r) {
      return !r.dst.empty() && r.offset < size() && r.dst.size() <= size() - r.offset;
    };
    auto opening = std::find_if(requests.begin(), requests.end(), reads_bytes);
    if (opening == requests.end()) return;
    const uint64_t read_first = opening->offset / block_bytes_;  // the block the read starts with
    // Backwards, since each range goes to the front of the downloaders' queue.
    for (size_t i = requests.size(); i-- > 0;) {
      const ReadRequest& r = requests[i];
      if (!reads_bytes(r)) continue;
      uint64_t first = r.offset / block_bytes_;
      const uint64_t last = (r.offset + r.dst.size() - 1) / block_bytes_;
      if (first == read_first) ++first;
      if (first <= last) cache_->fetch_ahead(origin_, object_, first, last);
    }
  }

  std::shared_ptr<BlockCache::Impl> cache_;
  std::shared_ptr<ByteSource> origin_;
  std::string object_;
  uint64_t block_bytes_;
};

}  // namespace

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

std::shared_ptr<ByteSource> BlockCache::wrap(std::shared_ptr<ByteSource> origin) {
  return std::make_shared<CachedSource>(impl_, std::move(origin));
}

BlockCacheStats BlockCache::stats() const { return impl_->stats(); }
const BlockCacheOptions& BlockCache::options() const { return impl_->options(); }

Status BlockCache::trim(uint64_t headroom_bytes, Deadline deadline) {
  return impl_->trim(headroom_bytes, 0, deadline);
}

}  // namespace zerowait
