// pack and merge_parts write through any Store open_store() serves, not only a directory or an
// S3 prefix: packed into memory:// (a store with no local path), a dataset has the files a local
// pack writes, byte for byte; parts packed there are the local parts, and merge finds them there
// (merging them needs Dataset to read memory://, which it does not yet); a URL no driver writes
// to is refused by name.
#include <gtest/gtest.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <map>
#include <string>

#include "testing/testing.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/format.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/storage/fault_store.hpp"
#include "zerowait/storage/open.hpp"

namespace zerowait {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

void write_samples(const std::string& root, int samples) {
  for (int i = 0; i < samples; ++i) {
    const std::string key = root + "/d" + std::to_string(i % 3) + "/s" + std::to_string(i);
    testing::write_file(key + ".bin", testing::random_bytes((i * 997) % 6000, i));
    if (i % 2 == 0) testing::write_file(key + ".json", "{\"i\":" + std::to_string(i) + "}");
  }
}

// Every file below `dir` of a local directory, by '/'-separated name.
std::map<std::string, std::string> local_files(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file()) {
      out[e.path().lexically_relative(dir).generic_string()] = testing::read_file(e.path());
    }
  }
  return out;
}

// Every object below `dir` of `store`, by name.
std::map<std::string, std::string> store_files(Store& store, const std::string& dir = "") {
  std::map<std::string, std::string> out;
  auto names = store.list(dir, metadata_deadline());
  EXPECT_TRUE(names.is_ok()) << names.status().to_string();
  if (!names.is_ok()) return out;
  for (const std::string& name : *names) {
    const std::string path = dir.empty() ? name : dir + "/" + name;
    auto is_dir = store.is_directory(path, metadata_deadline());
    EXPECT_TRUE(is_dir.is_ok()) << is_dir.status().to_string();
    if (is_dir.is_ok() && *is_dir) {
      out.merge(store_files(store, path));
    } else {
      out[path] = *store.read(path, metadata_deadline());
    }
  }
  return out;
}

TEST(PackToStore, AMemoryStoreGetsTheFilesALocalPackWritesByteForByte) {
  TempDir dir;
  write_samples(dir / "src", 90);
  const PackOptions local{
      .sources = {dir / "src"}, .out_dir = dir / "local", .shard_size = 16 << 10, .sync = false};
  ASSERT_TRUE(pack(local).is_ok());
  PackOptions memory = local;
  memory.out_dir = "memory://pack-whole";
  auto report = pack(memory);
  ASSERT_TRUE(report.is_ok()) << report.status().to_string();
  EXPECT_EQ(report->manifest_path, "memory://pack-whole/manifest.json");

  auto store = open_store("memory://pack-whole");
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  const auto expected = local_files(dir / "local");
  EXPECT_GT(expected.size(), 4u);  // several shards, quarantine.json and the manifest
  EXPECT_EQ(store_files(**store), expected);

  // A second pack there is refused by name; with overwrite it replaces the first.
  auto again = pack(memory);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), ErrorCode::kAlreadyExists) << again.status().to_string();
  EXPECT_NE(again.status().message().find("memory://pack-whole/manifest.json"), std::string::npos)
      << again.status().to_string();
  memory.overwrite = true;
  ASSERT_TRUE(pack(memory).is_ok());
  EXPECT_EQ(store_files(**store), expected);
}

TEST(PackToStore, PartsPackedIntoAMemoryStoreAreTheLocalPartsAndMergeFindsThem) {
  TempDir dir;
  write_samples(dir / "src", 120);
  PackOptions local{
      .sources = {dir / "src"}, .out_dir = dir / "parts", .shard_size = 16 << 10, .sync = false};
  PackOptions memory = local;
  memory.out_dir = "memory://pack-parts";
  for (PackOptions* options : {&local, &memory}) {
    options->part_count = 3;
    for (uint32_t i = 0; i < 3; ++i) {
      options->part_index = i;
      auto report = pack(*options);
      ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    }
  }
  auto store = open_store("memory://pack-parts");
  ASSERT_TRUE(store.is_ok()) << store.status().to_string();
  EXPECT_EQ(store_files(**store), local_files(dir / "parts"));

  // Merge lists the parts in the store and reads their manifests: a part missing there is
  // named, and one outside the output refused.
  const Status missing = merge_parts({.out_dir = "memory://pack-parts",
                                      .parts = {"memory://pack-parts/part-0003-of-0003"}})
                             .status();
  EXPECT_EQ(missing.code(), ErrorCode::kNotFound) << missing.to_string();
  EXPECT_NE(missing.message().find("'memory://pack-parts/part-0003-of-0003' does not exist"),
            std::string::npos)
      << missing.to_string();
  const Status outside = merge_parts({.out_dir = "memory://pack-parts",
                                      .parts = {"memory://elsewhere/part-0000-of-0003"},
                                      .overwrite = true})
                             .status();
  EXPECT_EQ(outside.code(), ErrorCode::kInvalidArgument) << outside.to_string();
  EXPECT_NE(outside.message().find("is not inside the merge output"), std::string::npos)
      << outside.to_string();
}

// A pack whose output stops answering while a shard is written fails naming that shard, as its
// write deadline passes (here the stall is ended at once, once it has begun, rather than waited
// out), and publishes no manifest; the part already packed beside it stays a whole dataset.
TEST(PackToStore, APackWhoseOutputStallsFailsNamingTheShardAndLeavesThePackedPartWhole) {
  TempDir dir;
  write_samples(dir / "src", 60);
  const std::string out = dir / "out";
  PackOptions first{.sources = {dir / "src"},
                    .out_dir = out,
                    .shard_size = 16 << 10,
                    .part_index = 0,
                    .part_count = 2};
  auto packed = pack(first);
  ASSERT_TRUE(packed.is_ok()) << packed.status().to_string();

  auto faults = std::make_shared<FaultStore>(make_local_store(out));
  std::promise<std::string> stalled;
  std::future<std::string> stalled_path = stalled.get_future();
  std::atomic<bool> seen{false};
  faults->set_rule([&](const StoreOperation& op) {
    if (op.kind != "write") return Fault{};
    if (!seen.exchange(true)) stalled.set_value(faults->full_name(op.path));
    return Fault{Fault::Kind::kStall};
  });
  auto release = std::async(std::launch::async, [&] {
    const std::string path = stalled_path.get();
    faults->release_stalls();
    return path;
  });
  PackOptions second = first;
  second.part_index = 1;
  second.out_store = faults;
  auto failed = pack(second);
  const std::string path = release.get();
  ASSERT_FALSE(failed.is_ok());
  EXPECT_EQ(failed.status().code(), ErrorCode::kDeadlineExceeded) << failed.status().to_string();
  EXPECT_NE(failed.status().message().find(path), std::string::npos)
      << path << ": " << failed.status().to_string();
  EXPECT_FALSE(fs::exists(fs::path(out) / pack_part_dir_name(1, 2) / format::kManifestName));

  auto whole = Dataset::open(out + "/" + pack_part_dir_name(0, 2));
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ((*whole)->size(), packed->samples);
  for (uint64_t i = 0; i < (*whole)->size(); ++i) {
    auto sample = (*whole)->read(i);
    ASSERT_TRUE(sample.is_ok()) << i << ": " << sample.status().to_string();
  }
}

TEST(PackToStore, AURLNoDriverWritesToIsRefusedByName) {
  TempDir dir;
  write_samples(dir / "src", 3);
  auto refused = pack({.sources = {dir / "src"}, .out_dir = "https://example.com/ds"});
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kInvalidArgument) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("pack output 'https://example.com/ds'"),
            std::string::npos)
      << refused.status().to_string();
}

}  // namespace
}  // namespace zerowait
