// The ByteSource that reads an origin through the node-local cache, block by block: reads, the
// metadata reads that skip whole blocks, and the hints that feed the downloaders.
#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "storage/cache/block_cache_impl.hpp"
#include "storage/cache/cache_trace.hpp"
#include "storage/local/file_sources.hpp"

namespace zerowait {

using internal::OpenBlock;

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
        const std::span<std::byte> part = r.dst.subspan(done, n);
        ZW_ASSIGN_OR_RETURN(const bool from_range,
                            cache_->read_from_range(object_, position, part, deadline));
        if (!from_range) {
          ZW_ASSIGN_OR_RETURN(std::shared_ptr<const OpenBlock> open,
                              cache_->acquire(*origin_, object_, block, deadline, false));
          ZW_RETURN_IF_ERROR(open->read(in_block, part));
        }
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
    internal::CacheTrace* trace = internal::CacheTrace::get();
    if (trace) trace->event("metadata", name(), requests.size());
    const auto started = std::chrono::steady_clock::now();
    std::vector<Status> results(requests.size(), Status::ok());
    std::vector<std::thread> others;
    for (size_t i = 1; i < requests.size(); ++i) {
      others.emplace_back([&, i] { results[i] = origin_->read(requests.subspan(i, 1), deadline); });
    }
    if (!requests.empty()) results[0] = origin_->read(requests.first(1), deadline);
    for (std::thread& t : others) t.join();
    if (trace) trace->event("metadata-done", name(), requests.size());
    for (const Status& status : results) ZW_RETURN_IF_ERROR(status);
    cache_->note_round_trip(std::chrono::steady_clock::now() - started);
    return Status::ok();
  }

  void prefetch(uint64_t offset, uint64_t length) override {
    if (length == 0 || offset >= size()) return;
    const uint64_t last = std::min(size() - 1, offset + length - 1);
    cache_->announce_range(origin_, object_, offset, last + 1 - offset);
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

std::shared_ptr<ByteSource> BlockCache::wrap(std::shared_ptr<ByteSource> origin) {
  return std::make_shared<CachedSource>(impl_, std::move(origin));
}

}  // namespace zerowait
