// An S3 client on the HTTP client and SigV4: the object operations zerowait needs — HEAD,
// ranged GET, GET, PUT, CopyObject, DELETE, ListObjectsV2 with pagination, multipart upload with
// parts in parallel (aborted on failure) — against AWS S3 and S3-compatible stores (Ceph RGW,
// MinIO, SeaweedFS), path-style or virtual-host addressing (aws_config.hpp).
//
// Every call takes a deadline; transient failures are retried by the HTTP client. Errors name
// the operation, bucket, key, range, HTTP status and S3 error code ("NoSuchKey",
// "SignatureDoesNotMatch", ...), never a credential: kNotFound for NoSuchKey / NoSuchBucket /
// 404, kAlreadyExists for BucketAlreadyOwnedByYou, kIo otherwise.
//
// Thread-safety: all methods may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "storage/s3/aws_config.hpp"
#include "storage/http/http_client.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

// "s3://bucket/key/with/slashes" -> {"bucket", "key/with/slashes"} (the scheme in any case);
// kInvalidArgument otherwise.
struct S3Location {
  std::string bucket;
  std::string key;
};
Result<S3Location> parse_s3_url(std::string_view url);

struct S3Object {
  std::string key;
  uint64_t size = 0;
  std::string etag;  // as the server gives it, quotes included
};

class S3Client {
 public:
  S3Client(S3Config config, std::shared_ptr<HttpClient> http);

  Result<S3Object> head(const std::string& bucket, const std::string& key, Deadline deadline);
  // Fills `into` with the object's bytes [offset, offset + into.size()).
  Status get_range(const std::string& bucket, const std::string& key, uint64_t offset,
                   std::span<std::byte> into, Deadline deadline);
  Result<std::string> get(const std::string& bucket, const std::string& key, Deadline deadline);
  Status put(const std::string& bucket, const std::string& key, std::string_view body,
             Deadline deadline);
  // Copies an object within the bucket on the server (CopyObject: up to 5 GiB, S3's limit for
  // one copy); the client moves no data.
  Status copy(const std::string& bucket, const std::string& from_key, const std::string& to_key,
              Deadline deadline);
  Status remove(const std::string& bucket, const std::string& key, Deadline deadline);
  // Every object under `prefix`, in key order, following continuation tokens; `page_size` keys
  // per request (at most 1000).
  Result<std::vector<S3Object>> list(const std::string& bucket, const std::string& prefix,
                                     Deadline deadline, uint32_t page_size = 1000);
  // Uploads `body` in parts of `part_bytes` (at least 5 MiB but the last, as S3 requires),
  // `threads` parts at a time; the object appears only when every part is in. On any failure
  // the upload is aborted, so no parts are left behind, and the first error is returned.
  Status put_multipart(const std::string& bucket, const std::string& key, std::string_view body,
                       uint64_t part_bytes, unsigned threads, Deadline deadline);
  Status create_bucket(const std::string& bucket, Deadline deadline);
  // The keys under `prefix` with a multipart upload begun and neither completed nor aborted
  // (ListMultipartUploads, the first 1000): parts the bucket keeps, and bills, but never shows.
  Result<std::vector<std::string>> list_multipart_uploads(const std::string& bucket,
                                                          const std::string& prefix,
                                                          Deadline deadline);

  const S3Config& config() const { return config_; }

 private:
  struct Call;
  Result<HttpResponse> send(const Call& call, Deadline deadline);

  S3Config config_;
  std::shared_ptr<HttpClient> http_;
};

}  // namespace zerowait::internal
