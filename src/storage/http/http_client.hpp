// HTTP(S) requests on libcurl with deadlines and retries: the transport under the S3 client and
// the https:// byte source. A stalled server or a dead one is an error within the caller's
// deadline, never a hang.
//
// Thread-safety: an HttpClient may be used from any number of threads at once. It keeps a pool
// of curl handles, each with its connections, so requests to the same server reuse them.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

struct HttpOptions {
  std::chrono::milliseconds connect_timeout{5000};
  // An attempt that moves no byte for this long is given up and retried (libcurl checks about
  // once a second, so this is rounded up to whole seconds in effect).
  std::chrono::milliseconds stall_timeout{10000};
  int max_attempts = 5;  // per request, the first one included
  // Backoff before attempt n (n >= 1): a uniformly random wait in [0, min(max, base * 2^n)]
  // ("full jitter"), never past the request's deadline.
  std::chrono::milliseconds backoff_base{100};
  std::chrono::milliseconds backoff_max{5000};
  bool verify_tls = true;  // peer certificate and host name
};

struct HttpResponse;

struct HttpRequest {
  std::string method = "GET";  // GET, HEAD, PUT, POST, DELETE
  std::string url;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string_view body;  // sent as is (PUT, POST); must stay valid during send()
  // When not empty, the response body is written here (a ranged GET into the caller's buffer)
  // and a body longer than this is an error; otherwise it is collected in HttpResponse::body.
  // An error answer's body (status >= 300) always goes to HttpResponse::body (its first 64 KiB).
  std::span<std::byte> into;
  // How errors name the request ("GET s3://bucket/key"); "": the method and the URL. The Range
  // asked for is added either way.
  std::string name;
  // What an error answer says beyond its status (S3: its error code and message); may be null.
  std::function<std::string(const HttpResponse&)> describe;
};

struct HttpResponse {
  long status = 0;
  std::map<std::string, std::string> headers;  // lowercase names
  std::string body;                            // when the request had no `into`
  uint64_t body_bytes = 0;                     // bytes of body received (also into `into`)
  int attempts = 0;
  // The header's value, "" when absent; `name` in lowercase.
  std::string header(const std::string& name) const;
};

class HttpClient {
 public:
  explicit HttpClient(HttpOptions options = {});
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends `request` and returns the response, whatever its status, once a server answered with
  // a status that is not transient. Transient failures — no connection, a reset or stalled
  // transfer, 429, 500, 502, 503 (S3's SlowDown), 504 — are retried with backoff up to
  // max_attempts, within `deadline`. Errors name the method, the URL without its query, the
  // Range asked for, and what the last attempt got: kDeadlineExceeded when the deadline passes,
  // kIo when the attempts run out (or for an error that retrying cannot fix, e.g. TLS),
  // kCorrupt when a body does not fit `into`.
  Result<HttpResponse> send(const HttpRequest& request, Deadline deadline);

  const HttpOptions& options() const { return options_; }

 private:
  struct Handle;
  std::unique_ptr<Handle> acquire();
  void release(std::unique_ptr<Handle> handle);

  HttpOptions options_;
  std::mutex mutex_;
  std::vector<std::unique_ptr<Handle>> idle_;
};

// The URL as errors show it: without the query, which can carry request parameters only the
// caller should see.
std::string url_for_errors(const std::string& url);

// The client datasets use for http(s) URLs: default options, shared by the whole process.
std::shared_ptr<HttpClient> default_http_client();

}  // namespace zerowait::internal
