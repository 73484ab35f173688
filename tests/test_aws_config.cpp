// S3 settings resolved the way the AWS SDKs resolve them: environment first, then the profile in
// the shared credentials and config files, then defaults; and errors that say where it looked
// without ever printing a secret. Real files in a temporary HOME; the environment is a map.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <string>

#include "storage/s3/aws_config.hpp"
#include "testing/testing.hpp"

namespace zerowait::internal {
namespace {

using testing::TempDir;

class AwsConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { env_["HOME"] = home_.path(); }

  EnvironmentLookup environment() const {
    return [env = env_](const std::string& name) -> std::optional<std::string> {
      auto it = env.find(name);
      if (it == env.end()) return std::nullopt;
      return it->second;
    };
  }
  void write(const std::string& name, const std::string& text) {
    std::filesystem::create_directories(home_.path() + "/.aws");
    std::ofstream(home_.path() + "/.aws/" + name) << text;
  }
  Result<S3Config> resolve() const { return resolve_s3_config(environment()); }

  TempDir home_;
  std::map<std::string, std::string> env_;
};

TEST_F(AwsConfigTest, EnvironmentCredentialsAndDefaults) {
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = "secret-env";
  env_["AWS_SESSION_TOKEN"] = "token-env";
  auto config = resolve();
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->credentials.access_key_id, "AKIDENV");
  EXPECT_EQ(config->credentials.secret_access_key, "secret-env");
  EXPECT_EQ(config->credentials.session_token, "token-env");
  EXPECT_EQ(config->credentials_from, "environment");
  EXPECT_EQ(config->region, "us-east-1");
  EXPECT_EQ(config->endpoint, "https://s3.us-east-1.amazonaws.com");
  EXPECT_EQ(config->addressing, S3Addressing::kVirtualHost);
}

TEST_F(AwsConfigTest, ProfilesFromTheCredentialsAndConfigFiles) {
  write("credentials",
        "# comment\n[default]\naws_access_key_id = AKIDDEFAULT\naws_secret_access_key = s1\n\n"
        "[lab]\naws_access_key_id=AKIDLAB\naws_secret_access_key=s2\naws_session_token = t2\n");
  write("config",
        "[default]\nregion = eu-west-1\n"
        "[profile lab]\nregion = us-west-2\nendpoint_url = http://127.0.0.1:7480/\n"
        "s3 =\n  addressing_style = virtual\n"
        "[services lab]\ns3 =\n  endpoint_url = http://ignored\n");
  auto config = resolve();
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->credentials.access_key_id, "AKIDDEFAULT");
  EXPECT_EQ(config->region, "eu-west-1");
  EXPECT_EQ(config->endpoint, "https://s3.eu-west-1.amazonaws.com");
  EXPECT_EQ(config->credentials_from, home_.path() + "/.aws/credentials");

  env_["AWS_PROFILE"] = "lab";
  config = resolve();
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->profile, "lab");
  EXPECT_EQ(config->credentials.access_key_id, "AKIDLAB");
  EXPECT_EQ(config->credentials.session_token, "t2");
  EXPECT_EQ(config->region, "us-west-2");
  EXPECT_EQ(config->endpoint, "http://127.0.0.1:7480");       // trailing '/' dropped
  EXPECT_EQ(config->addressing, S3Addressing::kVirtualHost);  // the profile's nested setting

  // The environment wins over the files, as in the SDKs.
  env_["AWS_REGION"] = "ap-south-1";
  env_["AWS_ENDPOINT_URL"] = "http://localhost:9000";
  env_["AWS_ENDPOINT_URL_S3"] = "http://localhost:9001";
  env_["ZEROWAIT_S3_ADDRESSING"] = "path";
  env_["AWS_ACCESS_KEY_ID"] = "AKIDENV";
  env_["AWS_SECRET_ACCESS_KEY"] = "secret-env";
  config = resolve();
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->region, "ap-south-1");
  EXPECT_EQ(config->endpoint, "http://localhost:9001");
  EXPECT_EQ(config->addressing, S3Addressing::kPath);
  EXPECT_EQ(config->credentials.access_key_id, "AKIDENV");
  EXPECT_EQ(config->credentials.session_token,
            "");  // not the profile's: keys and token go together
}

TEST_F(AwsConfigTest, KeysInTheConfigFileAndFilesNamedByTheEnvironment) {
  std::ofstream(home_.path() + "/my-config") << "[profile x]\naws_access_key_id = AKIDCFG\n"
                                                "aws_secret_access_key = s3cret\n";
  env_["AWS_CONFIG_FILE"] = home_.path() + "/my-config";
  env_["AWS_PROFILE"] = "x";
  auto config = resolve();
  ASSERT_TRUE(config.is_ok()) << config.status().to_string();
  EXPECT_EQ(config->credentials.access_key_id, "AKIDCFG");
  EXPECT_EQ(config->credentials_from, home_.path() + "/my-config");
  // A custom endpoint is addressed path style unless told otherwise.
  env_["AWS_ENDPOINT_URL"] = "http://127.0.0.1:7480";
  EXPECT_EQ(resolve()->addressing, S3Addressing::kPath);
}

TEST_F(AwsConfigTest, ErrorsSayWhereTheyLookedAndHoldNoSecret) {
  auto none = resolve();
  ASSERT_FALSE(none.is_ok());
  EXPECT_EQ(none.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(none.status().message().find("AWS_ACCESS_KEY_ID"), std::string::npos);
  EXPECT_NE(none.status().message().find(".aws/credentials"), std::string::npos);

  write("credentials", "[default]\naws_access_key_id = AKIDX\naws_secret_access_key = TOPSECRET\n");
  env_["AWS_PROFILE"] = "missing";
  auto missing = resolve();
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'missing'"), std::string::npos);

  env_.erase("AWS_PROFILE");
  env_["AWS_ENDPOINT_URL"] = "ftp://host";
  auto bad_endpoint = resolve();
  ASSERT_FALSE(bad_endpoint.is_ok());
  EXPECT_EQ(bad_endpoint.status().code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(bad_endpoint.status().message().find("AWS_ENDPOINT_URL"), std::string::npos);

  env_.erase("AWS_ENDPOINT_URL");
  env_["ZEROWAIT_S3_ADDRESSING"] = "sideways";
  EXPECT_EQ(resolve().status().code(), ErrorCode::kInvalidArgument);

  env_.erase("ZEROWAIT_S3_ADDRESSING");
  write("credentials", "[default]\naws_access_key_id = AKIDX\naws_secret_access_key TOPSECRET\n");
  auto broken = resolve();
  ASSERT_FALSE(broken.is_ok());
  EXPECT_EQ(broken.status().code(), ErrorCode::kCorrupt);
  EXPECT_NE(broken.status().message().find("line 3"), std::string::npos);
  for (const Status& s :
       {none.status(), missing.status(), bad_endpoint.status(), broken.status()}) {
    EXPECT_EQ(s.message().find("TOPSECRET"), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace zerowait::internal
