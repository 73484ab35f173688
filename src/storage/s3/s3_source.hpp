// The S3 driver's reading side: an object read in place with ranged GETs, and a small object
// read whole, through the process's client. The registry (storage/open.cpp) routes s3:// here.
#pragma once

#include <memory>
#include <string>

#include "storage/ranged_get_source.hpp"
#include "storage/s3/s3_client.hpp"
#include "zerowait/common/status.hpp"

namespace zerowait::internal {

// The S3 client s3:// URLs use, made on first use from resolve_s3_config() and then shared by
// the process. A failed resolution (no credentials, a bad endpoint) is returned, not kept: the
// next call resolves again. Thread-safe.
Result<std::shared_ptr<S3Client>> default_s3_client();

// A ByteSource over one object through `client` (a store's own): its size and ETag from one
// HEAD; each read request is one ranged GET with the read's deadline.
Result<std::unique_ptr<ByteSource>> open_s3_source(std::shared_ptr<S3Client> client,
                                                   S3Location location, Deadline deadline);

// The same for the object at `url` through default_s3_client(), without any request when
// `known` is given.
Result<std::unique_ptr<ByteSource>> open_s3_url(const std::string& url, Deadline deadline,
                                                const KnownObject* known);

// The whole object at `url` with one GET through default_s3_client(). kNotFound when there is
// none.
Result<std::string> read_s3_object(const std::string& url, Deadline deadline);

}  // namespace zerowait::internal
