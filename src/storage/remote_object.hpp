// One door to every remote scheme the readers accept, so datasets, shards and (later) the cache
// ask "is this remote, open it, fetch it" without knowing which client serves which scheme:
//
//   http://, https://   the process's HttpClient (default_http_client), ranged GETs
//   s3://BUCKET/KEY     the process's S3Client (default_s3_client): settings from the
//                       environment and AWS files as the SDKs read them (aws_config.hpp)
//
// Thread-safety: every function may be called from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "storage/s3/s3_client.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

// True for http://, https:// and s3:// (case-insensitive scheme).
bool is_remote_url(std::string_view path);
// True for s3:// (case-insensitive scheme).
bool is_s3_url(std::string_view path);

// The S3 client s3:// URLs use, made on first use from resolve_s3_config() and then shared by
// the process. A failed resolution (no credentials, a bad endpoint) is returned, not kept: the
// next call resolves again.
Result<std::shared_ptr<S3Client>> default_s3_client();

// What a dataset's manifest already says about a remote shard: its size, and a version that
// changes with its content (its index checksum). Given these, the shard opens without a HEAD, one
// round trip less per shard; a manifest that does not describe the object shows as a failed or
// corrupt read of the shard's footer, which Dataset reports against the manifest.
struct KnownObject {
  uint64_t size = 0;
  std::string version;
};

// A ByteSource over the object at `url`: its size and version from one HEAD, or from `known`
// without any request. Each read request is one ranged GET with the read's deadline; errors name
// the URL and range.
Result<std::unique_ptr<ByteSource>> open_remote_source(const std::string& url, Deadline deadline,
                                                       const KnownObject* known = nullptr);

// The source a shard at `path` is read through: a local file read with `backend`, or the object
// at a URL read with ranged GETs (opened within kRemoteOpenTimeout, with `known` as above); then
// through `wrap` when set.
Result<std::shared_ptr<ByteSource>> open_shard_source(const std::string& path, IoBackend backend,
                                                      const SourceWrapper& wrap,
                                                      const KnownObject* known = nullptr);

// The same for one object through `client` (a checkpoint target's own).
Result<std::unique_ptr<ByteSource>> open_s3_source(std::shared_ptr<S3Client> client,
                                                   S3Location location, Deadline deadline);

// The same for an http(s) URL through `client`. A server that ignores Range, or answers a range
// with other bytes than asked, is kUnsupported / kCorrupt naming the URL and range.
Result<std::unique_ptr<ByteSource>> open_http_source(std::shared_ptr<HttpClient> client,
                                                     const std::string& url, Deadline deadline);

// The whole object at `url` (a manifest), with one GET. kNotFound when there is none.
Result<std::string> read_remote_object(const std::string& url, Deadline deadline);

}  // namespace zerowait::internal
