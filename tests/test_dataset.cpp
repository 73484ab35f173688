// Dataset::open over every kind of path it accepts, and the errors for what it refuses.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "testing/testing.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/storage/fault_store.hpp"

namespace zerowait {
namespace {
namespace fs = std::filesystem;
using testing::TempDir;

void make_dataset(const TempDir& dir, uint64_t shard_size = 1 << 20) {
  for (int i = 0; i < 30; ++i) {
    testing::write_file(dir / ("src/k" + std::to_string(100 + i) + ".bin"),
                        testing::random_bytes(5000, i));
  }
  auto r = pack({.sources = {dir / "src"}, .out_dir = dir / "ds", .shard_size = shard_size});
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
}

TEST(Dataset, OpensManifestDirectoryShardAndShardDirectory) {
  TempDir dir;
  make_dataset(dir, 40000);
  for (const std::string& path : {dir / "ds", dir / "ds/manifest.json"}) {
    auto ds = Dataset::open(path);
    ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
    EXPECT_EQ((*ds)->size(), 30u);
    EXPECT_GT((*ds)->shard_count(), 2u);
    EXPECT_EQ((*ds)->fields(), std::vector<std::string>{"bin"});
  }
  // Without the manifest the shards themselves are read.
  fs::rename(dir / "ds/manifest.json", dir / "manifest.json.bak");
  auto ds = Dataset::open(dir / "ds");
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ((*ds)->size(), 30u);
  auto s = (*ds)->read(29, {.verify = true});
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->view.key, "k129");
  auto one = Dataset::open(dir / "ds/shard-000000.zws");
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ((*one)->shard_count(), 1u);
}

// WebDataset-style shard lists: a zero-padded range and alternatives, in the order written.
TEST(Dataset, OpensABraceListOfShards) {
  TempDir dir;
  make_dataset(dir, 40000);
  auto whole = Dataset::open(dir / "ds");
  ASSERT_TRUE(whole.is_ok());
  const size_t shards = (*whole)->shard_count();
  ASSERT_GE(shards, 3u);
  auto all =
      Dataset::open(dir / ("ds/shard-{000000..00000" + std::to_string(shards - 1) + "}.zws"));
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  ASSERT_EQ((*all)->size(), 30u);
  for (uint64_t i = 0; i < 30; ++i) EXPECT_EQ((*all)->read(i)->buffer, (*whole)->read(i)->buffer);

  auto two = Dataset::open(dir / "ds/shard-00000{2,0}.zws");
  ASSERT_TRUE(two.is_ok()) << two.status().to_string();
  ASSERT_EQ((*two)->shard_count(), 2u);
  EXPECT_EQ((*two)->shard_path(0), dir / "ds/shard-000002.zws");
  EXPECT_EQ((*two)->shard_path(1), dir / "ds/shard-000000.zws");

  for (const std::string bad :
       {"ds/shard-{000003..000001}.zws", "ds/shard-{a..c}.zws", "ds/shard-{000000..000001.zws"}) {
    auto refused = Dataset::open(dir / bad);
    EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(refused.status().message().find(bad), std::string::npos)
        << refused.status().message();
  }
  auto missing = Dataset::open(dir / "ds/shard-{000000..000099}.zws");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("shard-0000"), std::string::npos)
      << missing.status().message();
}

TEST(Dataset, ShardChangedAfterPackingIsNamed) {
  TempDir dir;
  make_dataset(dir);
  // Replace the shard with a valid shard of different content: the manifest catches it.
  testing::write_file(dir / "src2/k100.bin", "other");
  ASSERT_TRUE(pack({.sources = {dir / "src2"}, .out_dir = dir / "other"}).is_ok());
  fs::copy_file(dir / "other/shard-000000.zws", dir / "ds/shard-000000.zws",
                fs::copy_options::overwrite_existing);
  auto ds = Dataset::open(dir / "ds");
  ASSERT_TRUE(ds.is_ok());  // opening reads the manifest only
  auto s = (*ds)->read(0);
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(s.status().message().find("shard-000000.zws"), std::string::npos);
}

TEST(Dataset, MissingAndMalformedPaths) {
  TempDir dir;
  auto missing = Dataset::open(dir / "nope");
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
  fs::create_directories(dir / "empty");
  EXPECT_EQ(Dataset::open(dir / "empty").status().code(), ErrorCode::kNotFound);
  testing::write_file(dir / "bad/manifest.json", "{not json");
  auto bad = Dataset::open(dir / "bad");
  EXPECT_EQ(bad.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(bad.status().message().find("manifest.json"), std::string::npos);
  testing::write_file(
      dir / "v2/manifest.json",
      R"({"format":"zerowait-dataset","version":2,"samples":0,"bytes":0,"shards":[]})");
  EXPECT_EQ(Dataset::open(dir / "v2").status().code(), ErrorCode::kUnsupported);
  testing::write_file(dir / "esc/manifest.json",
                      R"({"format":"zerowait-dataset","version":1,"samples":0,"bytes":0,)"
                      R"("shards":[{"path":"../x.zws","samples":0,"bytes":0}]})");
  EXPECT_EQ(Dataset::open(dir / "esc").status().code(), ErrorCode::kCorrupt);
}

// Counts that are not integers of the field's width (a fuzzer found 5.5e22) are a corrupt
// manifest naming the field, not a number converted with undefined behaviour or wrapped.
TEST(Dataset, ManifestCountsThatDoNotFitAreCorrupt) {
  TempDir dir;
  for (const char* samples : {"5.55556e+22", "-1", "1.5", "18446744073709551616", "\"3\""}) {
    testing::write_file(dir / "m/manifest.json",
                        std::string(R"({"format":"zerowait-dataset","version":1,"samples":)") +
                            samples + R"(,"bytes":0,"shards":[]})");
    auto ds = Dataset::open(dir / "m");
    EXPECT_EQ(ds.status().code(), ErrorCode::kCorrupt) << samples;
    EXPECT_NE(ds.status().message().find("manifest.json"), std::string::npos) << samples;
  }
  testing::write_file(dir / "m/manifest.json",
                      R"({"format":"zerowait-dataset","version":4294967297,"samples":0,)"
                      R"("bytes":0,"shards":[]})");
  EXPECT_EQ(Dataset::open(dir / "m").status().code(), ErrorCode::kCorrupt);
}

TEST(Dataset, MissingShardIsNamedOnFirstUse) {
  TempDir dir;
  make_dataset(dir);
  fs::remove(dir / "ds/shard-000000.zws");
  auto ds = Dataset::open(dir / "ds");
  ASSERT_TRUE(ds.is_ok());
  auto s = (*ds)->read(0);
  EXPECT_EQ(s.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(s.status().message().find("shard-000000.zws"), std::string::npos);
}

// open_shards opens shards together (a remote shard's opening costs round trips), each once even
// when listed twice and asked for by two threads at once; a shard that fails is named.
TEST(Dataset, OpenShardsOpensTogetherAndEachOnce) {
  TempDir dir;
  make_dataset(dir, 40000);
  // Each open waits until a second open has begun (or 30 s): one-at-a-time opening would make
  // every open wait the whole time, and the test would fail on the flag below.
  std::mutex mutex;
  std::condition_variable changed;
  int began = 0;
  std::atomic<bool> waited_alone{false};
  // The dataset is read through a FaultStore whose rule holds each shard's open back.
  auto store = std::make_shared<FaultStore>(make_local_store(dir.path()));
  store->set_rule([&](const StoreOperation& operation) {
    if (operation.kind != "open") return Fault{};
    std::unique_lock<std::mutex> lock(mutex);
    ++began;
    changed.notify_all();
    if (!changed.wait_for(lock, std::chrono::seconds(30), [&] { return began >= 2; })) {
      waited_alone = true;
    }
    return Fault{};
  });
  auto ds = Dataset::open("ds", {.store = store});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  const size_t shards = (*ds)->shard_count();
  ASSERT_GE(shards, 3u);
  std::vector<size_t> list;
  for (size_t s = 0; s < shards; ++s) list.push_back(s);
  list.push_back(0);
  Status first = Status::ok(), second = Status::ok();
  std::thread other([&] { second = (*ds)->open_shards(list); });
  first = (*ds)->open_shards(list);
  other.join();
  ASSERT_TRUE(first.is_ok()) << first.to_string();
  ASSERT_TRUE(second.is_ok()) << second.to_string();
  EXPECT_FALSE(waited_alone) << "shards were opened one after another";
  EXPECT_EQ((*ds)->index_use().opens, shards);
  for (size_t s = 0; s < shards; ++s) EXPECT_NE((*ds)->shard_if_open(s), nullptr) << s;

  fs::remove(dir / "ds/shard-000001.zws");
  auto fresh = Dataset::open(dir / "ds");
  ASSERT_TRUE(fresh.is_ok());
  Status missing = (*fresh)->open_shards(list);
  EXPECT_EQ(missing.code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.message().find("shard-000001.zws"), std::string::npos) << missing.to_string();
  EXPECT_NE((*fresh)->shard_if_open(2), nullptr) << "the other shards still open";
}

// Every byte a dataset reads goes through its store: a FaultStore under it fails the manifest's
// read, fails a sample's read (EIO) or cuts it short, and each error names the object.
TEST(Dataset, FaultsUnderItsStoreAreNamed) {
  TempDir dir;
  make_dataset(dir);
  auto store = std::make_shared<FaultStore>(make_local_store(dir.path()));
  store->set_rule([](const StoreOperation& operation) {
    return operation.kind == "get" ? Fault{Fault::Kind::kError, EIO} : Fault{};
  });
  auto refused = Dataset::open("ds", {.store = store});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kIo) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("ds/manifest.json"), std::string::npos)
      << refused.status().message();

  store->set_rule(nullptr);
  auto ds = Dataset::open("ds", {.store = store});
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  ASSERT_TRUE((*ds)->shard(0).is_ok());  // its footer and index read
  const uint64_t at = (*(*ds)->shard(0))->index().samples[0].offset;
  for (const Fault::Kind kind : {Fault::Kind::kError, Fault::Kind::kShortRead}) {
    store->set_read_fault_rule([kind](const std::string&, uint64_t, uint64_t) {
      return Fault{kind, EIO};
    });
    auto sample = (*ds)->read(0);
    ASSERT_FALSE(sample.is_ok());
    EXPECT_EQ(sample.status().code(),
              kind == Fault::Kind::kError ? ErrorCode::kIo : ErrorCode::kCorrupt)
        << sample.status().to_string();
    EXPECT_NE(sample.status().message().find(dir / "ds/shard-000000.zws"), std::string::npos)
        << sample.status().message();
    if (kind == Fault::Kind::kError) {  // a short read names where the bytes ran out
      EXPECT_NE(sample.status().message().find(std::to_string(at)), std::string::npos)
          << sample.status().message();
    }
  }
  store->set_rule(nullptr);
  EXPECT_TRUE((*ds)->read(0).is_ok());
}

TEST(Dataset, WebDatasetTarDirectory) {
  TempDir dir;
  testing::write_file(dir / "t/a.txt", "A");
  testing::write_file(dir / "t/a.cls", "1");
  testing::write_file(dir / "t/b.txt", "B");
  fs::create_directories(dir / "tars");
  ASSERT_EQ(testing::run_command({"/bin/tar", "-cf", dir / "tars/part-0.tar", "-C", dir / "t",
                                  "a.txt", "a.cls", "b.txt"})
                .exit_code,
            0)
      << "tar failed";
  auto ds = Dataset::open(dir / "tars");
  ASSERT_TRUE(ds.is_ok()) << ds.status().to_string();
  EXPECT_EQ((*ds)->size(), 2u);
  auto s = (*ds)->read(0);
  ASSERT_TRUE(s.is_ok());
  EXPECT_EQ(s->view.key, "a");
  EXPECT_EQ(s->view.fields.size(), 2u);
}

}  // namespace
}  // namespace zerowait
