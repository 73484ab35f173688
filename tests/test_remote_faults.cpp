// Remote reads under faults: a packed dataset in a bucket of the real S3 server ctest starts
// (Ceph RGW, tests/s3/rgw.sh), read through the fault proxy (tests/testing/fault_proxy), which
// answers 500/503 instead of the server, resets connections before and in the middle of a body,
// and stalls answers mid-body. Retries hide what retrying can fix; what it cannot ends within the
// read's deadline with an error naming the object and the range; no byte of a cut answer is ever
// delivered or cached; and processes sharing a cache download each block once, counted at the
// proxy, which sees every request that reaches the server.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "testing/child_processes.hpp"
#include "testing/fault_proxy.hpp"
#include "testing/image_dataset.hpp"
#include "testing/s3_server.hpp"
#include "testing/testing.hpp"
#include "zerowait/storage/block_cache.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"

namespace zerowait {
namespace {

using namespace std::chrono_literals;
using testing::FaultProxy;
using testing::TempDir;
namespace fs = std::filesystem;

using Clock = std::chrono::steady_clock;

// Seconds since `start`.
double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// 120 synthetic JPEGs in a few shards, uploaded under ds/, and a proxy in front of the server
// that every s3:// URL of the test goes through.
class RemoteFaultsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bucket = testing::make_test_bucket();
    if (!bucket) GTEST_SKIP() << testing::kNoS3Server;
    shards_ = testing::pack_image_dataset(dir_.path(), dir_ / "ds");
    ASSERT_GT(shards_, 2u);
    testing::upload_directory(*bucket, dir_ / "ds", "ds/");
    bucket_ = bucket->name;
    proxy_ = std::make_unique<FaultProxy>(bucket->env.at("AWS_ENDPOINT_URL"));
    std::map<std::string, std::string> through_proxy = bucket->env;
    through_proxy["AWS_ENDPOINT_URL"] = proxy_->url();
    testing::export_test_s3_env(through_proxy);
    auto local = Dataset::open(dir_ / "ds");
    ASSERT_TRUE(local.is_ok()) << local.status().to_string();
    local_ = *local;
  }

  std::string url() const { return "s3://" + bucket_ + "/ds/"; }

  std::shared_ptr<Dataset> open_remote(const DatasetOptions& options = {}) {
    auto remote = Dataset::open(url(), options);
    EXPECT_TRUE(remote.is_ok()) << remote.status().to_string();
    return remote.is_ok() ? *remote : nullptr;
  }

  BlockCacheOptions cache_options() const {
    BlockCacheOptions o;
    o.directory = dir_ / "cache";
    o.capacity_bytes = 64 << 20;
    o.min_free_bytes = 0;
    o.block_bytes = 16 << 10;  // several blocks per shard
    o.prefetch_threads = 0;
    return o;
  }

  // GETs of shard bytes the server answered in full, by path and range. `block_bytes`: only
  // those of whole cache blocks of this size (a shard's last block may be shorter), not the
  // ranges of headers, footers and indexes that opening a shard asks for alone.
  std::map<std::string, int> shard_gets(uint64_t block_bytes = 0) const {
    std::map<std::string, int> by_range;
    for (const FaultProxy::Exchange& e : proxy_->log()) {
      if (e.method != "GET" || e.faulted || e.path.find(".zws") == std::string::npos) continue;
      if (block_bytes != 0) {
        const uint64_t first = std::stoull(e.range.substr(e.range.find('=') + 1));
        const uint64_t last = std::stoull(e.range.substr(e.range.find('-') + 1));
        if (first % block_bytes != 0 || (first == 0 && last + 1 != block_bytes)) continue;
      }
      ++by_range[e.path + " " + e.range];
    }
    return by_range;
  }

  uint64_t faulted() const {
    uint64_t n = 0;
    for (const FaultProxy::Exchange& e : proxy_->log()) n += e.faulted;
    return n;
  }

  TempDir dir_;
  uint64_t shards_ = 0;
  std::string bucket_;
  std::unique_ptr<FaultProxy> proxy_;
  std::shared_ptr<Dataset> local_;
};

// 503 SlowDown, 500, a reset before the answer and a reset in the middle of a body, each on a
// different read: the client retries each and every sample read equals the local copy.
TEST_F(RemoteFaultsTest, ServerErrorsAndResetsAreRetriedAndEverySampleIsExact) {
  auto remote = open_remote();
  ASSERT_NE(remote, nullptr);
  const std::vector<FaultProxy::Fault> faults = {
      {.method = "GET", .path_contains = ".zws", .status = 503},
      {.method = "GET", .path_contains = ".zws", .status = 500},
      {.method = "GET", .path_contains = ".zws", .reset = true},
      {.method = "GET", .path_contains = ".zws", .reset = true, .mid_body = true},
  };
  for (uint64_t i = 0; i < remote->size(); ++i) {
    if (i % 30 == 0) proxy_->fail_next(faults[i / 30]);  // one fault every 30 samples
    auto sample = remote->read(i, {.deadline = Deadline::after(30s)});
    ASSERT_TRUE(sample.is_ok()) << i << ": " << sample.status().to_string();
    EXPECT_EQ(sample->buffer, local_->read(i)->buffer) << i;
  }
  EXPECT_EQ(faulted(), 4u);
  // The cut answer sent half its body before the reset; the retry of that range was whole.
  bool saw_cut = false;
  for (const FaultProxy::Exchange& e : proxy_->log()) {
    if (e.faulted && e.body_bytes > 0) saw_cut = true;
  }
  EXPECT_TRUE(saw_cut);
}

// A fault that retrying cannot fix ends the read within its deadline with an error naming the
// bucket, the key, the range and what the server said, and never with a part of the bytes.
TEST_F(RemoteFaultsTest, PersistentFaultsEndWithinTheDeadlineNamingTheObjectAndRange) {
  auto remote = open_remote();
  ASSERT_NE(remote, nullptr);
  ASSERT_TRUE(remote->read(0).is_ok());  // the shard's index is read: what follows is sample reads
  struct Case {
    const char* what;
    FaultProxy::Fault fault;
    std::vector<std::string> named;  // in the error, besides the object and the range
  };
  const std::vector<Case> cases = {
      {"500 every time", {.method = "GET", .path_contains = ".zws", .status = 500},
       {"500 InternalError"}},
      {"503 every time", {.method = "GET", .path_contains = ".zws", .status = 503},
       {"503 SlowDown"}},
      {"reset every time", {.method = "GET", .path_contains = ".zws", .reset = true}, {}},
      {"stalled mid-body", {.method = "GET", .path_contains = ".zws", .mid_body = true,
                            .stall = 1h}, {"deadline"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    proxy_->clear_faults();
    proxy_->fail_always(c.fault);
    const auto start = Clock::now();
    auto sample = remote->read(1, {.deadline = Deadline::after(4s)});
    const double took = since(start);
    ASSERT_FALSE(sample.is_ok());
    const std::string message = sample.status().message();
    EXPECT_NE(message.find("s3://" + bucket_ + "/ds/shard-"), std::string::npos) << message;
    EXPECT_NE(message.find("bytes="), std::string::npos) << message;
    for (const std::string& word : c.named) {
      EXPECT_NE(message.find(word), std::string::npos) << message;
    }
    // Bounded, not timed: the deadline plus room for a loaded machine, far below a hang.
    EXPECT_LT(took, 30.0) << message;
  }
  proxy_->clear_faults();
  auto sample = remote->read(1);
  ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
  EXPECT_EQ(sample->buffer, local_->read(1)->buffer);
  // The proxy's log times every exchange (zw_fault_proxy --log-requests prints them).
  for (const FaultProxy::Exchange& e : proxy_->log()) {
    EXPECT_GT(e.began_s, 0.0) << e.method << " " << e.path;
    EXPECT_LE(e.began_s, e.ended_s) << e.method << " " << e.path;
  }
}

// A loader whose reads of one shard stall: every next() returns within its timeout or the read
// deadline, the failed batches name the shard, and every batch that arrives holds exactly the
// local bytes.
TEST_F(RemoteFaultsTest, ALoaderOverStalledReadsNeverHangsAndDeliversOnlyWholeSamples) {
  auto remote = open_remote();
  ASSERT_NE(remote, nullptr);
  LoaderOptions o;
  o.batch_size = 16;
  o.threads = 2;
  o.fields = {"jpg"};
  o.read_timeout = 2s;
  o.shuffle.mode = ShuffleMode::kNone;  // so that the batches of the other shards arrive
  auto loader = Loader::create(remote, o);
  ASSERT_TRUE(loader.is_ok()) << loader.status().to_string();
  // Every GET of one shard stalls mid-body for an hour.
  proxy_->fail_always({.method = "GET", .path_contains = "shard-000001", .mid_body = true,
                       .stall = 1h});
  std::vector<Status> errors;
  uint64_t samples = 0;
  const auto start = Clock::now();
  for (int calls = 0; calls < 40; ++calls) {
    const auto call = Clock::now();
    auto batch = (*loader)->next(Deadline::after(10s));
    EXPECT_LT(since(call), 30.0);
    if (!batch.is_ok()) {
      errors.push_back(batch.status());
      continue;
    }
    if (*batch == nullptr) break;
    const BatchColumn* index = (*batch)->column("__index__");
    const BatchColumn* jpg = (*batch)->column("jpg");
    const BatchColumn* offsets = (*batch)->column("jpg.offsets");
    ASSERT_NE(offsets, nullptr);
    const auto* at = reinterpret_cast<const int64_t*>(offsets->data);
    for (int64_t r = 0; r < index->shape[0]; ++r) {
      const auto global = static_cast<uint64_t>(reinterpret_cast<const int64_t*>(index->data)[r]);
      auto expected = local_->read(global);
      ASSERT_TRUE(expected.is_ok());
      const FieldView* field = expected->view.field("jpg");
      ASSERT_NE(field, nullptr);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(jpg->data) + at[r],
                            static_cast<size_t>(at[r + 1] - at[r])),
                std::string(reinterpret_cast<const char*>(field->bytes.data()),
                            field->bytes.size()))
          << "sample " << global;
      ++samples;
    }
  }
  EXPECT_LT(since(start), 300.0);
  ASSERT_FALSE(errors.empty()) << "no read met the stalled shard";
  for (const Status& error : errors) {
    EXPECT_NE(error.message().find("shard-000001"), std::string::npos) << error.to_string();
  }
  EXPECT_GT(samples, 0u);     // the batches of the other shards
  EXPECT_LT(samples, 120u);  // not those that read the stalled one
}

// Fills cut by resets and stalls never publish a block: after the faults, every read through
// the cache equals the local copy, no block was found damaged, and nothing is left in tmp/.
TEST_F(RemoteFaultsTest, CacheFillsCutByFaultsNeverPublishAPartialBlock) {
  auto cache = BlockCache::open(cache_options());
  ASSERT_TRUE(cache.is_ok()) << cache.status().to_string();
  DatasetOptions options;
  options.cache = *cache;
  auto remote = open_remote(options);
  ASSERT_NE(remote, nullptr);
  proxy_->fail_next({.method = "GET", .path_contains = ".zws", .reset = true, .mid_body = true},
                    3);
  proxy_->fail_next({.method = "GET", .path_contains = ".zws", .mid_body = true, .stall = 1h});
  int failed = 0;
  for (uint64_t i = 0; i < remote->size(); ++i) {
    auto sample = remote->read(i, {.deadline = Deadline::after(3s)});
    if (!sample.is_ok()) {
      ++failed;
      continue;
    }
    EXPECT_EQ(sample->buffer, local_->read(i)->buffer) << i;
  }
  EXPECT_GE(faulted(), 4u);
  EXPECT_LE(failed, 4);  // the stalled fill's deadline (and the samples waiting on it)
  proxy_->clear_faults();
  for (uint64_t i = 0; i < remote->size(); ++i) {
    auto sample = remote->read(i, {.deadline = Deadline::after(30s)});
    ASSERT_TRUE(sample.is_ok()) << i << ": " << sample.status().to_string();
    EXPECT_EQ(sample->buffer, local_->read(i)->buffer) << i;
  }
  const BlockCacheStats stats = (*cache)->stats();
  EXPECT_EQ(stats.damaged, 0u);
  EXPECT_GT(stats.hits, 0u);
  uint64_t tmp_files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir_ / "cache/tmp")) {
    tmp_files += e.is_regular_file();
  }
  EXPECT_EQ(tmp_files, 0u);
}

// Two processes reading the whole dataset through one cache directory: every block of every
// shard reaches the server once, as the proxy counts, and the cache stays under its cap. The
// first shard GET is held at the proxy for 3 s and the second process starts only once it is
// held, so the second must wait for the first's block (its `waits` counter) rather than find it
// on disk, as it would if the two ran one after the other.
TEST_F(RemoteFaultsTest, TwoProcessesSharingACacheDownloadEachBlockOnceCountedAtTheProxy) {
  BlockCacheOptions o = cache_options();
  uint64_t dataset_bytes = 0;
  for (const auto& e : fs::directory_iterator(dir_ / "ds")) dataset_bytes += e.file_size();
  o.capacity_bytes = 2 * dataset_bytes;
  // Made by the parent, so the children agree on the layout from the start.
  ASSERT_TRUE(BlockCache::open(o).is_ok());
  // Each child reads every sample and leaves its counters in a file: "misses waits".
  // The first opens its first shard (header and index, asked for alone), says so in the file
  // "opened" and waits for "read", made once its next shard GET, block 0's, is set to be held.
  // The second waits for the file "go" the test makes once the first's GET is held.
  auto reader = [&](const std::string& name) {
    return [&, name] {
      if (name == "second" && !testing::wait_for_file(dir_ / "go", 30s)) return 4;
      auto cache = BlockCache::open(o);
      if (!cache.is_ok()) return 2;
      DatasetOptions options;
      options.cache = *cache;
      auto remote = Dataset::open(url(), options);
      if (!remote.is_ok()) return 3;
      if (name == "first") {
        if (!(*remote)->shard(0).is_ok()) return 5;
        testing::write_file(dir_ / "opened", "");
        if (!testing::wait_for_file(dir_ / "read", 30s)) return 4;
      }
      for (uint64_t i = 0; i < (*remote)->size(); ++i) {
        auto sample = (*remote)->read(i, {.deadline = Deadline::after(30s)});
        if (!sample.is_ok() || sample->buffer != local_->read(i)->buffer) return 1;
      }
      const BlockCacheStats s = (*cache)->stats();
      testing::write_file(dir_ / name, std::to_string(s.misses) + " " + std::to_string(s.waits));
      return 0;
    };
  };
  testing::ChildProcesses children;
  const pid_t first_pid = children.add(reader("first"));
  const pid_t second_pid = children.add(reader("second"));
  children.start();
  ASSERT_TRUE(testing::wait_for_file(dir_ / "opened", 30s));
  proxy_->fail_next({.method = "GET", .path_contains = ".zws", .stall = 3000ms});
  testing::write_file(dir_ / "read", "");
  const Clock::time_point start = Clock::now();
  while (proxy_->faults_applied() == 0 && since(start) < 30) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(proxy_->faults_applied(), 1u) << "the first process's first shard GET is held";
  testing::write_file(dir_ / "go", "");
  EXPECT_EQ(children.wait(first_pid), 0);
  EXPECT_EQ(children.wait(second_pid), 0);
  const auto gets = shard_gets(o.block_bytes);
  EXPECT_GE(gets.size(), shards_ * 2);  // several blocks per shard
  for (const auto& [request, count] : gets) EXPECT_EQ(count, 1) << request;
  uint64_t misses[2] = {}, waits[2] = {};
  for (int c = 0; c < 2; ++c) {
    std::istringstream in(testing::read_file(dir_ / (c == 0 ? "first" : "second")));
    in >> misses[c] >> waits[c];
  }
  EXPECT_EQ(misses[0] + misses[1], gets.size());
  EXPECT_GE(waits[1], 1u) << "the second process did not wait for the first's block";
  auto cache = BlockCache::open(o);
  ASSERT_TRUE(cache.is_ok());
  EXPECT_LE((*cache)->stats().usage_bytes, o.capacity_bytes);
  EXPECT_GT((*cache)->stats().usage_bytes, 0u);
}

}  // namespace
}  // namespace zerowait
