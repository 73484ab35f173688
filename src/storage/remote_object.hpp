// The remote-object questions older callers (shard/, the ckpt CLI) still ask by URL while they
// move onto Store. Every function here is answered by the URL-scheme registry (storage/open.cpp)
// from its table; the ranged-GET sources themselves are the drivers' (http/http_source,
// s3/s3_source), included here so those callers keep compiling. Delete this header when nothing
// includes it.
//
// Thread-safety: every function may be called from many threads at once.
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "storage/http/http_source.hpp"
#include "storage/ranged_get_source.hpp"
#include "storage/s3/s3_source.hpp"
#include "zerowait/common/status.hpp"
#include "zerowait/storage/byte_source.hpp"

namespace zerowait::internal {

// True when a registered driver fetches `path`'s objects over the network (ranged GETs; what
// the node-local cache is for). False for local paths, memory:// and unknown schemes.
bool is_remote_url(std::string_view path);
// True when the S3 driver serves `path`.
bool is_s3_url(std::string_view path);

// A ByteSource over the remote object at `url` through its driver: its size and version from one
// HEAD, or from `known` without any request. Each read request is one ranged GET with the read's
// deadline; errors name the URL and range. kInvalidArgument for a URL no remote driver serves.
Result<std::unique_ptr<ByteSource>> open_remote_source(const std::string& url, Deadline deadline,
                                                       const KnownObject* known = nullptr);

// The source a shard at `path` is read through: a local file read with `backend`, or the object
// at a URL read with ranged GETs (opened within kRemoteOpenTimeout, with `known` as above); then
// through `wrap` when set.
Result<std::shared_ptr<ByteSource>> open_shard_source(const std::string& path, IoBackend backend,
                                                      const SourceWrapper& wrap,
                                                      const KnownObject* known = nullptr);

// The whole remote object at `url` (a manifest), with one GET. kNotFound when there is none.
Result<std::string> read_remote_object(const std::string& url, Deadline deadline);

}  // namespace zerowait::internal
