// The S3 client against a real S3 server: Ceph's RADOS Gateway, started by CTest through
// tests/s3/rgw.sh (a fixture; $ZEROWAIT_TEST_S3_DIR holds its `env` file). Every operation the
// client has — bucket creation, PUT, HEAD, GET, ranged GET, ListObjectsV2 pagination, multipart
// upload in parallel, DELETE — and the server's own verdict on a wrong signature.
#include <gtest/gtest.h>

#include <string>

#include "storage/s3/s3_client.hpp"
#include "testing/s3_server.hpp"
#include "testing/testing.hpp"

namespace zerowait::internal {
namespace {

using namespace std::chrono_literals;

class S3ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto bucket = testing::make_test_bucket();
    if (!bucket) GTEST_SKIP() << testing::kNoS3Server;
    config_ = bucket->config;
    client_ = std::move(bucket->client);
    bucket_ = bucket->name;
  }

  S3Config config_;
  std::unique_ptr<S3Client> client_;
  std::string bucket_;
};

TEST_F(S3ClientTest, PutHeadGetRangesAndDelete) {
  const std::string object = testing::random_bytes(1 << 20, 1);
  const std::string key = "dir/sub dir/shard-000001.zws";  // a space and slashes in the key
  ASSERT_TRUE(client_->put(bucket_, key, object, Deadline::after(60s)).is_ok());
  auto head = client_->head(bucket_, key, Deadline::after(60s));
  ASSERT_TRUE(head.is_ok()) << head.status().to_string();
  EXPECT_EQ(head->size, object.size());
  EXPECT_FALSE(head->etag.empty());
  auto whole = client_->get(bucket_, key, Deadline::after(60s));
  ASSERT_TRUE(whole.is_ok()) << whole.status().to_string();
  EXPECT_EQ(*whole, object);
  for (const auto& [offset, length] :
       std::vector<std::pair<uint64_t, size_t>>{{0, 1}, {4095, 4097}, {object.size() - 10, 10}}) {
    std::string part(length, '\0');
    ASSERT_TRUE(client_
                    ->get_range(bucket_, key, offset, std::as_writable_bytes(std::span(part)),
                                Deadline::after(60s))
                    .is_ok());
    EXPECT_EQ(part, object.substr(offset, length)) << offset;
  }
  ASSERT_TRUE(client_->remove(bucket_, key, Deadline::after(60s)).is_ok());
  auto gone = client_->head(bucket_, key, Deadline::after(60s));
  ASSERT_FALSE(gone.is_ok());
  EXPECT_EQ(gone.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(gone.status().message().find("s3://" + bucket_ + "/" + key), std::string::npos);
  auto missing = client_->get(bucket_, "no-such-key", Deadline::after(60s));
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("NoSuchKey"), std::string::npos)
      << missing.status().message();
}

TEST_F(S3ClientTest, ListingFollowsContinuationTokens) {
  for (int i = 0; i < 7; ++i) {
    ASSERT_TRUE(client_
                    ->put(bucket_, "ds/shard-" + std::to_string(i), std::string(i, 'x'),
                          Deadline::after(60s))
                    .is_ok());
  }
  ASSERT_TRUE(client_->put(bucket_, "other/file", "y", Deadline::after(60s)).is_ok());
  auto listed = client_->list(bucket_, "ds/", Deadline::after(60s), /*page_size=*/2);
  ASSERT_TRUE(listed.is_ok()) << listed.status().to_string();
  ASSERT_EQ(listed->size(), 7u);  // four pages of at most 2
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ((*listed)[i].key, "ds/shard-" + std::to_string(i));
    EXPECT_EQ((*listed)[i].size, uint64_t(i));
  }
  auto all = client_->list(bucket_, "", Deadline::after(60s));
  ASSERT_TRUE(all.is_ok());
  EXPECT_EQ(all->size(), 8u);
}

TEST_F(S3ClientTest, MultipartUploadInParallelParts) {
  const std::string object = testing::random_bytes((12 << 20) + 12345, 2);  // 3 parts of 5 MiB
  ASSERT_TRUE(client_
                  ->put_multipart(bucket_, "big/object", object, 5 << 20, /*threads=*/2,
                                  Deadline::after(120s))
                  .is_ok());
  auto head = client_->head(bucket_, "big/object", Deadline::after(60s));
  ASSERT_TRUE(head.is_ok());
  EXPECT_EQ(head->size, object.size());
  EXPECT_NE(head->etag.find("-3"), std::string::npos) << "a multipart ETag: " << head->etag;
  auto back = client_->get(bucket_, "big/object", Deadline::after(60s));
  ASSERT_TRUE(back.is_ok());
  EXPECT_TRUE(*back == object);
  EXPECT_EQ(client_->put_multipart(bucket_, "k", object, 1 << 20, 2, Deadline::after(60s)).code(),
            ErrorCode::kInvalidArgument);  // parts under S3's 5 MiB minimum
}

TEST_F(S3ClientTest, AWrongSecretIsRefusedByTheServerAndNeverPrinted) {
  S3Config wrong = config_;
  wrong.credentials.secret_access_key = "not-the-secret-0123456789";
  S3Client impostor(wrong, std::make_shared<HttpClient>());
  auto refused = impostor.get(bucket_, "anything", Deadline::after(60s));
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().code(), ErrorCode::kIo);
  const std::string& message = refused.status().message();
  EXPECT_NE(message.find("403"), std::string::npos) << message;
  EXPECT_NE(message.find("SignatureDoesNotMatch"), std::string::npos) << message;
  EXPECT_EQ(message.find("not-the-secret"), std::string::npos) << message;
  EXPECT_EQ(message.find(config_.credentials.secret_access_key), std::string::npos) << message;
}

}  // namespace
}  // namespace zerowait::internal
