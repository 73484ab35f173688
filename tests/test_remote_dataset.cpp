// Remote datasets: a packed dataset's files behind a real HTTP server on 127.0.0.1, and in a
// bucket of the real S3 server ctest starts (Ceph RGW, tests/s3/rgw.sh), open with one GET of the
// manifest and read with ranged GETs; the loader delivers the same batches as from the local
// copy; a stalled server is a read error naming the URL, not a hang; what is missing is named;
// and what is not supported yet says so.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "storage/s3/s3_client.hpp"
#include "testing/http_server.hpp"
#include "testing/image_dataset.hpp"
#include "testing/s3_server.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/block_cache.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/manifest.hpp"

namespace zerowait {
namespace {

using testing::TempDir;
using testing::TestHttpServer;
namespace fs = std::filesystem;

// Packs 120 synthetic JPEGs into a few shards and serves every file of the dataset under /ds/.
class RemoteDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_GT(testing::pack_image_dataset(dir_.path(), dir_ / "ds"), 2u);
    server_.put_directory("/ds/", dir_ / "ds");
  }

  std::vector<std::vector<int64_t>> epoch(const std::string& where, LoaderOptions options) {
    auto dataset = Dataset::open(where);
    EXPECT_TRUE(dataset.is_ok()) << dataset.status().to_string();
    if (!dataset.is_ok()) return {};
    auto loader = Loader::create(*dataset, options);
    EXPECT_TRUE(loader.is_ok()) << loader.status().to_string();
    std::vector<std::vector<int64_t>> batches;
    for (;;) {
      auto batch = (*loader)->next();
      EXPECT_TRUE(batch.is_ok()) << batch.status().to_string();
      if (!batch.is_ok() || *batch == nullptr) break;
      const BatchColumn* index = (*batch)->column("__index__");
      const BatchColumn* jpg = (*batch)->column("jpg");
      std::vector<int64_t> row(index->shape[0]);
      std::memcpy(row.data(), index->data, index->bytes);
      // The bytes themselves: a checksum of the batch's JPEG column stands in for them.
      row.push_back(static_cast<int64_t>(
          std::hash<std::string_view>()({reinterpret_cast<const char*>(jpg->data), jpg->bytes})));
      batches.push_back(std::move(row));
    }
    return batches;
  }

  TempDir dir_;
  TestHttpServer server_;
};

// Every process writes the cache's trace (docs/cache.md, "Tracing") to `path` while this lives.
class CacheTraceTo {
 public:
  explicit CacheTraceTo(const std::string& path) {
    ::setenv("ZEROWAIT_TRACE_CACHE", path.c_str(), 1);
  }
  ~CacheTraceTo() { ::unsetenv("ZEROWAIT_TRACE_CACHE"); }
};

// A cache in an empty `directory` with blocks of `block_bytes`, never short of disk.
BlockCacheOptions cold_cache_options(const std::string& directory, uint64_t block_bytes) {
  BlockCacheOptions options;
  options.directory = directory;
  options.capacity_bytes = 64 << 20;
  options.min_free_bytes = 0;
  options.block_bytes = block_bytes;
  return options;
}

LoaderOptions options() {
  LoaderOptions o;
  o.batch_size = 16;
  o.shuffle.seed = 3;
  o.threads = 2;
  o.fields = {"jpg", "cls"};
  o.decode["cls"] = {"int", {}};
  o.memory_budget = 32 << 20;
  return o;
}

TEST_F(RemoteDatasetTest, OpensWithOneGetAndLoadsTheSameBatchesAsTheLocalCopy) {
  auto remote = Dataset::open(server_.url("/ds/"));
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  EXPECT_EQ(server_.log(), std::vector<std::string>{"GET /ds/manifest.json"});
  EXPECT_EQ((*remote)->size(), 120u);
  EXPECT_EQ((*remote)->classes().size(), 3u);
  auto sample = (*remote)->read(77);
  ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
  auto local = Dataset::open(dir_ / "ds");
  ASSERT_TRUE(local.is_ok());
  EXPECT_EQ(sample->buffer, (*local)->read(77)->buffer);

  const auto from_disk = epoch(dir_ / "ds", options());
  const auto over_http = epoch(server_.url("/ds/manifest.json"), options());
  EXPECT_EQ(over_http.size(), 8u);  // 120 samples in batches of 16
  EXPECT_EQ(over_http, from_disk);
  // The manifest gives each shard's size and content version: no HEAD, only ranged GETs.
  for (const std::string& request : server_.log()) {
    EXPECT_TRUE(request.starts_with("GET /ds/manifest.json") ||
                (request.starts_with("GET /ds/") && request.find(" bytes=") != std::string::npos))
        << "every read of a shard is a ranged GET: " << request;
  }
}

// A shard changed on the server after packing, while its manifest stayed: cut short, it fails
// to open naming the shard and what the manifest says; replaced by another shard of the same
// size, its index checksum gives it away. Neither is read as if it were the packed shard.
TEST_F(RemoteDatasetTest, AShardChangedAfterPackingIsNamedNotRead) {
  auto manifest = Manifest::load(dir_ / "ds/manifest.json");
  ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  const ManifestShard& first = manifest->shards.at(0);
  const std::string shard = testing::read_file(dir_ / ("ds/" + first.path));
  server_.put("/ds/" + first.path, shard.substr(0, shard.size() - 100));
  auto cut = Dataset::open(server_.url("/ds/"));
  ASSERT_TRUE(cut.is_ok()) << cut.status().to_string();
  const Status short_read = (*cut)->read(0).status();
  EXPECT_FALSE(short_read.is_ok());
  EXPECT_NE(short_read.message().find(first.path), std::string::npos) << short_read.to_string();
  EXPECT_NE(short_read.message().find("does not read as the manifest describes it (" +
                                      std::to_string(first.bytes) + " bytes"),
            std::string::npos)
      << short_read.to_string();

  // Another shard of the dataset, padded or cut to the first one's size.
  std::string other = testing::read_file(dir_ / ("ds/" + manifest->shards.at(1).path));
  other.resize(shard.size());
  server_.put("/ds/" + first.path, other);
  auto replaced = Dataset::open(server_.url("/ds/"));
  ASSERT_TRUE(replaced.is_ok()) << replaced.status().to_string();
  const Status wrong = (*replaced)->read(0).status();
  EXPECT_EQ(wrong.code(), ErrorCode::kCorrupt) << wrong.to_string();
  EXPECT_NE(wrong.message().find(first.path), std::string::npos) << wrong.to_string();
}

TEST_F(RemoteDatasetTest, AStalledServerFailsTheBatchNamingTheUrlAndTheEpochGoesOn) {
  auto dataset = Dataset::open(server_.url("/ds"));
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  // Every shard opened now, so that the stalled request below is a batch's read, not an open.
  for (size_t s = 0; s < (*dataset)->shard_count(); ++s) ASSERT_TRUE((*dataset)->shard(s).is_ok());
  LoaderOptions o = options();
  o.read_timeout = std::chrono::milliseconds(1500);
  auto loader = Loader::create(*dataset, o);
  ASSERT_TRUE(loader.is_ok());
  // With prefetch 4, the first next() lets batches 1-5 be read; the stalled request belongs to a
  // later one (a full batch of 16: only the eighth and last has 8).
  auto first = (*loader)->next();
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  server_.fail_next({.stall = std::chrono::seconds(60)});
  std::vector<Status> errors;
  uint64_t delivered = (*first)->samples();
  first->reset();
  for (int calls = 0; calls < 20; ++calls) {
    auto batch = (*loader)->next();
    if (!batch.is_ok()) {
      errors.push_back(batch.status());
      continue;
    }
    if (*batch == nullptr) break;
    delivered += (*batch)->samples();
  }
  ASSERT_EQ(errors.size(), 1u);
  EXPECT_EQ(errors[0].code(), ErrorCode::kDeadlineExceeded) << errors[0].to_string();
  EXPECT_NE(errors[0].message().find(server_.url("/ds/")), std::string::npos)
      << errors[0].message();
  EXPECT_EQ(delivered, 120u - 16u);  // one batch lost, as with a local read past its deadline
}

TEST_F(RemoteDatasetTest, WhatIsMissingOrNotSupportedSaysSo) {
  auto missing = Dataset::open(server_.url("/elsewhere/"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("/elsewhere/manifest.json"), std::string::npos);

  // A remote tar is indexed by scanning its headers, as a local one: a damaged one is named.
  server_.put("/web/a.tar", std::string(700, 'x'));
  auto tar = Dataset::open(server_.url("/web/a.tar"));
  ASSERT_FALSE(tar.is_ok());
  EXPECT_EQ(tar.status().code(), ErrorCode::kCorrupt) << tar.status().to_string();
  EXPECT_NE(tar.status().message().find(server_.url("/web/a.tar")), std::string::npos)
      << tar.status().message();

  // s3:// without credentials anywhere: the error says where they were looked for.
  for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"}) {
    ::unsetenv(name);
  }
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", (dir_ / "no-credentials").c_str(), 1);
  ::setenv("AWS_CONFIG_FILE", (dir_ / "no-config").c_str(), 1);
  auto s3 = Dataset::open("s3://bucket/ds");
  ASSERT_FALSE(s3.is_ok());
  EXPECT_EQ(s3.status().code(), ErrorCode::kNotFound) << s3.status().to_string();
  EXPECT_NE(s3.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos)
      << s3.status().message();
}

// Three WebDataset tars of 40 samples each (a .cls and a .jpg member per sample, archived by
// GNU tar) in <dir>/web, served under /web/. Returns the local brace list of them.
std::string make_webdataset_tars(const fs::path& dir) {
  const fs::path members = dir / "members", web = dir / "web";
  fs::create_directories(web);
  for (int shard = 0; shard < 3; ++shard) {
    const fs::path tar = web / ("shard-00" + std::to_string(shard) + ".tar");
    std::vector<std::string> argv = {"/usr/bin/tar", "-cf", tar, "-C", members, "--format=gnu"};
    for (int i = 0; i < 40; ++i) {
      const std::string key = "s" + std::to_string(shard) + "_" + std::to_string(100 + i);
      testing::write_file(members / (key + ".cls"), std::to_string(i % 3));
      testing::write_file(members / (key + ".jpg"),
                          testing::random_bytes(500 + (i * 997) % 6000, shard * 100 + i));
      argv.push_back(key + ".cls");
      argv.push_back(key + ".jpg");
    }
    auto archived = testing::run_command(argv);
    EXPECT_EQ(archived.exit_code, 0) << archived.err;
  }
  return (web / "shard-{000..002}.tar").string();
}

void expect_same_samples(const Dataset& remote, const Dataset& local) {
  ASSERT_EQ(remote.size(), local.size());
  for (uint64_t i = 0; i < local.size(); ++i) {
    auto got = remote.read(i);
    ASSERT_TRUE(got.is_ok()) << i << ": " << got.status().to_string();
    auto want = local.read(i);
    ASSERT_TRUE(want.is_ok()) << i << ": " << want.status().to_string();
    EXPECT_EQ(got->view.key, want->view.key) << i;
    EXPECT_EQ(got->buffer, want->buffer) << i;
  }
}

TEST_F(RemoteDatasetTest, WebDatasetTarsOpenFromABraceListOfUrlsAndReadLikeTheLocalTars) {
  const std::string local_list = make_webdataset_tars(dir_.path());
  server_.put_directory("/web/", dir_ / "web");
  auto local = Dataset::open(local_list);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  ASSERT_EQ((*local)->size(), 120u);

  auto remote = Dataset::open(server_.url("/web/shard-{000..002}.tar"));
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  // Each tar (under 8 MiB) is indexed with its HEAD and one GET of the whole object, not a
  // request per member header.
  std::vector<std::string> opens = server_.log();
  std::sort(opens.begin(), opens.end());
  std::vector<std::string> expected;
  for (int shard = 0; shard < 3; ++shard) {
    const std::string path = "/web/shard-00" + std::to_string(shard) + ".tar";
    const uint64_t size = fs::file_size(dir_ / ("web" + path.substr(4)));
    expected.push_back("GET " + path + " bytes=0-" + std::to_string(size - 1));
    expected.push_back("HEAD " + path);
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(opens, expected);
  expect_same_samples(**remote, **local);
  EXPECT_EQ((*remote)->shard_path(2), server_.url("/web/shard-002.tar"));
  EXPECT_EQ(epoch(server_.url("/web/shard-{000..002}.tar"), options()),
            epoch(local_list, options()));
}

TEST_F(RemoteDatasetTest, ARemoteTarScannedThroughTheCacheIsDownloadedOncePerNode) {
  make_webdataset_tars(dir_.path());
  server_.put_directory("/web/", dir_ / "web");
  const std::string list = server_.url("/web/shard-{000..002}.tar");
  BlockCacheOptions cache_options;
  cache_options.directory = dir_ / "cache";
  cache_options.capacity_bytes = 64 << 20;
  cache_options.min_free_bytes = 0;
  auto cache = BlockCache::open(cache_options);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  auto count_gets = [&] {
    size_t gets = 0;
    for (const std::string& request : server_.log()) gets += request.starts_with("GET ");
    return gets;
  };
  DatasetOptions with_cache;
  with_cache.cache = *cache;
  auto first = Dataset::open(list, with_cache);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(count_gets(), 3u);  // the scans: one block of each tar
  auto local = Dataset::open(dir_ / "web/shard-{000..002}.tar");
  ASSERT_TRUE(local.is_ok());
  expect_same_samples(**first, **local);  // every sample read from the blocks the scans filled
  EXPECT_EQ(count_gets(), 3u);

  // Another process of the node opens the same tars through the same directory: no downloads.
  auto other_cache = BlockCache::open(cache_options);
  ASSERT_TRUE(other_cache.is_ok());
  with_cache.cache = *other_cache;
  auto second = Dataset::open(list, with_cache);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  expect_same_samples(**second, **local);
  EXPECT_EQ(count_gets(), 3u);
  EXPECT_EQ((*other_cache)->stats().misses, 0u);
  EXPECT_GE((*other_cache)->stats().hits, 3u);
}

// A cold run's first claim announces only the batch it builds, and the batches after it once
// that batch is built: announced earlier, their downloads would share the link and the CPUs with
// the first batch's own blocks. Read from the cache's trace (ZEROWAIT_TRACE_CACHE), whose events
// one process writes in order: one worker, 16 KiB cache blocks, four downloaders, and a
// look-ahead that covers the whole small dataset.
TEST_F(RemoteDatasetTest, AColdRunAnnouncesTheBatchesAheadOnlyOnceTheFirstIsBuilt) {
  constexpr uint64_t kBlock = 16 << 10;
  const std::string trace_path = dir_ / "trace.txt";
  const CacheTraceTo tracing(trace_path);
  BlockCacheOptions cache_options = cold_cache_options(dir_ / "cache", kBlock);
  cache_options.prefetch_bytes = 4 * kBlock;
  auto cache = BlockCache::open(cache_options);
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  DatasetOptions with_cache;
  with_cache.cache = *cache;
  auto dataset = Dataset::open(server_.url("/ds/"), with_cache);
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  LoaderOptions o = options();
  o.threads = 1;
  o.shuffle.mode = ShuffleMode::kBlock;
  o.shuffle.block_bytes = 1;  // a block of the order is one sample: a batch reads its own bytes
  o.shuffle.window_bytes = 32 << 10;
  auto loader = Loader::create(*dataset, o);
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
  auto first = (*loader)->next();
  ASSERT_TRUE(first.is_ok() && *first != nullptr) << first.status().to_string();
  const BatchColumn* index = (*first)->column("__index__");
  std::vector<int64_t> samples(index->shape[0]);
  std::memcpy(samples.data(), index->data, index->bytes);
  first->reset();
  for (;;) {  // the rest of the epoch
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.is_ok()) << batch.status().to_string();
    if (*batch == nullptr) break;
  }
  loader->reset();

  // The cache blocks the first batch's hints cover, as "<url> <block>": its samples' bytes,
  // neighbours of a shard less than 64 KiB apart joined into one range (LoaderRun::announce_reads).
  constexpr uint64_t kJoinGap = 64 << 10;
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> ranges;  // [begin, end)
  for (int64_t global : samples) {
    auto where = (*dataset)->locate(static_cast<uint64_t>(global));
    ASSERT_TRUE(where.is_ok()) << where.status().to_string();
    auto shard = (*dataset)->shard(where->shard);
    ASSERT_TRUE(shard.is_ok());
    const format::SampleEntry& entry = (*shard)->index().samples[where->local];
    ranges[(*dataset)->shard_path(where->shard)].emplace_back(entry.offset,
                                                               entry.offset + entry.size);
  }
  std::set<std::string> first_batch;
  for (auto& [url, spans] : ranges) {
    std::sort(spans.begin(), spans.end());
    for (size_t i = 0; i < spans.size();) {
      uint64_t end = spans[i].second;
      size_t j = i + 1;
      while (j < spans.size() && spans[j].first <= end + kJoinGap) {
        end = std::max(end, spans[j++].second);
      }
      for (uint64_t b = spans[i].first / kBlock; b <= (end - 1) / kBlock; ++b) {
        first_batch.insert(url + " " + std::to_string(b));
      }
      i = j;
    }
  }

  // "<seconds> <pid> <event> <origin> <block> [<detail>]", in the order they happened.
  std::istringstream lines(testing::read_file(trace_path));
  std::string line;
  bool built = false;
  size_t announced_before = 0, announced_after = 0, fetched_before = 0;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string seconds, pid, event, origin, block;
    fields >> seconds >> pid >> event >> origin >> block;
    if (event == "built" && origin == "loader" && block == "0") built = true;
    if (event != "announce" && event != "get" && event != "range") continue;
    // A range downloaded alone (a cold cache's first reads) is traced at its offset.
    const std::string key =
        origin + " " + (event == "range" ? std::to_string(std::stoull(block) / kBlock) : block);
    if (built) {
      announced_after += event == "announce";
      continue;
    }
    EXPECT_EQ(first_batch.count(key), 1u)
        << "before the first batch was built, the cache was asked to " << event << " " << key
        << ", which is none of that batch's";
    (event == "announce" ? announced_before : fetched_before) += 1;  // a get or a range
  }
  EXPECT_TRUE(built) << "no 'built loader 0' in the trace";
  EXPECT_GE(announced_before, 4u);  // the first batch's blocks, for the four downloaders
  EXPECT_GT(fetched_before, 0u);
  EXPECT_GT(announced_after, 0u);   // the batches ahead, once the first was built
}

// Opening a remote shard costs a round trip, so Loader::create opens the shards its workers'
// first batches read in the same round as those its size estimate looks at (the first 4096
// samples'): the first claims find them open and open none, a round trip sooner.
TEST_F(RemoteDatasetTest, ALoaderOpensTheShardsOfItsFirstBatchesBeforeItReturns) {
  TempDir big;
  testing::ImageDatasetOptions many;
  many.files = 4800;  // the estimate's 4096 samples leave shards beyond them
  many.min_bytes = 600;
  many.max_bytes = 900;
  many.shard_size = 256 << 10;
  ASSERT_GT(testing::pack_image_dataset(big.path(), big / "ds", many), 6u);
  server_.put_directory("/big/", big / "ds");
  const std::string trace_path = big / "trace.txt";
  const CacheTraceTo tracing(trace_path);
  DatasetOptions with_cache;
  with_cache.cache = *BlockCache::open(cold_cache_options(big / "cache", 64 << 10));
  auto dataset = Dataset::open(server_.url("/big/"), with_cache);
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  LoaderOptions o = options();
  o.batch_size = 64;  // samples from all over the dataset (a global shuffle)
  auto loader = Loader::create(*dataset, o);
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();

  // The shards the first two batches (one per worker) read, and the estimate's: the first
  // shards, up to 4096 samples.
  std::set<size_t> first_batches;
  for (int b = 0; b < 2; ++b) {
    auto batch = (*loader)->next();
    ASSERT_TRUE(batch.is_ok() && *batch != nullptr) << batch.status().to_string();
    const BatchColumn* index = (*batch)->column("__index__");
    std::vector<int64_t> samples(index->shape[0]);
    std::memcpy(samples.data(), index->data, index->bytes);
    for (int64_t global : samples) {
      first_batches.insert((*dataset)->locate(static_cast<uint64_t>(global))->shard);
    }
  }
  loader->reset();
  size_t estimated = 0;
  for (uint64_t samples = 0; samples < 4096; ++estimated) {
    samples += (*dataset)->manifest().shards[estimated].samples;
  }
  ASSERT_GE(*first_batches.rbegin(), estimated)
      << "the test needs first batches that read a shard the estimate does not look at";

  // "<seconds> <pid> <event> <origin> <block> [<detail>]": a claim that found a shard of its
  // batch closed opens it, between "open-shards" and "opened-shards".
  std::istringstream lines(testing::read_file(trace_path));
  std::string line;
  size_t claims = 0, opens_in_claims = 0;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string seconds, pid, event;
    fields >> seconds >> pid >> event;
    claims += event == "claim";
    opens_in_claims += event == "open-shards";
  }
  EXPECT_GE(claims, 2u);
  EXPECT_EQ(opens_in_claims, 0u) << "the first batches opened shards Loader::create had not";
}

// The same dataset in a bucket of the real S3 server, under a prefix, opened as s3://.
class S3DatasetTest : public RemoteDatasetTest {
 protected:
  void SetUp() override {
    auto bucket = testing::make_test_bucket();
    if (!bucket) GTEST_SKIP() << testing::kNoS3Server;
    RemoteDatasetTest::SetUp();
    testing::upload_directory(*bucket, dir_ / "ds", "team/ds/");
    client_ = std::move(bucket->client);
    bucket_ = bucket->name;
  }

  std::string url(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }

  std::unique_ptr<internal::S3Client> client_;
  std::string bucket_;
};

TEST_F(S3DatasetTest, OpensThroughItsManifestAndLoadsTheSameBatchesAsTheLocalCopy) {
  auto local = Dataset::open(dir_ / "ds");
  ASSERT_TRUE(local.is_ok());
  for (const std::string& where : {url("team/ds"), url("team/ds/"), url("team/ds/manifest.json")}) {
    auto remote = Dataset::open(where);
    ASSERT_TRUE(remote.is_ok()) << where << ": " << remote.status().to_string();
    ASSERT_EQ((*remote)->size(), 120u);
    EXPECT_EQ((*remote)->classes(), (*local)->classes());
    EXPECT_EQ((*remote)->shard_path(0),
              url("team/ds/") + fs::path((*local)->shard_path(0)).filename().string());
  }
  auto remote = Dataset::open(url("team/ds"));
  ASSERT_TRUE(remote.is_ok());
  for (uint64_t i = 0; i < 120; ++i) {
    auto sample = (*remote)->read(i);
    ASSERT_TRUE(sample.is_ok()) << i << ": " << sample.status().to_string();
    EXPECT_EQ(sample->buffer, (*local)->read(i)->buffer) << i;
  }
  EXPECT_EQ(epoch(url("team/ds"), options()), epoch(dir_ / "ds", options()));

  // One shard on its own, by its key.
  const std::string shard_name = fs::path((*local)->shard_path(1)).filename().string();
  auto shard = Dataset::open(url("team/ds/" + shard_name));
  ASSERT_TRUE(shard.is_ok()) << shard.status().to_string();
  auto local_shard = Dataset::open((*local)->shard_path(1));
  ASSERT_TRUE(local_shard.is_ok());
  ASSERT_EQ((*shard)->size(), (*local_shard)->size());
  EXPECT_EQ((*shard)->read(0)->buffer, (*local_shard)->read(0)->buffer);
}

TEST_F(S3DatasetTest, WebDatasetTarsOpenFromABraceListOfS3Urls) {
  const std::string local_list = make_webdataset_tars(dir_.path());
  auto local = Dataset::open(local_list);
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  for (int shard = 0; shard < 3; ++shard) {
    const std::string name = "shard-00" + std::to_string(shard) + ".tar";
    ASSERT_TRUE(client_
                    ->put(bucket_, "team/web/" + name,
                          testing::read_file(dir_ / ("web/" + name)),
                          Deadline::after(std::chrono::seconds(60)))
                    .is_ok());
  }
  auto remote = Dataset::open(url("team/web/shard-{000..002}.tar"));
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  expect_same_samples(**remote, **local);
  EXPECT_EQ(epoch(url("team/web/shard-{000..002}.tar"), options()), epoch(local_list, options()));

  auto missing = Dataset::open(url("team/web/shard-{000..003}.tar"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound) << missing.status().to_string();
  EXPECT_NE(missing.status().message().find("team/web/shard-003.tar"), std::string::npos)
      << missing.status().message();
}

TEST_F(S3DatasetTest, AMissingManifestOrShardIsNamed) {
  auto missing = Dataset::open(url("team/elsewhere"));
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound) << missing.status().to_string();
  EXPECT_NE(missing.status().message().find(url("team/elsewhere/manifest.json")), std::string::npos)
      << missing.status().message();

  auto dataset = Dataset::open(url("team/ds"));
  ASSERT_TRUE(dataset.is_ok());
  const std::string shard_key =
      "team/ds/" + fs::path((*dataset)->shard_path(1)).filename().string();
  ASSERT_TRUE(
      client_->remove(bucket_, shard_key, Deadline::after(std::chrono::seconds(60))).is_ok());
  const uint64_t in_shard_1 = (*dataset)->manifest().shards[0].samples;
  auto sample = (*dataset)->read(in_shard_1);
  ASSERT_FALSE(sample.is_ok());
  EXPECT_EQ(sample.status().code(), ErrorCode::kNotFound) << sample.status().to_string();
  EXPECT_NE(sample.status().message().find(shard_key), std::string::npos)
      << sample.status().message();
  EXPECT_NE(sample.status().message().find(bucket_), std::string::npos)
      << sample.status().message();
  EXPECT_TRUE((*dataset)->read(0).is_ok());  // the other shards still read
}

}  // namespace
}  // namespace zerowait
