// The real S3 server the C++ tests run against: Ceph's RADOS Gateway, started once per ctest run
// by tests/s3/rgw.sh (a CTest fixture that sets $ZEROWAIT_TEST_S3_DIR; see tests/CMakeLists.txt).
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "storage/s3/s3_client.hpp"

namespace zerowait::testing {

// The server's settings (AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...) as rgw.sh wrote them to
// $ZEROWAIT_TEST_S3_DIR/env; nullopt when no server was started for this test.
std::optional<std::map<std::string, std::string>> test_s3_server_env();

// Those settings as a client configuration; ADD_FAILURE when they do not resolve.
internal::S3Config test_s3_config(const std::map<std::string, std::string>& env);

// Sets those settings in this process's environment (and points the AWS config files at nothing)
// so that s3:// URLs opened through the public API reach the test server.
void export_test_s3_env(const std::map<std::string, std::string>& env);

// A bucket name of this test's own: tests run in parallel against one server.
std::string unique_bucket_name();

// What a test skips with when no server was started for it.
inline constexpr const char* kNoS3Server =
    "no S3 server: run through ctest, which starts one (tests/s3/rgw.sh)";

// A fresh bucket of this test's own on the test server, and a client for it. The server's
// settings are exported (export_test_s3_env), so s3:// URLs opened through the public API reach
// it too.
struct TestBucket {
  std::map<std::string, std::string> env;
  internal::S3Config config;
  std::unique_ptr<internal::S3Client> client;
  std::string name;
};
// nullopt when no server was started for this test (the caller skips with kNoS3Server);
// ADD_FAILURE when the bucket cannot be created.
std::optional<TestBucket> make_test_bucket();

// Puts every file directly in local `dir` into the bucket as `prefix` + its name; ADD_FAILURE
// when one fails.
void upload_directory(TestBucket& bucket, const std::string& dir, const std::string& prefix);

}  // namespace zerowait::testing
