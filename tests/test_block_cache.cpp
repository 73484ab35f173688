// The node-local cache against a real HTTP server on 127.0.0.1 (tests/testing/http_server),
// which counts every GET: one download per block across threads and processes, the cap, damaged
// and killed fills, deadlines while waiting for another filler, eviction order, a full disk.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/log.hpp"
#include "storage/http/http_client.hpp"
#include "storage/http/http_source.hpp"
#include "testing/child_processes.hpp"
#include "testing/http_server.hpp"
#include "testing/image_dataset.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/block_cache.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/writer.hpp"

namespace zerowait {
namespace {

using namespace std::chrono_literals;
using testing::ChildProcesses;
using testing::TempDir;
using testing::TestHttpServer;
namespace fs = std::filesystem;

constexpr uint64_t kBlock = 64 << 10;

// An object of 10.5 blocks served at /obj, and a cache directory.
class BlockCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    object_ = testing::random_bytes(10 * kBlock + kBlock / 2, 7);
    server_.put("/obj", object_);
  }

  BlockCacheOptions cache_options() const {
    BlockCacheOptions o;
    o.directory = dir_ / "cache";
    o.capacity_bytes = 64 << 20;
    o.min_free_bytes = 0;
    o.block_bytes = kBlock;
    o.prefetch_threads = 0;
    return o;
  }

  std::shared_ptr<BlockCache> open_cache(BlockCacheOptions options) {
    auto cache = BlockCache::open(std::move(options));
    EXPECT_TRUE(cache.is_ok()) << cache.status().to_string();
    return cache.is_ok() ? *cache : nullptr;
  }
  std::shared_ptr<BlockCache> open_cache() { return open_cache(cache_options()); }

  // The object over HTTP through a client of its own (a forked child must not share the
  // parent's connections), read through `cache`.
  std::shared_ptr<ByteSource> cached_object(BlockCache& cache) {
    auto origin = internal::open_http_source(std::make_shared<internal::HttpClient>(),
                                             server_.url("/obj"), Deadline::after(10s));
    EXPECT_TRUE(origin.is_ok()) << origin.status().to_string();
    return cache.wrap(std::move(origin).value());
  }

  std::string read(ByteSource& source, uint64_t offset, size_t length, Deadline d = {}) {
    std::string out(length, '\0');
    Status s = source.read_at(offset, std::as_writable_bytes(std::span(out)), d);
    EXPECT_TRUE(s.is_ok()) << s.to_string();
    return out;
  }

  // GETs the server answered, by Range header.
  std::map<std::string, int> gets() const {
    std::map<std::string, int> by_range;
    for (const std::string& line : server_.log()) {
      if (line.starts_with("GET /obj ")) ++by_range[line.substr(9)];
    }
    return by_range;
  }

  // A loader of the "jpg" field over the dataset served at /ds/, read through a cache opened
  // with `o`; null (a test failure recorded) when it cannot be made.
  std::unique_ptr<Loader> remote_jpg_loader(const BlockCacheOptions& o, LoaderOptions options) {
    DatasetOptions dataset_options;
    dataset_options.cache = open_cache(o);
    auto remote = Dataset::open(server_.url("/ds/"), dataset_options);
    EXPECT_TRUE(remote.is_ok()) << remote.status().to_string();
    if (!remote.is_ok()) return nullptr;
    options.fields = {"jpg"};
    auto loader = Loader::create(*remote, options);
    EXPECT_TRUE(loader.is_ok()) << loader.status().to_string();
    return loader.is_ok() ? std::move(loader).value() : nullptr;
  }

  // Checks every sample of `batch` against the local copy of the dataset in dir_/ds; returns
  // how many the batch had.
  int64_t expect_local_jpgs(const Batch& batch) {
    auto local = Dataset::open(dir_ / "ds");
    EXPECT_TRUE(local.is_ok()) << local.status().to_string();
    const BatchColumn* index = batch.column("__index__");
    const BatchColumn* jpg = batch.column("jpg");
    const BatchColumn* offsets = batch.column("jpg.offsets");
    EXPECT_TRUE(index != nullptr && jpg != nullptr && offsets != nullptr);
    if (!local.is_ok() || index == nullptr || jpg == nullptr || offsets == nullptr) return 0;
    const int64_t* at = reinterpret_cast<const int64_t*>(offsets->data);
    for (int64_t i = 0; i < index->shape[0]; ++i) {
      const int64_t global = reinterpret_cast<const int64_t*>(index->data)[i];
      auto expected = (*local)->read(static_cast<uint64_t>(global));
      EXPECT_TRUE(expected.is_ok()) << expected.status().to_string();
      const FieldView* field = expected.is_ok() ? expected->view.field("jpg") : nullptr;
      EXPECT_NE(field, nullptr) << "sample " << global;
      if (field == nullptr) continue;
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(jpg->data) + at[i],
                            static_cast<size_t>(at[i + 1] - at[i])),
                testing::to_string(field->bytes))
          << "sample " << global;
    }
    return index->shape[0];
  }

  uint64_t files_in(const std::string& dir) const {
    uint64_t n = 0;
    for (const auto& e : fs::recursive_directory_iterator(dir)) n += e.is_regular_file();
    return n;
  }
  uint64_t block_files() const { return files_in(dir_ / "cache/blocks"); }
  std::vector<std::string> block_paths() const {
    std::vector<std::string> paths;
    for (const auto& e : fs::recursive_directory_iterator(dir_ / "cache/blocks")) {
      if (e.is_regular_file()) paths.push_back(e.path().string());
    }
    std::sort(paths.begin(), paths.end());
    return paths;
  }
  uint64_t disk_bytes() const {
    uint64_t n = 0;
    for (const std::string& p : block_paths()) {
      struct stat st {};
      ::stat(p.c_str(), &st);
      n += static_cast<uint64_t>(st.st_blocks) * 512;
    }
    return n;
  }

  TempDir dir_;
  TestHttpServer server_;
  std::string object_;
};

TEST_F(BlockCacheTest, ReadsEqualTheOriginAndEachBlockIsDownloadedOnce) {
  auto cache = open_cache();
  ASSERT_NE(cache, nullptr);
  auto source = cached_object(*cache);
  // Four threads read ranges that start anywhere and cross block boundaries.
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 50; ++i) {
        const uint64_t offset = (static_cast<uint64_t>(t) * 7919 + i * 104729) % object_.size();
        const size_t length = std::min<uint64_t>(kBlock + 1000, object_.size() - offset);
        if (read(*source, offset, length) != object_.substr(offset, length)) ++mismatches;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(mismatches, 0);
  EXPECT_EQ(read(*source, 0, object_.size()), object_);

  const auto by_range = gets();
  EXPECT_EQ(by_range.size(), 11u);  // every block, each once
  for (const auto& [range, count] : by_range) EXPECT_EQ(count, 1) << range;
  EXPECT_TRUE(by_range.count("bytes=655360-688127"));  // the short last block
  const BlockCacheStats s = cache->stats();
  EXPECT_EQ(s.misses, 11u);
  EXPECT_EQ(s.bytes_downloaded, object_.size());
  EXPECT_GT(s.hits, 100u);
  EXPECT_EQ(s.usage_bytes, disk_bytes());
  EXPECT_EQ(block_files(), 11u);
  EXPECT_EQ(files_in(dir_ / "cache/tmp"), 0u);
}

TEST_F(BlockCacheTest, TwoProcessesSharingTheDirectoryDownloadEachBlockOnce) {
  // The first process's download of block 0 is held by the server for 3 s, and the second
  // process starts only once that download is under way (the server has read its GET): the
  // second must then wait for the first's block instead of downloading it, which its `waits`
  // counter shows. Run one after the other, the second would find block 0 on disk (waits 0).
  server_.fail_next({}, 1);                 // the first process's HEAD
  server_.fail_next({.stall = 3000ms}, 1);  // its GET of block 0
  // Each child reads every block in order and leaves its counters in a file: "misses waits".
  // The second waits for the file "go" the test makes once the first's GET is in.
  auto reader = [&](const std::string& name) {
    return [&, name] {
      if (name == "second" && !testing::wait_for_file(dir_ / "go", 30s)) return 4;
      auto cache = BlockCache::open(cache_options());
      if (!cache.is_ok()) return 2;
      auto source = cached_object(**cache);
      for (uint64_t block = 0; block < 11; ++block) {
        const uint64_t offset = block * kBlock;
        const size_t length = std::min<uint64_t>(kBlock, object_.size() - offset);
        std::string got(length, '\0');
        if (!source->read_at(offset, std::as_writable_bytes(std::span(got)), Deadline::after(30s))
                 .is_ok() ||
            got != object_.substr(offset, length)) {
          return 1;
        }
      }
      const BlockCacheStats s = (*cache)->stats();
      testing::write_file(dir_ / name, std::to_string(s.misses) + " " + std::to_string(s.waits));
      return 0;
    };
  };
  ChildProcesses children;
  const pid_t first_pid = children.add(reader("first"));
  const pid_t second_pid = children.add(reader("second"));
  children.start();
  const auto give_up = std::chrono::steady_clock::now() + 30s;
  while (server_.requests() < 2 && std::chrono::steady_clock::now() < give_up) {
    std::this_thread::sleep_for(5ms);
  }
  EXPECT_EQ(server_.requests(), 2u) << "the first process's HEAD and GET of block 0";
  testing::write_file(dir_ / "go", "");
  EXPECT_EQ(children.wait(first_pid), 0);
  EXPECT_EQ(children.wait(second_pid), 0);
  const auto by_range = gets();
  EXPECT_EQ(by_range.size(), 11u);
  for (const auto& [range, count] : by_range) EXPECT_EQ(count, 1) << range;
  auto counters = [&](const std::string& name) {
    std::istringstream in(testing::read_file(dir_ / name));
    uint64_t misses = 0, waits = 0;
    in >> misses >> waits;
    return std::pair{misses, waits};
  };
  const auto [first_misses, first_waits] = counters("first");
  const auto [second_misses, second_waits] = counters("second");
  EXPECT_GE(first_misses, 1u);  // block 0 at least
  EXPECT_EQ(first_misses + second_misses, 11u);
  EXPECT_GE(second_waits, 1u) << "the second process did not wait for the first's block 0";

  // A third process finds everything: no download at all.
  auto cache = open_cache();
  auto source = cached_object(*cache);
  EXPECT_EQ(read(*source, 0, object_.size()), object_);
  EXPECT_EQ(cache->stats().misses, 0u);
  EXPECT_EQ(cache->stats().hits, 11u);
}

TEST_F(BlockCacheTest, StaysUnderItsCapAndEvictsTheLeastRecentlyUsed) {
  BlockCacheOptions o = cache_options();
  o.capacity_bytes = 4 * (kBlock + 4096);  // four blocks on disk, with their trailers
  o.open_blocks = 1;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  for (int pass = 0; pass < 2; ++pass) {
    for (uint64_t b = 0; b < 11; ++b) {
      const uint64_t offset = b * kBlock;
      const size_t length = std::min<uint64_t>(kBlock, object_.size() - offset);
      EXPECT_EQ(read(*source, offset, length), object_.substr(offset, length));
      EXPECT_LE(disk_bytes(), o.capacity_bytes) << "after block " << b;
    }
  }
  const BlockCacheStats s = cache->stats();
  EXPECT_GT(s.evictions, 14u);
  EXPECT_EQ(s.misses, 22u);  // a cap of four blocks cannot keep a sequential pass of eleven
  EXPECT_LE(s.usage_bytes, o.capacity_bytes);
  EXPECT_EQ(s.usage_bytes, disk_bytes());
  // The newest blocks are the ones kept.
  const auto kept = block_paths();
  ASSERT_FALSE(kept.empty());
  for (const std::string& p : kept) {
    const std::string block = p.substr(p.rfind('-') + 1, 10);
    EXPECT_GE(std::stoull(block, nullptr, 16), 7u) << p;
  }
}

TEST_F(BlockCacheTest, AnnouncedBlocksAreEvictedLastTheFurthestAheadFirst) {
  BlockCacheOptions o = cache_options();
  o.capacity_bytes = 5 * (kBlock + 4096);
  o.open_blocks = 1;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  for (uint64_t b = 0; b < 5; ++b) read(*source, b * kBlock, 1);
  // The plan says: block 1 next, then block 0. Blocks 2-4 are not needed.
  source->prefetch(1 * kBlock, 1);
  source->prefetch(0 * kBlock, 1);
  for (uint64_t b = 5; b < 8; ++b) read(*source, b * kBlock, 1);
  std::vector<uint64_t> kept;
  for (const std::string& p : block_paths()) {
    kept.push_back(std::stoull(p.substr(p.rfind('-') + 1, 10), nullptr, 16));
  }
  // Blocks 2, 3, 4 (not announced, least recently used) went first; 0 and 1 stayed.
  EXPECT_TRUE(std::count(kept.begin(), kept.end(), 0u)) << ::testing::PrintToString(kept);
  EXPECT_TRUE(std::count(kept.begin(), kept.end(), 1u)) << ::testing::PrintToString(kept);
  EXPECT_FALSE(std::count(kept.begin(), kept.end(), 2u)) << ::testing::PrintToString(kept);
  EXPECT_TRUE(std::count(kept.begin(), kept.end(), 7u)) << ::testing::PrintToString(kept);
}

TEST_F(BlockCacheTest, AnnouncedBlocksAreDownloadedInTheBackground) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 2;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  source->prefetch(0, object_.size());
  for (int i = 0; i < 500 && cache->stats().prefetched < 11; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(cache->stats().prefetched, 11u);
  const size_t gets_before = server_.log().size();
  EXPECT_EQ(read(*source, 0, object_.size()), object_);
  EXPECT_EQ(server_.log().size(), gets_before);  // every block was there already
  EXPECT_EQ(cache->stats().misses, 0u);
}

// A cold cache's first reads: an announced range is downloaded by a request of its own, and the
// read inside it takes it from there while the block it lies in is still downloading (held 6 s
// here, past the read's deadline: a read that waited for the block would fail).
TEST_F(BlockCacheTest, AColdAnnouncedRangeIsReadFromItsOwnRequestWhileItsBlockDownloads) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 2;
  o.prefetch_bytes = 2 * kBlock;
  o.range_download_bytes = kBlock;
  o.range_download_after_ms = 0;  // the test server is near
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  const uint64_t begin = 3 * kBlock + 1000, length = 5000;
  server_.fail_next({.stall = 6000ms, .range = "bytes=196608-262143"});  // block 3
  source->prefetch(begin, length);
  EXPECT_EQ(read(*source, begin, length, Deadline::after(3s)), object_.substr(begin, length));
  const BlockCacheStats s = cache->stats();
  EXPECT_EQ(s.ranges_downloaded, 1u);
  EXPECT_EQ(s.bytes_ranges, length);
  EXPECT_EQ(s.range_reads, 1u);
  EXPECT_EQ(s.misses, 0u);
  EXPECT_EQ(gets()["bytes=197608-202607"], 1);
}

// Ranges go alone only to an origin seen to be far (the quickest of the shard opens' requests
// took range_download_after_ms): not before a request was timed, nor after a quick one.
TEST_F(BlockCacheTest, RangesAreDownloadedAloneOnlyFromAnOriginSeenToBeFar) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 1;
  o.range_download_after_ms = 500;
  std::string header(100, '\0');
  std::vector<ReadRequest> metadata{{5 * kBlock, std::as_writable_bytes(std::span(header))}};
  auto near = open_cache(o);
  auto near_source = cached_object(*near);
  near_source->prefetch(1000, 100);  // no request timed yet
  ASSERT_TRUE(near_source->read_metadata(metadata, Deadline::after(10s)).is_ok());
  near_source->prefetch(kBlock + 1000, 100);  // after a quick one

  auto far = open_cache(o);
  auto far_source = cached_object(*far);
  server_.fail_next({.stall = 1000ms, .range = "bytes=327680-327779"});
  ASSERT_TRUE(far_source->read_metadata(metadata, Deadline::after(10s)).is_ok());
  EXPECT_EQ(header, object_.substr(5 * kBlock, 100));
  far_source->prefetch(2 * kBlock + 1000, 100);
  for (int i = 0; i < 500 && far->stats().ranges_downloaded < 1; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(far->stats().ranges_downloaded, 1u);
  EXPECT_EQ(near->stats().ranges_downloaded, 0u);
  EXPECT_EQ(gets()["bytes=132072-132171"], 1);
  EXPECT_EQ(gets().count("bytes=1000-1099") + gets().count("bytes=66536-66635"), 0u);
}

// Ranges announced in one block before a downloader took the first are one request.
TEST_F(BlockCacheTest, RangesInOneBlockAnnouncedTogetherAreOneRequest) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 1;
  o.prefetch_bytes = kBlock;
  o.range_download_after_ms = 0;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  // The one downloader is busy with block 5 (held 1.5 s) while the ranges are announced.
  server_.fail_next({.stall = 1500ms, .range = "bytes=327680-393215"});
  source->prefetch(5 * kBlock, kBlock);
  for (int i = 0; i < 500 && gets().count("bytes=327680-393215") == 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  source->prefetch(9000, 2000);
  source->prefetch(1000, 2000);
  EXPECT_EQ(read(*source, 9000, 2000), object_.substr(9000, 2000));
  EXPECT_EQ(read(*source, 1000, 2000), object_.substr(1000, 2000));
  EXPECT_EQ(cache->stats().ranges_downloaded, 1u);
  EXPECT_EQ(gets()["bytes=1000-10999"], 1);
  EXPECT_EQ(gets().count("bytes=9000-10999") + gets().count("bytes=1000-2999"), 0u);
  // The first read took the range; the second may find block 0 landed by then (under load).
  EXPECT_GE(cache->stats().range_reads, 1u);
}

// Ranges are downloaded alone only while that helps and costs little: not when the block is
// cached already, not past range_download_bytes, not for a range over half a block (the block
// is then as quick), and never without downloaders. Reads outside a range use the blocks.
TEST_F(BlockCacheTest, RangesAreDownloadedAloneOnlyWhileColdSmallAndWithinTheirBudget) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 1;
  o.range_download_bytes = 6000;
  o.range_download_after_ms = 0;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  source->prefetch(1000, 5000);                // block 0: a range of its own
  source->prefetch(kBlock + 1000, 5000);       // block 1: past the budget
  source->prefetch(2 * kBlock, kBlock / 2 + 1);  // block 2: over half a block
  for (int i = 0; i < 500 && cache->stats().prefetched < 3; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(cache->stats().prefetched, 3u);
  EXPECT_EQ(cache->stats().ranges_downloaded, 1u);
  EXPECT_EQ(gets()["bytes=1000-5999"], 1);
  EXPECT_EQ(read(*source, kBlock + 1000, 5000), object_.substr(kBlock + 1000, 5000));
  EXPECT_EQ(cache->stats().range_reads, 0u);  // block 1 was there by then

  // Another process's cache over the same directory: its blocks are on disk, so it announces
  // no range; without downloaders nothing is announced at all.
  auto warm = open_cache(o);
  auto warm_source = cached_object(*warm);
  warm_source->prefetch(1000, 5000);
  o.prefetch_threads = 0;
  auto idle = open_cache(o);
  cached_object(*idle)->prefetch(5 * kBlock, 100);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(warm->stats().ranges_downloaded + idle->stats().ranges_downloaded, 0u);
  EXPECT_EQ(read(*warm_source, 1000, 5000), object_.substr(1000, 5000));
  EXPECT_EQ(warm->stats().range_reads, 0u);
}

// The read-ahead is sized in bytes: prefetch_bytes of blocks in flight, one GET each, however
// many blocks are announced and however many downloader threads are allowed.
TEST_F(BlockCacheTest, PrefetchBytesBoundTheDownloadsInFlight) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 64;
  o.prefetch_bytes = 3 * kBlock;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  // Every answer is slow, so the downloaders' GETs overlap: each one in flight at once needs a
  // connection of its own, the HEAD's (idle by then) serving one of them.
  server_.fail_next({.stall = 100ms}, 11);
  const uint64_t connections_before = server_.connections();
  source->prefetch(0, object_.size());
  for (int i = 0; i < 1000 && cache->stats().prefetched < 11; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(cache->stats().prefetched, 11u);
  EXPECT_LE(server_.connections() - connections_before, 2u);  // never more than 3 at once
  const size_t requests_before = server_.log().size();
  EXPECT_EQ(read(*source, 0, object_.size()), object_);
  EXPECT_EQ(server_.log().size(), requests_before);
}

TEST_F(BlockCacheTest, AReadOverSeveralMissingBlocksDownloadsThemInParallel) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 4;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  // The first answers are slow: while one GET waits, the others are already asked on
  // connections of their own; one after another they would all use the one connection. 1.5 s
  // is the others' margin to be asked while the first waits, on a loaded machine too.
  server_.fail_next({.stall = 1500ms}, 4);
  const uint64_t connections_before = server_.connections();
  EXPECT_EQ(read(*source, 0, object_.size()), object_);
  EXPECT_GE(server_.connections() - connections_before, 2u);
  const auto by_range = gets();
  EXPECT_EQ(by_range.size(), 11u);
  for (const auto& [range, count] : by_range) EXPECT_EQ(count, 1) << range;
  const BlockCacheStats s = cache->stats();
  EXPECT_GE(s.prefetched, 1u);
  EXPECT_EQ(s.bytes_downloaded, object_.size());
}

// A shard's header and footer are read together: the footer's block, at the other end of the
// object, is downloaded while the header's is, not after it.
TEST_F(BlockCacheTest, TheRequestsOfOneReadDownloadTheirBlocksInParallel) {
  BlockCacheOptions o = cache_options();
  o.prefetch_threads = 2;
  auto cache = open_cache(o);
  auto source = cached_object(*cache);
  server_.fail_next({.stall = 1500ms}, 2);  // the margin for the second GET to be asked
  const uint64_t connections_before = server_.connections();
  std::string head(100, '\0'), tail(100, '\0');
  const ReadRequest requests[] = {{0, std::as_writable_bytes(std::span(head))},
                                  {object_.size() - tail.size(),
                                   std::as_writable_bytes(std::span(tail))}};
  Status status = source->read(requests, Deadline::none());
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(head, object_.substr(0, head.size()));
  EXPECT_EQ(tail, object_.substr(object_.size() - tail.size()));
  // The HEAD's connection serves one GET; the other GET, asked while the first waits, opens a
  // second (one after another, both would use the first).
  EXPECT_EQ(server_.connections() - connections_before, 1u);
  EXPECT_EQ(gets().size(), 2u);
  EXPECT_EQ(cache->stats().prefetched, 1u);
}

TEST_F(BlockCacheTest, MetadataReadsAskForTheirRangesAloneUntilTheBlocksAreCached) {
  auto cache = open_cache();
  auto source = cached_object(*cache);
  std::string head(100, '\0'), tail(100, '\0');
  const ReadRequest requests[] = {
      {0, std::as_writable_bytes(std::span(head))},
      {object_.size() - tail.size(), std::as_writable_bytes(std::span(tail))}};
  // Both GETs held by the server: asked one after another, they would share one connection.
  server_.fail_next({.stall = 1500ms}, 2);
  const uint64_t connections_before = server_.connections();
  Status status = source->read_metadata(requests, Deadline::none());
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(head, object_.substr(0, head.size()));
  EXPECT_EQ(tail, object_.substr(object_.size() - tail.size()));
  EXPECT_EQ(server_.connections() - connections_before, 1u);
  const uint64_t end = object_.size() - 1;
  EXPECT_EQ(gets(), (std::map<std::string, int>{
                        {"bytes=0-99", 1},
                        {"bytes=" + std::to_string(end - 99) + "-" + std::to_string(end), 1}}));
  EXPECT_EQ(block_files(), 0u);  // no block was downloaded for them
  EXPECT_EQ(cache->stats().misses, 0u);

  // Once the blocks are cached, metadata reads take them and ask the server nothing.
  EXPECT_EQ(read(*source, 0, object_.size()), object_);
  const size_t gets_before = server_.log().size();
  head.assign(100, '\0');
  tail.assign(100, '\0');
  status = source->read_metadata(requests, Deadline::none());
  ASSERT_TRUE(status.is_ok()) << status.to_string();
  EXPECT_EQ(head, object_.substr(0, head.size()));
  EXPECT_EQ(tail, object_.substr(object_.size() - tail.size()));
  EXPECT_EQ(server_.log().size(), gets_before);
}

TEST_F(BlockCacheTest, DamagedBlocksAreDownloadedAgainNeverServed) {
  {
    auto cache = open_cache();
    auto source = cached_object(*cache);
    read(*source, 0, object_.size());
  }
  const auto paths = block_paths();
  ASSERT_EQ(paths.size(), 11u);
  // A flipped byte in block 3, block 5 cut short (a torn write), block 8 emptied.
  std::string damaged = testing::read_file(paths[3]);
  damaged[100] ^= 0x20;
  testing::write_file(paths[3], damaged);
  fs::resize_file(paths[5], kBlock / 2);
  fs::resize_file(paths[8], 0);
  const auto gets_before = gets();

  auto cache = open_cache();
  auto source = cached_object(*cache);
  EXPECT_EQ(read(*source, 0, object_.size()), object_);
  const BlockCacheStats s = cache->stats();
  EXPECT_EQ(s.damaged, 3u);
  EXPECT_EQ(s.misses, 3u);
  EXPECT_EQ(s.hits, 8u);
  auto gets_after = gets();
  for (const auto& [range, count] : gets_before) gets_after[range] -= count;
  std::erase_if(gets_after, [](const auto& entry) { return entry.second == 0; });
  // Blocks 3, 5 and 8, once each.
  EXPECT_EQ(gets_after, (std::map<std::string, int>{{"bytes=196608-262143", 1},
                                                    {"bytes=327680-393215", 1},
                                                    {"bytes=524288-589823", 1}}));
  EXPECT_GE(internal::fallback_count("cache_damaged_block"), 3u);
}

TEST_F(BlockCacheTest, AFillerKilledMidDownloadLeavesNothingAndTheCacheIsReused) {
  {
    auto cache = open_cache();
    auto source = cached_object(*cache);
    read(*source, 0, 4 * kBlock);  // blocks 0-3 complete
  }
  // The child's download of block 4 stalls mid-body; it is killed there, holding the block's
  // lock and a half-written fill.
  server_.fail_next({});  // its HEAD is answered
  server_.fail_next({.stall = 10s, .stall_mid_body = true});
  const size_t requests_before = server_.requests();
  ChildProcesses children;
  const pid_t child = children.add([&] {
    auto cache = BlockCache::open(cache_options());
    if (!cache.is_ok()) return 2;
    auto source = cached_object(**cache);
    std::string got(kBlock, '\0');
    (void)source->read_at(4 * kBlock, std::as_writable_bytes(std::span(got)), Deadline::after(60s));
    return 3;
  });
  children.start();
  for (int i = 0; i < 1000 && server_.requests() < requests_before + 2; ++i) {
    std::this_thread::sleep_for(5ms);  // its HEAD, then its GET
  }
  ASSERT_EQ(server_.requests(), requests_before + 2);
  std::this_thread::sleep_for(100ms);
  ::kill(child, SIGKILL);
  EXPECT_EQ(children.wait(child), 128 + SIGKILL);

  // The next process gets the lock the dead one held, keeps the four blocks, finds no partial
  // file anywhere, and downloads the rest.
  EXPECT_EQ(files_in(dir_ / "cache/tmp"), 0u);
  EXPECT_EQ(block_files(), 4u);
  auto cache = open_cache();
  auto source = cached_object(*cache);
  EXPECT_EQ(read(*source, 0, object_.size(), Deadline::after(10s)), object_);
  EXPECT_EQ(cache->stats().hits, 4u);
  EXPECT_EQ(cache->stats().misses, 7u);
  EXPECT_EQ(cache->stats().damaged, 0u);
}

TEST_F(BlockCacheTest, WaitingForAnotherFillerEndsAtTheReadsDeadline) {
  auto cache = open_cache();
  auto source = cached_object(*cache);
  // The filler's answer takes 3 s: far past the waiter's 200 ms deadline, on a loaded machine too.
  server_.fail_next({.stall = 3000ms});
  std::thread slow(
      [&] { EXPECT_EQ(read(*source, 0, 10, Deadline::after(10s)), object_.substr(0, 10)); });
  while (server_.requests() < 2) std::this_thread::sleep_for(1ms);  // the HEAD, then its GET
  const auto started = std::chrono::steady_clock::now();
  std::string dst(10, '\0');
  Status s = source->read_at(5, std::as_writable_bytes(std::span(dst)), Deadline::after(200ms));
  const auto waited = std::chrono::steady_clock::now() - started;
  EXPECT_EQ(s.code(), ErrorCode::kDeadlineExceeded) << s.to_string();
  // The object and the block's byte range.
  EXPECT_NE(s.message().find("block 0 (bytes=0-" + std::to_string(kBlock - 1) + ") of '" +
                             server_.url("/obj") + "'"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find("downloading"), std::string::npos) << s.message();
  EXPECT_LT(waited, 2500ms);  // it gave up at its own deadline, not when the filler finished
  slow.join();
  EXPECT_EQ(cache->stats().misses, 1u);
}

TEST_F(BlockCacheTest, ThreadsWaitingForAFillTakeItsBlockOrTakeOverWhenItFails) {
  auto cache = open_cache();
  auto source = cached_object(*cache);
  auto wait_for_requests = [&](uint64_t n) {
    while (server_.requests() < n) std::this_thread::sleep_for(1ms);
  };
  // Block 0: its filler's GET stalls while three more threads ask for it; they are handed the
  // filler's block. The three start once the GET is in; 3 s is their margin to reach the block
  // on a loaded machine (a late one would find it on disk and count a hit, not a wait).
  server_.fail_next({.stall = 3000ms});
  std::vector<std::thread> readers;
  readers.emplace_back([&] { EXPECT_EQ(read(*source, 0, 100), object_.substr(0, 100)); });
  wait_for_requests(2);  // the HEAD, then block 0's GET
  for (int t = 1; t <= 3; ++t) {
    readers.emplace_back([&, t] {
      EXPECT_EQ(read(*source, 1000 * t, 100), object_.substr(1000 * t, 100));
    });
  }
  for (std::thread& t : readers) t.join();
  readers.clear();
  EXPECT_EQ(gets()["bytes=0-65535"], 1);
  EXPECT_EQ(cache->stats().misses, 1u);
  EXPECT_EQ(cache->stats().waits, 3u);

  // Block 1: its filler's GET fails after a stall; the thread that waited for it downloads it.
  server_.fail_next({.status = 404, .stall = 300ms});
  std::string failed(10, '\0');
  readers.emplace_back([&] {
    Status s = source->read_at(kBlock, std::as_writable_bytes(std::span(failed)), {});
    EXPECT_FALSE(s.is_ok());
  });
  wait_for_requests(3);
  readers.emplace_back(
      [&] { EXPECT_EQ(read(*source, kBlock + 5, 10), object_.substr(kBlock + 5, 10)); });
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(gets()["bytes=65536-131071"], 2);
  EXPECT_EQ(cache->stats().misses, 2u);
}

TEST_F(BlockCacheTest, WithoutRoomOnDiskReadsUseTheDownloadedBytes) {
  BlockCacheOptions o = cache_options();
  o.min_free_bytes = uint64_t{1} << 62;  // no filesystem has this much free
  auto cache = open_cache(o);
  ASSERT_NE(cache, nullptr);
  auto source = cached_object(*cache);
  EXPECT_EQ(read(*source, 0, object_.size()), object_);
  EXPECT_EQ(block_files(), 0u);
  EXPECT_GE(internal::fallback_count("cache_unwritable"), 11u);
}

TEST_F(BlockCacheTest, ADirectoryOfAnotherBlockSizeOrNotACacheIsRefused) {
  ASSERT_NE(open_cache(), nullptr);
  BlockCacheOptions other = cache_options();
  other.block_bytes = 2 * kBlock;
  auto refused = BlockCache::open(other);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("holds blocks of 65536 bytes"), std::string::npos)
      << refused.status().message();

  testing::write_file(dir_ / "other/layout.json", "{\"something\": 1}");
  other.directory = dir_ / "other";
  auto foreign = BlockCache::open(other);
  ASSERT_FALSE(foreign.is_ok());
  EXPECT_NE(foreign.status().message().find("not a zerowait block cache"), std::string::npos)
      << foreign.status().message();
}

TEST_F(BlockCacheTest, ARemoteDatasetReadsItsShardsThroughTheCache) {
  testing::pack_image_dataset(dir_.path(), dir_ / "ds", {.files = 60, .shard_size = 100 << 10});
  server_.put_directory("/ds/", dir_ / "ds");
  auto local = Dataset::open(dir_ / "ds");
  ASSERT_TRUE(local.is_ok());

  auto cache = open_cache();
  DatasetOptions options;
  options.cache = cache;
  auto read_all = [&] {
    auto remote = Dataset::open(server_.url("/ds/"), options);
    ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
    for (uint64_t i = 0; i < (*remote)->size(); ++i) {
      auto sample = (*remote)->read(i);
      ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
      EXPECT_EQ(sample->buffer, (*local)->read(i)->buffer) << "sample " << i;
    }
  };
  read_all();
  const uint64_t downloaded = cache->stats().misses;
  EXPECT_GT(downloaded, 0u);
  size_t shard_gets = 0;
  for (const std::string& line : server_.log())
    shard_gets += line.find(".zws bytes=") != std::string::npos;
  read_all();  // a second epoch: the shards' bytes come from disk
  size_t shard_gets_after = 0;
  for (const std::string& line : server_.log())
    shard_gets_after += line.find(".zws bytes=") != std::string::npos;
  EXPECT_EQ(shard_gets_after, shard_gets);
  EXPECT_EQ(cache->stats().misses, downloaded);
}

// Opening a shard over the network is one request, for its tail (a 64th of the shard, at least
// 64 KiB), when its index lies there: not three (header and footer, then the index). A larger
// index is a second request. Either way every sample reads back whole, and verify() checks the
// header the open did not read.
TEST_F(BlockCacheTest, ARemoteShardOpensInOneRoundOfRequestsWhenItsIndexIsInTheTail) {
  auto write = [&](const std::string& name, int samples, size_t sample_bytes) {
    auto writer = ShardWriter::create(dir_ / name);
    ASSERT_TRUE(writer.is_ok()) << writer.status().to_string();
    for (int i = 0; i < samples; ++i) {
      const std::string bytes = testing::random_bytes(sample_bytes, static_cast<uint64_t>(i));
      const FieldData field{"bin", std::as_bytes(std::span(bytes))};
      ASSERT_TRUE(writer->add_sample("sample-" + std::to_string(i), {&field, 1}).is_ok());
    }
    ASSERT_TRUE(writer->finish().is_ok());
    server_.put("/" + name, testing::read_file(dir_ / name));
  };
  write("few.zws", 40, 20'000);   // index of a few KB; 800 KB of samples
  write("many.zws", 3000, 16);    // index of ~200 KB, beyond the 64 KiB tail
  auto cache = open_cache();
  DatasetOptions options;
  options.cache = cache;
  for (const auto& [name, round_trips] : {std::pair{"few.zws", 1}, std::pair{"many.zws", 2}}) {
    const size_t before = server_.log().size();
    auto remote = Dataset::open(server_.url(std::string("/") + name), options);
    ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
    const std::vector<std::string> log = server_.log();
    std::vector<std::string> ranges;
    for (size_t i = before; i < log.size(); ++i) {
      if (log[i].starts_with("GET /" + std::string(name) + " ")) ranges.push_back(log[i]);
    }
    EXPECT_EQ(ranges.size(), static_cast<size_t>(round_trips)) << name;
    auto local = Dataset::open(dir_ / name);
    ASSERT_TRUE(local.is_ok());
    ASSERT_EQ((*remote)->size(), (*local)->size());
    for (uint64_t i = 0; i < (*remote)->size(); i += 97) {
      auto sample = (*remote)->read(i);
      ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
      EXPECT_EQ(sample->buffer, (*local)->read(i)->buffer) << name << " sample " << i;
    }
    auto shard = (*remote)->shard(0);
    ASSERT_TRUE(shard.is_ok());
    auto bad = (*shard)->verify(nullptr, nullptr);
    ASSERT_TRUE(bad.is_ok()) << bad.status().to_string();
    EXPECT_EQ(*bad, 0u);
  }
  // A damaged header: the open does not see it, verify() names it.
  std::string damaged = testing::read_file(dir_ / "few.zws");
  damaged[0] ^= 0x01;
  server_.put("/damaged.zws", damaged);
  auto remote = Dataset::open(server_.url("/damaged.zws"), options);
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  auto verified = (*(*remote)->shard(0))->verify(nullptr, nullptr);
  ASSERT_FALSE(verified.is_ok());
  EXPECT_NE(verified.status().message().find("bad header magic"), std::string::npos)
      << verified.status().message();
}

// The first batch of a run on a cold cache: its samples come from ranges downloaded alone, so
// it arrives while every shard's whole block is still held (4 s) by the server, within a 2 s
// deadline that a batch built from the blocks would miss. (A downloader for every shard, so
// that the test ends one stall after it began.)
TEST_F(BlockCacheTest, ALoadersFirstBatchOnAColdCacheWaitsForItsOwnBytesNotWholeBlocks) {
  testing::pack_image_dataset(dir_.path(), dir_ / "ds", {.files = 60, .shard_size = 100 << 10});
  server_.put_directory("/ds/", dir_ / "ds");
  BlockCacheOptions o = cache_options();
  o.block_bytes = 1 << 20;  // a shard's bytes lie in its block 0
  o.prefetch_threads = 16;
  o.range_download_after_ms = 0;  // the test server is near
  for (const auto& e : fs::directory_iterator(dir_ / "ds")) {
    if (e.path().extension() != ".zws") continue;
    server_.fail_next({.stall = 4000ms, .range = "bytes=0-" + std::to_string(e.file_size() - 1)});
  }
  LoaderOptions options;
  options.batch_size = 8;
  options.threads = 1;
  std::unique_ptr<Loader> loader = remote_jpg_loader(o, options);
  ASSERT_NE(loader, nullptr);
  auto first = loader->next(Deadline::after(2s));
  ASSERT_TRUE(first.is_ok() && *first != nullptr) << first.status().to_string();
  EXPECT_EQ(expect_local_jpgs(**first), 8);
  const LoaderStats stats = loader->stats();
  ASSERT_TRUE(stats.cache.has_value());
  EXPECT_GT(stats.cache->range_reads, 0u);
  EXPECT_LE(stats.cache->bytes_ranges, o.range_download_bytes);
  EXPECT_EQ(stats.cache->misses, 0u);
}

TEST_F(BlockCacheTest, ALoaderReportsItsCacheAndDownloadsEachBlockOnce) {
  testing::pack_image_dataset(dir_.path(), dir_ / "ds", {.files = 60, .shard_size = 100 << 10});
  server_.put_directory("/ds/", dir_ / "ds");
  BlockCacheOptions o = cache_options();
  o.block_bytes = 16 << 10;  // several blocks per shard
  o.prefetch_threads = 2;
  LoaderOptions options;
  options.batch_size = 8;
  options.threads = 2;
  options.prefetch = 2;
  std::unique_ptr<Loader> loader = remote_jpg_loader(o, options);
  ASSERT_NE(loader, nullptr);
  int64_t samples = 0;
  for (;;) {
    auto batch = loader->next();
    ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
    if (*batch == nullptr) break;
    samples += expect_local_jpgs(**batch);
  }
  EXPECT_EQ(samples, 60);
  const LoaderStats stats = loader->stats();
  ASSERT_TRUE(stats.cache.has_value());
  // Whoever fetched a block (a worker, or the background download of an announced one), it was
  // fetched once: the blocks fetched are exactly the distinct block ranges the server answered.
  // The other ranges are the shards' headers, footers and indexes, asked for alone.
  std::map<std::string, int> shard_gets;
  for (const std::string& line : server_.log()) {
    const size_t range = line.find(".zws bytes=");
    if (!line.starts_with("GET ") || range == std::string::npos) continue;
    const uint64_t first = std::stoull(line.substr(range + 11));
    const uint64_t last = std::stoull(line.substr(line.find('-', range + 11) + 1));
    if (first % o.block_bytes == 0 && (first != 0 || last + 1 == o.block_bytes)) {
      ++shard_gets[line];
    }
  }
  for (const auto& [line, count] : shard_gets) EXPECT_EQ(count, 1) << line;
  EXPECT_EQ(stats.cache->misses + stats.cache->prefetched, shard_gets.size());
  EXPECT_GT(stats.cache->hits, 0u);
}

}  // namespace
}  // namespace zerowait
