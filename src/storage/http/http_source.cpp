#include "storage/http/http_source.hpp"

namespace zerowait::internal {
namespace {

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
  // A 200 is the answer only when the range was the whole object.
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

std::unique_ptr<ByteSource> ranged_source(std::shared_ptr<HttpClient> client,
                                          const std::string& url, uint64_t size,
                                          std::string version) {
  FetchRange fetch = [client = std::move(client), url, size](uint64_t offset,
                                                             std::span<std::byte> dst, Deadline d) {
    return http_get_range(*client, url, size, offset, dst, d);
  };
  return std::make_unique<RangedGetSource>(url_for_errors(url), size, std::move(version),
                                           std::move(fetch));
}

}  // namespace

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
  return ranged_source(std::move(client), url, std::stoull(length), response.header("etag"));
}

Result<std::unique_ptr<ByteSource>> open_http_url(const std::string& url, Deadline deadline,
                                                  const KnownObject* known) {
  if (known == nullptr) return open_http_source(default_http_client(), url, deadline);
  return ranged_source(default_http_client(), url, known->size, known->version);
}

Result<std::string> read_http_object(const std::string& url, Deadline deadline) {
  HttpRequest get;
  get.url = url;
  ZW_ASSIGN_OR_RETURN(HttpResponse response, default_http_client()->send(get, deadline));
  if (response.status != 200) return status_error("GET", url, response.status);
  return std::move(response.body);
}

}  // namespace zerowait::internal
