#include "testing/s3_server.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>

#include "storage/http/http_client.hpp"
#include "testing/testing.hpp"

namespace zerowait::testing {

std::optional<std::map<std::string, std::string>> test_s3_server_env() {
  const char* dir = std::getenv("ZEROWAIT_TEST_S3_DIR");
  if (dir == nullptr) return std::nullopt;
  std::ifstream in(std::string(dir) + "/env");
  std::map<std::string, std::string> env;
  for (std::string line; std::getline(in, line);) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) env[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return env;
}

internal::S3Config test_s3_config(const std::map<std::string, std::string>& env) {
  auto resolved =
      internal::resolve_s3_config([&env](const std::string& name) -> std::optional<std::string> {
        auto it = env.find(name);
        if (it == env.end()) return std::nullopt;
        return it->second;
      });
  if (!resolved.is_ok()) {
    ADD_FAILURE() << "the test server's settings do not resolve: " << resolved.status().to_string();
    return {};
  }
  return *resolved;
}

void export_test_s3_env(const std::map<std::string, std::string>& env) {
  for (const auto& [name, value] : env) ::setenv(name.c_str(), value.c_str(), 1);
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/zerowait-test/credentials", 1);
  ::setenv("AWS_CONFIG_FILE", "/nonexistent/zerowait-test/config", 1);
}

std::string unique_bucket_name() {
  return "zw-" + std::to_string(std::random_device{}()) + "-" +
         std::to_string(::testing::UnitTest::GetInstance()->random_seed());
}

std::optional<TestBucket> make_test_bucket() {
  auto env = test_s3_server_env();
  if (!env) return std::nullopt;
  TestBucket bucket;
  bucket.env = *env;
  EXPECT_TRUE(bucket.env.count("AWS_ENDPOINT_URL")) << "rgw.sh wrote no env file";
  export_test_s3_env(bucket.env);
  bucket.config = test_s3_config(bucket.env);
  bucket.client =
      std::make_unique<internal::S3Client>(bucket.config, std::make_shared<internal::HttpClient>());
  bucket.name = unique_bucket_name();
  Status created =
      bucket.client->create_bucket(bucket.name, Deadline::after(std::chrono::seconds(60)));
  EXPECT_TRUE(created.is_ok()) << created.to_string();
  return bucket;
}

void upload_directory(TestBucket& bucket, const std::string& dir, const std::string& prefix) {
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (!entry.is_regular_file()) continue;
    const std::string key = prefix + entry.path().filename().string();
    Status put = bucket.client->put(bucket.name, key, read_file(entry.path().string()),
                                    Deadline::after(std::chrono::seconds(60)));
    EXPECT_TRUE(put.is_ok()) << key << ": " << put.to_string();
  }
}

}  // namespace zerowait::testing
