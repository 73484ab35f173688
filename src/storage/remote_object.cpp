#include "storage/remote_object.hpp"

#include <functional>
#include <mutex>

#include "common/text.hpp"
#include "storage/local/file_sources.hpp"
#include "zerowait/storage/url.hpp"

namespace zerowait::internal {
namespace {

// Fills `dst` with the object's bytes from `offset`, within `deadline`.
using FetchRange =
    std::function<Status(uint64_t offset, std::span<std::byte> dst, Deadline deadline)>;

// One remote object read with one ranged GET per request, in order. Whichever client serves the
// scheme does the GET; the range and deadline checks are the io layer's, as for files.
class RangedGetSource final : public ByteSource {
 public:
  RangedGetSource(std::string url, uint64_t size, std::string etag, FetchRange fetch)
      : url_(std::move(url)), size_(size), etag_(std::move(etag)), fetch_(std::move(fetch)) {}
  const std::string& name() const override { return url_; }
  uint64_t size() const override { return size_; }
  std::string version() const override { return etag_; }

  Status read(std::span<const ReadRequest> requests, Deadline deadline) override {
    for (size_t i = 0; i < requests.size(); ++i) {
      const ReadRequest& r = requests[i];
      if (r.dst.empty()) continue;
      ZW_RETURN_IF_ERROR(check_range(url_, size_, r));
      if (deadline.passed()) return deadline_status(url_, r.offset, requests.size() - i);
      ZW_RETURN_IF_ERROR(fetch_(r.offset, r.dst, deadline));
    }
    return Status::ok();
  }

 private:
  std::string url_;
  uint64_t size_;
  std::string etag_;  // from the HEAD; empty when the server sent none
  FetchRange fetch_;
};

// A ranged GET of a plain http(s) object; S3's own client checks its answers itself.
Status http_get_range(HttpClient& client, const std::string& url, uint64_t size, uint64_t offset,
                      std::span<std::byte> dst, Deadline deadline) {
  HttpRequest get;
  const std::string range =
      "bytes=" + std::to_string(offset) + "-" + std::to_string(offset + dst.size() - 1);
  get.url = url;
  get.headers = {{"Range", range}};
  get.into = dst;
  ZW_ASSIGN_OR_RETURN(HttpResponse response, client.send(get, deadline));
  const bool whole = response.status == 200 && offset == 0 && dst.size() == size;
  if (response.status != 206 && !whole) {
    if (response.status == 200) {
      return unsupported("'" + url_for_errors(url) + "' ignores Range requests (answered " + range +
                         " with the whole object): it cannot be read in place");
    }
    return io_error("GET '" + url_for_errors(url) + "' (" + range + ") answered " +
                    std::to_string(response.status));
  }
  if (response.body_bytes != dst.size()) {
    return corrupt("GET '" + url_for_errors(url) + "' (" + range + ") returned " +
                   std::to_string(response.body_bytes) + " bytes instead of " +
                   std::to_string(dst.size()));
  }
  return Status::ok();
}

// An answer other than 200 to a whole-object request: 404 is kNotFound, anything else kIo.
Status status_error(const char* method, const std::string& url, int status) {
  const std::string what =
      std::string(method) + " '" + url_for_errors(url) + "' answered " + std::to_string(status);
  if (status == 404) return not_found(what + ": it does not exist");
  return io_error(what);
}

FetchRange http_fetch(std::shared_ptr<HttpClient> client, std::string url, uint64_t size) {
  return [client = std::move(client), url = std::move(url), size](
             uint64_t offset, std::span<std::byte> dst, Deadline d) {
    return http_get_range(*client, url, size, offset, dst, d);
  };
}

FetchRange s3_fetch(std::shared_ptr<S3Client> client, S3Location location) {
  return [client = std::move(client), location = std::move(location)](
             uint64_t offset, std::span<std::byte> dst, Deadline d) {
    return client->get_range(location.bucket, location.key, offset, dst, d);
  };
}

}  // namespace

bool is_s3_url(std::string_view path) { return ascii_lower(url_scheme(path)) == "s3"; }

bool is_remote_url(std::string_view path) { return is_http_url(path) || is_s3_url(path); }

Result<std::shared_ptr<S3Client>> default_s3_client() {
  static std::mutex mutex;
  static std::shared_ptr<S3Client> client;
  std::lock_guard<std::mutex> lock(mutex);
  if (!client) {
    ZW_ASSIGN_OR_RETURN(S3Config config, resolve_s3_config());
    client = std::make_shared<S3Client>(std::move(config), default_http_client());
  }
  return client;
}

Result<std::unique_ptr<ByteSource>> open_http_source(std::shared_ptr<HttpClient> client,
                                                     const std::string& url, Deadline deadline) {
  HttpRequest head;
  head.method = "HEAD";
  head.url = url;
  ZW_ASSIGN_OR_RETURN(HttpResponse response, client->send(head, deadline));
  if (response.status != 200) return status_error("HEAD", url, response.status);
  const std::string length = response.header("content-length");
  if (length.empty() || length.find_first_not_of("0123456789") != std::string::npos) {
    return unsupported("HEAD '" + url_for_errors(url) + "' gave no Content-Length");
  }
  const uint64_t size = std::stoull(length);
  return std::unique_ptr<ByteSource>(std::make_unique<RangedGetSource>(
      url_for_errors(url), size, response.header("etag"), http_fetch(client, url, size)));
}

Result<std::unique_ptr<ByteSource>> open_remote_source(const std::string& url, Deadline deadline,
                                                       const KnownObject* known) {
  if (!is_s3_url(url)) {
    if (known == nullptr) return open_http_source(default_http_client(), url, deadline);
    return std::unique_ptr<ByteSource>(
        std::make_unique<RangedGetSource>(url_for_errors(url), known->size, known->version,
                                          http_fetch(default_http_client(), url, known->size)));
  }
  ZW_ASSIGN_OR_RETURN(S3Location location, parse_s3_url(url));
  ZW_ASSIGN_OR_RETURN(auto client, default_s3_client());
  if (known == nullptr) return open_s3_source(std::move(client), std::move(location), deadline);
  std::string name = "s3://" + location.bucket + "/" + location.key;
  return std::unique_ptr<ByteSource>(std::make_unique<RangedGetSource>(
      std::move(name), known->size, known->version, s3_fetch(client, std::move(location))));
}

Result<std::shared_ptr<ByteSource>> open_shard_source(const std::string& path, IoBackend backend,
                                                      const SourceWrapper& wrap,
                                                      const KnownObject* known) {
  ZW_ASSIGN_OR_RETURN(std::unique_ptr<ByteSource> opened,
                      is_remote_url(path)
                          ? open_remote_source(path, Deadline::after(kRemoteOpenTimeout), known)
                          : open_file_source(path, backend));
  std::shared_ptr<ByteSource> source = std::move(opened);
  return wrap ? wrap(std::move(source)) : source;
}

Result<std::unique_ptr<ByteSource>> open_s3_source(std::shared_ptr<S3Client> client,
                                                   S3Location location, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(S3Object object, client->head(location.bucket, location.key, deadline));
  std::string url = "s3://" + location.bucket + "/" + location.key;
  return std::unique_ptr<ByteSource>(std::make_unique<RangedGetSource>(
      std::move(url), object.size, object.etag, s3_fetch(client, std::move(location))));
}

Result<std::string> read_remote_object(const std::string& url, Deadline deadline) {
  if (is_s3_url(url)) {
    ZW_ASSIGN_OR_RETURN(S3Location location, parse_s3_url(url));
    ZW_ASSIGN_OR_RETURN(auto client, default_s3_client());
    return client->get(location.bucket, location.key, deadline);
  }
  HttpRequest get;
  get.url = url;
  ZW_ASSIGN_OR_RETURN(HttpResponse response, default_http_client()->send(get, deadline));
  if (response.status != 200) return status_error("GET", url, response.status);
  return std::move(response.body);
}

}  // namespace zerowait::internal
