// Datasets served over HTTP: a packed dataset's files behind a real server on 127.0.0.1 open
// with one GET of the manifest and read with ranged GETs; the loader delivers the same batches
// as from the local copy; a stalled server is a read error naming the URL, not a hang; and what
// is not supported yet says so.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "testing/http_server.hpp"
#include "testing/testing.hpp"
#include "zerowait/loader/loader.hpp"
#include "zerowait/shard/dataset.hpp"
#include "zerowait/shard/pack.hpp"
#include "zerowait/shard/synthetic.hpp"

namespace zerowait {
namespace {

using testing::TempDir;
using testing::TestHttpServer;
namespace fs = std::filesystem;

// Packs 120 synthetic JPEGs into a few shards and serves every file of the dataset under /ds/.
class RemoteDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    SyntheticImageFolderOptions images;
    images.out_dir = dir_ / "images";
    images.files = 120;
    images.classes = 3;
    images.min_bytes = 2000;
    images.max_bytes = 6000;
    images.threads = 1;
    ASSERT_TRUE(generate_imagefolder(images).is_ok());
    PackOptions pack_options;
    pack_options.sources = {dir_ / "images"};
    pack_options.out_dir = dir_ / "ds";
    pack_options.imagefolder = true;
    pack_options.shard_size = 150 << 10;
    pack_options.sync = false;
    pack_options.threads = 1;
    auto report = pack(pack_options);
    ASSERT_TRUE(report.is_ok()) << report.status().to_string();
    ASSERT_GT(report->shards, 2u);
    for (const auto& entry : fs::directory_iterator(dir_ / "ds")) {
      server_.put("/ds/" + entry.path().filename().string(),
                  testing::read_file(entry.path().string()));
    }
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

LoaderOptions options() {
  LoaderOptions o;
  o.batch_size = 16;
  o.shuffle.seed = 3;
  o.threads = 2;
  o.fields = {"jpg", "cls"};
  o.decode["cls"].kind = FieldDecode::Kind::kInt;
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
  for (const std::string& request : server_.log()) {
    EXPECT_TRUE(request.starts_with("GET /ds/manifest.json") || request.starts_with("HEAD /ds/") ||
                request.find(" bytes=") != std::string::npos)
        << "every read of a shard is a ranged GET: " << request;
  }
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

  server_.put("/web/a.tar", "not really a tar");
  auto tar = Dataset::open(server_.url("/web/a.tar"));
  ASSERT_FALSE(tar.is_ok());
  EXPECT_EQ(tar.status().code(), ErrorCode::kUnsupported);

  auto s3 = Dataset::open("s3://bucket/ds");
  ASSERT_FALSE(s3.is_ok());
  EXPECT_EQ(s3.status().code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace zerowait
