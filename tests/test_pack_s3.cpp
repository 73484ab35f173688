// pack() to s3://BUCKET/PREFIX against the real S3 server ctest starts (Ceph RGW,
// tests/s3/rgw.sh): every shard is uploaded under a hash-named key prefix, byte for byte the
// shard a local pack writes, and the manifest last, so Dataset::open reads the dataset with no
// listing and sees the local pack's samples; a large shard goes up in parts; an existing dataset
// is refused or replaced; a missing bucket, a failing upload and a wrong secret are named and
// leave no manifest; nothing stays in the spool directory; the command does the same. Parts
// packed to one prefix (`--part I/N`) merge there into the samples of one pack.
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "storage/s3/s3_client.hpp"
#include "testing/s3_server.hpp"
#include "testing/testing.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/pack.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using testing::TempDir;

bool is_hex(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

class PackS3Test : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bucket = testing::make_test_bucket();
    if (!bucket) GTEST_SKIP() << testing::kNoS3Server;
    env_ = bucket->env;
    client_ = std::move(bucket->client);
    bucket_ = bucket->name;
    // 60 samples of two fields over three classes, and one input that is not a JPEG.
    for (int i = 0; i < 60; ++i) {
      const std::string stem =
          dir_ / ("src/class" + std::to_string(i % 3) + "/" + std::to_string(1000 + i));
      testing::write_file(stem + ".jpg", testing::make_jpeg(32, 24, i));
      testing::write_file(stem + ".txt", testing::random_bytes(3000 + 97 * i, i));
    }
    testing::write_file(dir_ / "src/class1/broken.jpg", "not a jpeg");
  }

  PackOptions options(const std::string& out_dir) const {
    PackOptions o;
    o.sources = {dir_ / "src"};
    o.out_dir = out_dir;
    o.shard_size = 24 << 10;  // several shards
    o.threads = 1;
    o.sync = false;
    o.tmp_dir = spool_.path();
    return o;
  }

  std::string url(const std::string& key) const { return "s3://" + bucket_ + "/" + key; }

  // Key -> size of every object under `prefix`.
  std::map<std::string, uint64_t> objects(const std::string& prefix) const {
    auto listed = client_->list(bucket_, prefix, Deadline::after(60s));
    EXPECT_TRUE(listed.is_ok()) << listed.status().to_string();
    std::map<std::string, uint64_t> out;
    if (listed.is_ok()) {
      for (const auto& object : *listed) out[object.key] = object.size;
    }
    return out;
  }

  bool spool_is_empty() const { return fs::is_empty(spool_.path()); }

  TempDir dir_;
  TempDir spool_;
  std::map<std::string, std::string> env_;
  std::unique_ptr<internal::S3Client> client_;
  std::string bucket_;
};

TEST_F(PackS3Test, ShardsGoUnderHashedPrefixesAndTheDatasetReadsAsTheLocalPack) {
  auto local_report = pack(options(dir_ / "local"));
  ASSERT_TRUE(local_report.is_ok()) << local_report.status().to_string();
  auto report = pack(options(url("team/ds")));
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_GT(report->shards, 3u);
  EXPECT_EQ(report->shards, local_report->shards);
  EXPECT_EQ(report->samples, 60u);
  EXPECT_EQ(report->bytes_out, local_report->bytes_out);
  EXPECT_EQ(report->manifest_path, url("team/ds/manifest.json"));
  ASSERT_EQ(report->quarantined.size(), 1u);
  EXPECT_TRUE(spool_is_empty()) << "every spooled shard is removed once uploaded";

  // Every shard under PREFIX/<4 hex digits>/, as the manifest lists it, byte for byte the local
  // pack's shard of the same name; the shards spread over more than one prefix.
  auto manifest_text = client_->get(bucket_, "team/ds/manifest.json", Deadline::after(60s));
  ASSERT_TRUE(manifest_text.is_ok()) << manifest_text.status().to_string();
  auto manifest = Manifest::parse(*manifest_text, "manifest.json");
  ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  auto local_manifest = Manifest::load(dir_ / "local/manifest.json");
  ASSERT_TRUE(local_manifest.is_ok());
  ASSERT_EQ(manifest->shards.size(), local_manifest->shards.size());
  std::set<std::string> keys = {"team/ds/manifest.json", "team/ds/quarantine.json"};
  std::set<std::string> hash_prefixes;
  for (size_t i = 0; i < manifest->shards.size(); ++i) {
    const std::string& path = manifest->shards[i].path;
    const std::string& local_name = local_manifest->shards[i].path;
    EXPECT_EQ(path.size(), 5 + local_name.size()) << path;
    EXPECT_TRUE(is_hex(path.substr(0, 4)) && path[4] == '/' && path.ends_with("/" + local_name))
        << path;
    EXPECT_EQ(manifest->shards[i].checksum, local_manifest->shards[i].checksum) << path;
    hash_prefixes.insert(path.substr(0, 4));
    keys.insert("team/ds/" + path);
    auto shard = client_->get(bucket_, "team/ds/" + path, Deadline::after(60s));
    ASSERT_TRUE(shard.is_ok()) << shard.status().to_string();
    EXPECT_EQ(*shard, testing::read_file(dir_ / ("local/" + local_name))) << path;
  }
  EXPECT_GT(hash_prefixes.size(), 1u);
  std::set<std::string> listed;
  for (const auto& [key, size] : objects("team/")) listed.insert(key);
  EXPECT_EQ(listed, keys);

  // Opened by its prefix (one GET of the manifest), every sample is the local pack's.
  auto remote = Dataset::open(url("team/ds"));
  ASSERT_TRUE(remote.is_ok()) << remote.status().to_string();
  auto local = Dataset::open(dir_ / "local");
  ASSERT_TRUE(local.is_ok()) << local.status().to_string();
  ASSERT_EQ((*remote)->size(), 60u);
  EXPECT_EQ((*remote)->classes(), (*local)->classes());
  EXPECT_EQ((*remote)->shard_path(0), url("team/ds/" + manifest->shards[0].path));
  for (uint64_t i = 0; i < 60; ++i) {
    auto sample = (*remote)->read(i, {.verify = true});
    ASSERT_TRUE(sample.is_ok()) << i << ": " << sample.status().to_string();
    EXPECT_EQ(sample->buffer, (*local)->read(i)->buffer) << i;
  }
}

TEST_F(PackS3Test, ALargeShardGoesUpInPartsAndReadsBack) {
  TempDir big;
  // One sample just over the multipart threshold (64 MiB), so its shard is a multipart upload.
  const std::string payload = testing::random_bytes((64 << 20) + 12345, 7);
  testing::write_file(big / "src/huge.bin", payload);
  PackOptions o = options(url("big"));
  o.sources = {big / "src"};
  auto report = pack(o);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  ASSERT_EQ(report->shards, 1u);
  EXPECT_TRUE(spool_is_empty());
  auto dataset = Dataset::open(url("big/"));
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  const std::string key = "big/" + dataset.value()->manifest().shards[0].path;
  auto head = client_->head(bucket_, key, Deadline::after(60s));
  ASSERT_TRUE(head.is_ok()) << head.status().to_string();
  EXPECT_NE(head->etag.find('-'), std::string::npos) << "a multipart ETag: " << head->etag;
  auto sample = (*dataset)->read(0, {.verify = true});
  ASSERT_TRUE(sample.is_ok()) << sample.status().to_string();
  ASSERT_EQ(sample->view.fields.size(), 1u);
  EXPECT_TRUE(sample->view.fields[0].bytes.size() == payload.size() &&
              std::memcmp(sample->view.fields[0].bytes.data(), payload.data(), payload.size()) ==
                  0);
}

TEST_F(PackS3Test, AnExistingDatasetIsRefusedOrReplacedWithItsStaleShardsGone) {
  ASSERT_TRUE(pack(options(url("ds"))).is_ok());
  auto again = pack(options(url("ds")));
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kAlreadyExists) << again.status().to_string();
  EXPECT_NE(again.status().message().find(url("ds/manifest.json")), std::string::npos)
      << again.status().message();

  // Fewer, larger shards replace the old ones: the old shards no manifest lists are removed.
  PackOptions o = options(url("ds"));
  o.overwrite = true;
  o.shard_size = 1 << 20;
  auto replaced = pack(o);
  ASSERT_TRUE(replaced.is_ok()) << replaced.status().to_string();
  ASSERT_EQ(replaced->shards, 1u);
  auto dataset = Dataset::open(url("ds"));
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  EXPECT_EQ((*dataset)->size(), 60u);
  const std::map<std::string, uint64_t> left = objects("ds/");
  EXPECT_EQ(left.size(), 3u);  // manifest, quarantine, one shard
  EXPECT_EQ(left.count("ds/" + (*dataset)->manifest().shards[0].path), 1u);
}

TEST_F(PackS3Test, AMissingBucketOrAFailingUploadIsNamedAndLeavesNoManifest) {
  const std::string missing = bucket_ + "-missing";
  auto no_bucket = pack(options("s3://" + missing + "/ds"));
  ASSERT_FALSE(no_bucket.is_ok());
  EXPECT_EQ(no_bucket.status().code(), ErrorCode::kNotFound) << no_bucket.status().to_string();
  EXPECT_NE(no_bucket.status().message().find("s3://" + missing + "/ds"), std::string::npos)
      << no_bucket.status().message();
  EXPECT_NE(no_bucket.status().message().find("NoSuchBucket"), std::string::npos)
      << no_bucket.status().message();
  EXPECT_TRUE(spool_is_empty());

  // A prefix so long that no shard key under it is accepted (S3 and RGW take keys of at most
  // 1024 bytes): the first upload fails, naming its key, and no manifest is written.
  const std::string long_prefix = "long/" + std::string(1010, 'p');
  auto failed = pack(options(url(long_prefix)));
  ASSERT_FALSE(failed.is_ok());
  EXPECT_NE(failed.status().message().find(url(long_prefix) + "/"), std::string::npos)
      << failed.status().message();
  EXPECT_NE(failed.status().message().find("/shard-000000.zws"), std::string::npos)
      << failed.status().message();
  EXPECT_TRUE(objects("long/").empty());
  EXPECT_TRUE(spool_is_empty());
}

// `pack --part I/N -o s3://BUCKET/PREFIX` on four "machines", then merge_parts on the prefix:
// the parts land in PREFIX/part-IIII-of-0004/ (shards under hashed prefixes there), merge finds
// them with one listing, refuses while one is missing, and the merged dataset holds the samples
// of one pack in its order; repacking a part takes the merged manifest down.
TEST_F(PackS3Test, FourPartsPackedToABucketMergeThereIntoTheSamplesOfOnePack) {
  ASSERT_TRUE(pack(options(dir_ / "whole")).is_ok());
  PackOptions parts = options(url("team/parts"));
  parts.part_count = 4;
  for (uint32_t i = 0; i < 4; ++i) {
    if (i == 3) {
      const Status missing = merge_parts({.out_dir = url("team/parts")}).status();
      EXPECT_EQ(missing.code(), ErrorCode::kNotFound) << missing.to_string();
      EXPECT_NE(missing.message().find("1 of 4 parts missing (3)"), std::string::npos)
          << missing.to_string();
    }
    parts.part_index = i;
    auto report = pack(parts);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    EXPECT_EQ(report->manifest_path,
              url("team/parts/" + pack_part_dir_name(i, 4) + "/manifest.json"));
  }
  EXPECT_TRUE(spool_is_empty());

  auto report = merge_parts({.out_dir = url("team/parts")});
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->part_count, 4u);
  EXPECT_EQ(report->manifest_path, url("team/parts/manifest.json"));
  EXPECT_EQ(report->parts[2].dir, "part-0002-of-0004");

  auto merged = Dataset::open(url("team/parts"));
  ASSERT_TRUE(merged.is_ok()) << merged.status().to_string();
  auto whole = Dataset::open(dir_ / "whole");
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  ASSERT_EQ((*merged)->size(), (*whole)->size());
  EXPECT_EQ((*merged)->classes(), (*whole)->classes());
  for (uint64_t i = 0; i < (*whole)->size(); ++i) {
    auto sample = (*merged)->read(i, {.verify = true});
    ASSERT_TRUE(sample.is_ok()) << i << ": " << sample.status().to_string();
    EXPECT_EQ(sample->buffer, (*whole)->read(i)->buffer) << i;
  }
  const std::string first_shard = (*merged)->shard_path(0);
  EXPECT_TRUE(first_shard.starts_with(url("team/parts/part-0000-of-0004/"))) << first_shard;

  const Status again = merge_parts({.out_dir = url("team/parts")}).status();
  EXPECT_EQ(again.code(), ErrorCode::kAlreadyExists) << again.to_string();
  EXPECT_TRUE(merge_parts({.out_dir = url("team/parts"), .overwrite = true}).is_ok());
  const Status outside =
      merge_parts({.out_dir = url("team/parts"),
                   .parts = {url("team/elsewhere/part-0000-of-0004")},
                   .overwrite = true})
          .status();
  EXPECT_EQ(outside.code(), ErrorCode::kInvalidArgument) << outside.to_string();
  EXPECT_NE(outside.message().find("is not inside the merge output"), std::string::npos)
      << outside.to_string();

  // A part packed again takes the merged manifest down first: it would list the old shards.
  parts.part_index = 1;
  parts.overwrite = true;
  ASSERT_TRUE(pack(parts).is_ok());
  EXPECT_EQ(objects("team/parts/manifest.json").size(), 0u);
  parts.overwrite = false;
  const Status refused = pack(parts).status();
  EXPECT_EQ(refused.code(), ErrorCode::kAlreadyExists) << refused.to_string();
}

TEST_F(PackS3Test, TheCommandPacksToS3AndNamesWhatFails) {
  const std::string tmp = "--tmp=" + spool_.path();
  auto packed = testing::run_cli({"pack", dir_ / "src", "-o", url("cli/ds"), "--shard-size", "24K",
                                  "--threads", "1", tmp, "--json"});
  EXPECT_EQ(packed.exit_code, 3) << packed.err;  // one quarantined input
  EXPECT_NE(packed.out.find(url("cli/ds/manifest.json")), std::string::npos) << packed.out;
  auto dataset = Dataset::open(url("cli/ds"));
  ASSERT_TRUE(dataset.is_ok()) << dataset.status().to_string();
  EXPECT_EQ((*dataset)->size(), 60u);

  // A wrong secret: refused before anything is packed, naming the bucket and prefix.
  auto denied = testing::run_cli({"pack", dir_ / "src", "-o", url("cli/denied"), tmp},
                                 {"AWS_SECRET_ACCESS_KEY=not-the-secret"});
  EXPECT_EQ(denied.exit_code, 1) << denied.err;
  EXPECT_NE(denied.err.find(url("cli/denied")), std::string::npos) << denied.err;
  EXPECT_NE(denied.err.find("SignatureDoesNotMatch"), std::string::npos) << denied.err;
  EXPECT_TRUE(objects("cli/denied").empty());

  // Two parts packed by two commands, as two machines would, then merged in the bucket.
  for (const char* part : {"0/2", "1/2"}) {
    auto packed_part = testing::run_cli({"pack", dir_ / "src", "-o", url("cli/parts"), "--part",
                                         part, "--shard-size", "24K", "--threads", "1", tmp});
    EXPECT_TRUE(packed_part.exit_code == 0 || packed_part.exit_code == 3) << packed_part.err;
  }
  auto merged = testing::run_cli({"merge", url("cli/parts"), "--json"});
  EXPECT_EQ(merged.exit_code, 0) << merged.err;
  EXPECT_NE(merged.out.find(url("cli/parts/manifest.json")), std::string::npos) << merged.out;
  auto merged_dataset = Dataset::open(url("cli/parts"));
  ASSERT_TRUE(merged_dataset.is_ok()) << merged_dataset.status().to_string();
  EXPECT_EQ((*merged_dataset)->size(), 60u);

  auto help = testing::run_cli({"pack", "--help"});
  EXPECT_NE(help.out.find("s3://BUCKET/PREFIX"), std::string::npos) << help.out;
  EXPECT_NE(help.out.find("--tmp"), std::string::npos) << help.out;
  EXPECT_TRUE(spool_is_empty());
}

// `zerowait pack s3://BUCKET/tars/shard-{000..003}.tar -o s3://BUCKET/ds`: WebDataset tars in a
// bucket are read through the storage layer, as local tars are, and give the shards a local
// pack of the same tars gives, byte for byte (one gzip-compressed, as tars often are).
TEST_F(PackS3Test, TarsInABucketPackToTheShardsLocalTarsGive) {
  std::vector<std::string> local_tars, remote_tars;
  for (int t = 0; t < 4; ++t) {
    const std::string dir = dir_ / ("tar" + std::to_string(t));
    std::vector<std::string> argv = {"/usr/bin/tar", "--format=gnu", "-cf",
                                     dir_ / ("shard-00" + std::to_string(t) + ".tar"), "-C", dir};
    for (int i = 0; i < 10; ++i) {
      const std::string key = std::to_string(10000 + t * 10 + i);
      testing::write_file(dir + "/" + key + ".jpg", testing::make_jpeg(24, 16, t * 10 + i));
      testing::write_file(dir + "/" + key + ".cls", std::to_string(i % 3));
      argv.push_back(key + ".cls");
      argv.push_back(key + ".jpg");
    }
    auto made = testing::run_command(argv);
    ASSERT_EQ(made.exit_code, 0) << made.err;
    std::string name = "shard-00" + std::to_string(t) + ".tar";
    if (t == 3) {
      ASSERT_EQ(testing::run_command({"/usr/bin/gzip", "-n", dir_ / name}).exit_code, 0);
      name += ".gz";
    }
    local_tars.push_back(dir_ / name);
    remote_tars.push_back(url("tars/" + name));
    ASSERT_TRUE(client_->put(bucket_, "tars/" + name, testing::read_file(dir_ / name),
                             Deadline::after(60s))
                    .is_ok());
  }
  const std::string tmp = "--tmp=" + spool_.path();
  std::vector<std::string> local_args = {"pack"};
  local_args.insert(local_args.end(), local_tars.begin(), local_tars.end());
  local_args.insert(local_args.end(), {"-o", dir_ / "local", "--shard-size", "24K", "--threads",
                                       "1"});
  auto local = testing::run_cli(local_args);
  ASSERT_EQ(local.exit_code, 0) << local.err;
  std::vector<std::string> remote_args = {"pack"};
  remote_args.insert(remote_args.end(), remote_tars.begin(), remote_tars.end());
  remote_args.insert(remote_args.end(), {"-o", url("ds"), "--shard-size", "24K", "--threads",
                                         "1", tmp});
  auto remote = testing::run_cli(remote_args);
  ASSERT_EQ(remote.exit_code, 0) << remote.err;

  auto manifest_text = client_->get(bucket_, "ds/manifest.json", Deadline::after(60s));
  ASSERT_TRUE(manifest_text.is_ok()) << manifest_text.status().to_string();
  auto manifest = Manifest::parse(*manifest_text, "manifest.json");
  ASSERT_TRUE(manifest.is_ok()) << manifest.status().to_string();
  auto local_manifest = Manifest::load(dir_ / "local/manifest.json");
  ASSERT_TRUE(local_manifest.is_ok()) << local_manifest.status().to_string();
  EXPECT_EQ(manifest->samples, 40u);
  ASSERT_EQ(manifest->shards.size(), local_manifest->shards.size());
  ASSERT_GT(manifest->shards.size(), 1u);
  for (size_t i = 0; i < manifest->shards.size(); ++i) {
    const std::string& path = manifest->shards[i].path;
    auto shard = client_->get(bucket_, "ds/" + path, Deadline::after(60s));
    ASSERT_TRUE(shard.is_ok()) << shard.status().to_string();
    EXPECT_EQ(*shard, testing::read_file(dir_ / ("local/" + local_manifest->shards[i].path)))
        << path;
  }

  // A tar that is not there is named, and nothing is published.
  auto missing = testing::run_cli({"pack", url("tars/none.tar"), "-o", url("ds-missing"), tmp});
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find(url("tars/none.tar")), std::string::npos) << missing.err;
  EXPECT_TRUE(objects("ds-missing").empty());
}

}  // namespace
}  // namespace zerowait
