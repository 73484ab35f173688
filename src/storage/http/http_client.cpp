#include "storage/http/http_client.hpp"

#include <curl/curl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>

#include "common/clock.hpp"
#include "common/random.hpp"
#include "common/text.hpp"

namespace zerowait::internal {
namespace {

using SteadyClock = std::chrono::steady_clock;

void global_init() {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)init;
}

// What one attempt did.
struct Attempt {
  CURLcode code = CURLE_OK;
  long status = 0;
  bool stalled = false;   // no byte moved for stall_timeout
  bool overflow = false;  // the body did not fit `into`
  std::string curl_error;
};

// The CA bundle that TLS peers are verified against, chosen once: $SSL_CERT_FILE (OpenSSL's
// variable) or $CURL_CA_BUNDLE (curl's), else libcurl's built-in bundle where that file exists,
// else the first bundle found where the common distributions keep theirs. The wheel carries
// Debian's libcurl, whose built-in /etc/ssl/certs/ca-certificates.crt is missing on RHEL, Fedora
// and SUSE. Empty: libcurl's built-in one stays (and its error names the missing file).
const std::string& ca_bundle(CURL* curl) {
  static const std::string chosen = [curl] {
    for (const char* name : {"SSL_CERT_FILE", "CURL_CA_BUNDLE"}) {
      const char* value = std::getenv(name);
      if (value != nullptr && *value != 0) return std::string(value);
    }
    char* builtin = nullptr;
    if (curl_easy_getinfo(curl, CURLINFO_CAINFO, &builtin) == CURLE_OK && builtin != nullptr &&
        ::access(builtin, R_OK) == 0) {
      return std::string();
    }
    for (const char* path : {"/etc/ssl/certs/ca-certificates.crt",  // Debian, Ubuntu, Arch
                             "/etc/pki/tls/certs/ca-bundle.crt",    // RHEL, Fedora
                             "/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
                             "/etc/ssl/ca-bundle.pem",  // SUSE
                             "/etc/ssl/cert.pem"}) {    // Alpine
      if (::access(path, R_OK) == 0) return std::string(path);
    }
    return std::string();
  }();
  return chosen;
}

bool transient_status(long status) {
  return status == 429 || status == 500 || status == 502 || status == 503 || status == 504;
}

bool transient_code(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_CONNECT:
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_ABORTED_BY_CALLBACK:  // a stall
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
      return true;
    default:
      return false;
  }
}

// Full jitter: uniform in [0, min(max, base * 2^attempt)].
std::chrono::milliseconds backoff(const HttpOptions& options, int attempt) {
  thread_local Rng rng(std::random_device{}());
  const int64_t cap = std::min<int64_t>(options.backoff_max.count(), options.backoff_base.count()
                                                                         << std::min(attempt, 20));
  return std::chrono::milliseconds(cap > 0 ? static_cast<int64_t>(rng.next() % (cap + 1)) : 0);
}

}  // namespace

std::string HttpResponse::header(const std::string& name) const {
  auto it = headers.find(name);
  return it == headers.end() ? "" : it->second;
}

struct HttpClient::Handle {
  CURL* curl = nullptr;
  Handle() : curl(curl_easy_init()) {}
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

// Everything the callbacks of one attempt touch.
struct Transfer {
  const HttpRequest* request = nullptr;
  HttpResponse* response = nullptr;
  std::chrono::milliseconds stall_timeout{0};
  curl_off_t last_moved = -1;
  SteadyClock::time_point last_progress = SteadyClock::now();
  bool stalled = false;
  bool overflow = false;
  long status = 0;  // of the response being received, from its status line

  static constexpr size_t kErrorBodyBytes = 64 << 10;

  static size_t on_body(char* data, size_t size, size_t count, void* self) {
    auto* t = static_cast<Transfer*>(self);
    const size_t n = size * count;
    HttpResponse& r = *t->response;
    if (t->status >= 300 && !t->request->into.empty()) {
      // An error answer is not the bytes asked for: it never reaches the caller's buffer.
      r.body.append(data, std::min(n, kErrorBodyBytes - std::min(kErrorBodyBytes, r.body.size())));
      return n;
    }
    if (t->request->into.empty()) {
      r.body.append(data, n);
    } else {
      if (r.body_bytes + n > t->request->into.size()) {
        t->overflow = true;
        return 0;  // aborts the transfer
      }
      std::memcpy(t->request->into.data() + r.body_bytes, data, n);
    }
    r.body_bytes += n;
    return n;
  }

  static size_t on_header(char* data, size_t size, size_t count, void* self) {
    auto* t = static_cast<Transfer*>(self);
    const std::string_view line(data, size * count);
    if (line.starts_with("HTTP/")) {
      t->response->headers.clear();  // a new response (after 100 Continue, a redirect)
      const size_t space = line.find(' ');
      t->status = space == std::string_view::npos
                      ? 0
                      : std::strtol(std::string(line.substr(space + 1, 3)).c_str(), nullptr, 10);
    } else if (const size_t colon = line.find(':'); colon != std::string_view::npos) {
      std::string_view value = line.substr(colon + 1);
      while (!value.empty() && (value.front() == ' ' || value.front() == '\t')) {
        value.remove_prefix(1);
      }
      while (!value.empty() && (value.back() == '\r' || value.back() == '\n')) {
        value.remove_suffix(1);
      }
      t->response->headers[ascii_lower(line.substr(0, colon))] = std::string(value);
    }
    return size * count;
  }

  static int on_progress(void* self, curl_off_t, curl_off_t down, curl_off_t, curl_off_t up) {
    auto* t = static_cast<Transfer*>(self);
    const auto now = SteadyClock::now();
    if (down + up != t->last_moved) {
      t->last_moved = down + up;
      t->last_progress = now;
      return 0;
    }
    if (now - t->last_progress >= t->stall_timeout) {
      t->stalled = true;
      return 1;  // aborts the transfer
    }
    return 0;
  }
};

HttpClient::HttpClient(HttpOptions options) : options_(std::move(options)) { global_init(); }

HttpClient::~HttpClient() = default;

std::unique_ptr<HttpClient::Handle> HttpClient::acquire() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!idle_.empty()) {
      std::unique_ptr<Handle> handle = std::move(idle_.back());
      idle_.pop_back();
      return handle;
    }
  }
  return std::make_unique<Handle>();
}

void HttpClient::release(std::unique_ptr<Handle> handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  idle_.push_back(std::move(handle));
}

Result<HttpResponse> HttpClient::send(const HttpRequest& request, Deadline deadline) {
  std::string range;
  for (const auto& [name, value] : request.headers) {
    if (ascii_lower(name) == "range") range = " (" + value + ")";
  }
  const std::string what =
      (request.name.empty() ? request.method + " " + url_for_errors(request.url) : request.name) +
      range;
  std::unique_ptr<Handle> handle = acquire();
  if (handle->curl == nullptr) return Status(ErrorCode::kInternal, "curl_easy_init failed");
  struct curl_slist* headers = nullptr;
  // On every way out: the header list freed, the handle (and its connections) back in the pool.
  struct Cleanup {
    HttpClient* client;
    std::unique_ptr<Handle>& handle;
    curl_slist*& headers;
    ~Cleanup() {
      curl_slist_free_all(headers);
      client->release(std::move(handle));
    }
  } cleanup{this, handle, headers};
  for (const auto& [name, value] : request.headers) {
    headers = curl_slist_append(headers, (name + ": " + value).c_str());
  }
  // No "Expect: 100-continue" round trip, and no form content type for bodies.
  headers = curl_slist_append(headers, "Expect:");
  if (!request.body.empty()) {
    headers = curl_slist_append(headers, "Content-Type: application/octet-stream");
  }

  HttpResponse response;
  std::string last_problem = "nothing was tried";
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    if (attempt > 0) {
      const auto wait = backoff(options_, attempt);
      if (deadline.at != Clock::time_point::max() && Clock::now() + wait >= deadline.at) break;
      std::this_thread::sleep_for(wait);
    }
    if (deadline.passed()) break;
    response = HttpResponse();
    response.attempts = attempt + 1;
    Transfer transfer;
    transfer.request = &request;
    transfer.response = &response;
    transfer.stall_timeout = options_.stall_timeout;

    CURL* curl = handle->curl;
    curl_easy_reset(curl);  // keeps the handle's open connections
    char error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(curl, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(curl, CURLOPT_URL, request.url.c_str());
    curl_easy_setopt(curl, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYPEER, options_.verify_tls ? 1L : 0L);
    curl_easy_setopt(curl, CURLOPT_SSL_VERIFYHOST, options_.verify_tls ? 2L : 0L);
    if (const std::string& bundle = ca_bundle(curl); !bundle.empty()) {
      curl_easy_setopt(curl, CURLOPT_CAINFO, bundle.c_str());
    }
    curl_easy_setopt(curl, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options_.connect_timeout.count()));
    if (deadline.at != Clock::time_point::max()) {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline.at - Clock::now());
      curl_easy_setopt(curl, CURLOPT_TIMEOUT_MS,
                       static_cast<long>(std::max<int64_t>(1, left.count())));
    }
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, &Transfer::on_body);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_HEADERFUNCTION, &Transfer::on_header);
    curl_easy_setopt(curl, CURLOPT_HEADERDATA, &transfer);
    curl_easy_setopt(curl, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(curl, CURLOPT_XFERINFOFUNCTION, &Transfer::on_progress);
    curl_easy_setopt(curl, CURLOPT_XFERINFODATA, &transfer);
    if (request.method == "HEAD") {
      curl_easy_setopt(curl, CURLOPT_NOBODY, 1L);
    } else if (request.method != "GET") {
      curl_easy_setopt(curl, CURLOPT_CUSTOMREQUEST, request.method.c_str());
    }
    if (request.method == "PUT" || request.method == "POST" || !request.body.empty()) {
      curl_easy_setopt(curl, CURLOPT_POSTFIELDS, request.body.data());
      curl_easy_setopt(curl, CURLOPT_POSTFIELDSIZE_LARGE,
                       static_cast<curl_off_t>(request.body.size()));
    }

    const CURLcode code = curl_easy_perform(curl);
    curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &response.status);
    if (transfer.overflow) {
      if (response.status == 200 && !range.empty()) {
        return unsupported(what + ": the server ignores Range requests (it answered with the " +
                           "whole object), so the object cannot be read in place");
      }
      return corrupt(what + ": the server sent more than the " +
                     std::to_string(request.into.size()) + " bytes asked for");
    }
    if (code == CURLE_OK && !transient_status(response.status)) {
      return response;
    }
    if (code == CURLE_OK) {
      last_problem = "the server answered " + std::to_string(response.status);
      const std::string said = request.describe ? request.describe(response) : "";
      if (!said.empty()) last_problem += " " + said;
    } else if (transfer.stalled) {
      last_problem = "no byte moved for " +
                     std::to_string(internal::seconds(options_.stall_timeout)) + " s (stalled)";
    } else {
      last_problem =
          std::string(curl_easy_strerror(code)) + (error[0] ? std::string(": ") + error : "");
      if (code == CURLE_PEER_FAILED_VERIFICATION || code == CURLE_SSL_CACERT_BADFILE) {
        const std::string& bundle = ca_bundle(curl);
        last_problem += " (CA bundle: " + (bundle.empty() ? "libcurl's built-in one" : bundle) +
                        "; name the one to trust with SSL_CERT_FILE=PATH.pem)";
      }
    }
    if (code != CURLE_OK && !transient_code(code)) {
      return io_error(what + ": " + last_problem);
    }
  }
  const std::string tries =
      std::to_string(response.attempts) + (response.attempts == 1 ? " attempt" : " attempts");
  if (deadline.passed() ||
      (deadline.at != Clock::time_point::max() && response.attempts < options_.max_attempts)) {
    return Status(ErrorCode::kDeadlineExceeded,
                  what + ": deadline passed after " + tries + "; the last: " + last_problem);
  }
  return io_error(what + ": gave up after " + tries + "; the last: " + last_problem);
}

std::string url_for_errors(const std::string& url) { return url.substr(0, url.find('?')); }

std::shared_ptr<HttpClient> default_http_client() {
  static const auto client = std::make_shared<HttpClient>();
  return client;
}

}  // namespace zerowait::internal
