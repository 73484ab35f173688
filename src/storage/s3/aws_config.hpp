// Where an S3 client finds its settings, the way the AWS SDKs and CLI do: credentials, region,
// endpoint and addressing style from the environment, then from the shared config and
// credentials files (profiles), then defaults.
//
//   credentials  AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN); else the
//                profile's aws_access_key_id / aws_secret_access_key / aws_session_token in
//                $AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials), then in $AWS_CONFIG_FILE
//                (~/.aws/config). The profile is $AWS_PROFILE, else "default".
//   region       AWS_REGION, AWS_DEFAULT_REGION, the profile's `region`, else us-east-1.
//   endpoint     AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's `endpoint_url`, else
//                https://s3.<region>.amazonaws.com.
//   addressing   $ZEROWAIT_S3_ADDRESSING (path|virtual), the profile's nested
//                `s3 = addressing_style = path|virtual`, else virtual-host style on AWS's own
//                endpoints and path style on any other (MinIO, Ceph RGW and SeaweedFS serve path
//                style without DNS set up per bucket).
//
// Errors never hold a secret: they name the variable, file, profile or key that is missing.
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>

#include "storage/s3/sigv4.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// Reads one environment variable; nullopt when unset. The process environment by default; tests
// pass a map.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvironmentLookup process_environment();

enum class S3Addressing { kVirtualHost, kPath };

struct S3Config {
  sigv4::Credentials credentials;
  std::string region;
  std::string endpoint;  // scheme://host[:port], no trailing '/'
  S3Addressing addressing = S3Addressing::kPath;
  std::string profile;           // the profile the files were read for
  std::string credentials_from;  // "environment" or the file the keys came from (no secret)
};

// Resolves the settings above. kNotFound when no credentials are found anywhere (naming where it
// looked) or an explicitly chosen profile exists in neither file; kInvalidArgument for an
// endpoint that is not an http(s) URL or a bad addressing style; kCorrupt for a config file that
// does not parse (file and line).
Result<S3Config> resolve_s3_config(const EnvironmentLookup& environment = process_environment());

// One profile's settings from an AWS config or credentials file: key -> value, with nested
// settings ("s3 =" followed by indented "addressing_style = path") as "s3.addressing_style".
// `config_file_style`: sections are "[profile NAME]" (and "[default]"), else "[NAME]".
// nullopt when the file has no such profile; kCorrupt naming the line when it does not parse;
// kNotFound when the file does not exist.
Result<std::optional<std::map<std::string, std::string>>> read_aws_profile(
    const std::string& path, const std::string& profile, bool config_file_style);

}  // namespace zerowait::internal
