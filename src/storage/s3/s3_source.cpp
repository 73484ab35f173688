#include "storage/s3/s3_source.hpp"

#include <mutex>

#include "storage/http/http_client.hpp"

namespace zerowait::internal {
namespace {

std::unique_ptr<ByteSource> ranged_source(std::shared_ptr<S3Client> client, S3Location location,
                                          uint64_t size, std::string version) {
  std::string name = "s3://" + location.bucket + "/" + location.key;
  FetchRange fetch = [client = std::move(client), location = std::move(location)](
                         uint64_t offset, std::span<std::byte> dst, Deadline d) {
    return client->get_range(location.bucket, location.key, offset, dst, d);
  };
  return std::make_unique<RangedGetSource>(std::move(name), size, std::move(version),
                                           std::move(fetch));
}

}  // namespace

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

Result<std::unique_ptr<ByteSource>> open_s3_source(std::shared_ptr<S3Client> client,
                                                   S3Location location, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(S3Object object, client->head(location.bucket, location.key, deadline));
  return ranged_source(std::move(client), std::move(location), object.size, object.etag);
}

Result<std::unique_ptr<ByteSource>> open_s3_url(const std::string& url, Deadline deadline,
                                                const KnownObject* known) {
  ZW_ASSIGN_OR_RETURN(S3Location location, parse_s3_url(url));
  ZW_ASSIGN_OR_RETURN(auto client, default_s3_client());
  if (known == nullptr) return open_s3_source(std::move(client), std::move(location), deadline);
  return ranged_source(std::move(client), std::move(location), known->size, known->version);
}

Result<std::string> read_s3_object(const std::string& url, Deadline deadline) {
  ZW_ASSIGN_OR_RETURN(S3Location location, parse_s3_url(url));
  ZW_ASSIGN_OR_RETURN(auto client, default_s3_client());
  return client->get(location.bucket, location.key, deadline);
}

}  // namespace zerowait::internal
