// AWS Signature Version 4 (header authentication), for the S3 client.
//
// Written by hand: neither Debian nor PyPI packages an AWS SDK for C++, and the algorithm is
// small and fully specified (docs.aws.amazon.com, "Signature Version 4 signing process"). SHA-256
// and HMAC come from OpenSSL. tests/test_sigv4.cpp checks every step against AWS's published
// signature test suite and the S3 examples of the S3 API reference.
//
// Thread-safety: pure functions. Secrets are used for signing only: nothing here logs them or
// puts them in an error message.
#pragma once

#include <chrono>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace zerowait::internal::sigv4 {

struct Credentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // temporary credentials (STS); empty: none
};

// Who signs for what, and when: the credential scope.
struct Scope {
  std::string date_time;  // the request's x-amz-date: "YYYYMMDDTHHMMSSZ" (UTC)
  std::string region;     // "us-east-1"
  std::string service;    // "s3"
};

// A request as it goes on the wire.
struct Request {
  std::string method;  // "GET"
  std::string path;    // percent-encoded as sent: "/bucket/a%20b.tar"
  std::string query;   // percent-encoded as sent, without '?': "list-type=2&prefix=a%2Fb"
  // Every header that is signed, as sent (Host and x-amz-date included), in any order; a name
  // may repeat.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string payload_sha256;  // lowercase hex of the body, or "UNSIGNED-PAYLOAD"
};

// S3 signs the path as the object key is written (each segment percent-encoded once, `//` and
// `.` kept); the other services sign it with dot segments and empty segments removed and each
// segment encoded a second time.
enum class PathRule { kS3, kNormalized };

// Lowercase hex of SHA-256(bytes).
std::string sha256_hex(std::string_view bytes);
// "YYYYMMDDTHHMMSSZ" of a UTC time.
std::string amz_date(std::chrono::system_clock::time_point time);
// Percent-encodes everything but A-Z a-z 0-9 - _ . ~ (and '/' when `keep_slash`), as SigV4
// requires: "%XX" with uppercase hex.
std::string uri_encode(std::string_view text, bool keep_slash);

// The steps of the signature, in order (each is tested on its own).
std::string canonical_request(const Request& request, PathRule rule);
std::string string_to_sign(std::string_view canonical_request, const Scope& scope);
std::string signature(std::string_view secret_access_key, const Scope& scope,
                      std::string_view string_to_sign);
// The Authorization header's value. `request.headers` must already hold what is to be signed:
// Host, x-amz-date (= scope.date_time), x-amz-content-sha256 for S3, and x-amz-security-token
// when `credentials` has a session token.
// "AWS4-HMAC-SHA256 Credential=<key id>/<scope>, SignedHeaders=<names>, Signature=<hex>".
std::string authorization(const Request& request, const Credentials& credentials,
                          const Scope& scope, PathRule rule);

}  // namespace zerowait::internal::sigv4
